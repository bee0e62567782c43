"""A cell's own environment variables (E2B's per-execution ``env_vars``): set in the
kernel right before the cell, put back after it, whoever sends the next cell."""

from __future__ import annotations

import asyncio
import json

from kernelgw.runtime.execution import QueuedExecution
from kernelgw.runtime.session import KernelSession
from tests.support.waiting import until
from tests.unit.runtime.conftest import SessionFactory

WAIT_S = 30
READ = "import os; print(repr((os.environ.get('CELL_A'), os.environ.get('CELL_B'))))"


async def output(session: KernelSession, code: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    """The cell's stdout and status (``env`` given as the E2B face gives it: right after submit)."""
    rec = session.submit(code)
    rec.env = dict(env or {})
    rec.retain_output = True
    async with asyncio.timeout(WAIT_S):
        done = await rec.done
    return stdout(rec), done.status


def stdout(rec: QueuedExecution) -> str:
    events = [json.loads(p.json) for p in rec.published]
    return "".join(e["text"] for e in events if e["type"] == "stream")


async def test_the_variables_hold_for_their_cell_only(new_session: SessionFactory) -> None:
    session = await new_session()
    await output(session, "import os; os.environ['CELL_B'] = 'before'")
    text, status = await output(session, READ, {"CELL_A": "a", "CELL_B": "b"})
    assert status == "ok"
    assert "('a', 'b')" in text
    # the next cell (no env of its own): CELL_A gone, CELL_B back to what it was
    text, _ = await output(session, READ)
    assert "(None, 'before')" in text


async def test_they_are_put_back_after_a_cell_that_fails(new_session: SessionFactory) -> None:
    session = await new_session()
    text, status = await output(session, "import os; print(os.environ['CELL_A']); 1/0", {"CELL_A": "x"})
    assert (text, status) == ("x\n", "error")
    text, _ = await output(session, READ)
    assert "(None, None)" in text


async def test_they_are_put_back_after_an_interrupted_cell(new_session: SessionFactory) -> None:
    session = await new_session()
    rec = session.submit("import os, time\nprint(os.environ['CELL_A'], flush=True)\ntime.sleep(60)")
    rec.env = {"CELL_A": "slow"}
    rec.retain_output = True

    async def printed() -> bool:  # it runs, with its variable
        return "slow" in stdout(rec)

    await until(printed, "the cell's first line")
    assert await session.interrupt()
    async with asyncio.timeout(WAIT_S):
        done = await rec.done
    assert done.status == "interrupted"
    text, _ = await output(session, READ)
    assert "(None, None)" in text


async def test_a_cell_queued_behind_one_with_variables_does_not_see_them(new_session: SessionFactory) -> None:
    session = await new_session()
    first = session.submit("import time; time.sleep(0.5)")
    first.env = {"CELL_A": "first"}
    second = session.submit(READ)
    second.retain_output = True
    async with asyncio.timeout(WAIT_S):
        await first.done
        await second.done
    assert "(None, None)" in stdout(second)


async def test_the_user_namespace_gets_no_names(new_session: SessionFactory) -> None:
    session = await new_session()
    before, _ = await output(session, "print(sorted(k for k in dir() if not k.startswith('_')))")
    await output(session, "pass", {"CELL_A": "a"})
    after, _ = await output(session, "print(sorted(k for k in dir() if not k.startswith('_')))")
    assert before == after
