"""A fault of the gateway's own while a cell's end is announced (after its record
is stored, when its ``done`` is numbered and sent) ends that cell with a ``done``
that names the fault, and the session's worker goes on: later cells run. Before,
the worker task died with the exception and every later cell waited forever.
Real kernels (local backend); the faults are raised where the real code calls out."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kernelgw import events as ev
from kernelgw.runtime.cell_end import ANNOUNCE_FAILED
from kernelgw.runtime.fanout import SEQ_BLOCK
from kernelgw.runtime.metrics import Metrics
from tests.unit.runtime.conftest import SessionFactory
from tests.unit.runtime.test_session import done_of, next_event, until


class ReservationFailed(RuntimeError):
    """Raised by the fan-out's reservation callback (the store's, in a gateway)."""


class CountingFailed(RuntimeError):
    pass


class FailingMetrics(Metrics):
    def execution_done(self, done: ev.Done, output_bytes: int, *, oom_killed: bool = False) -> None:
        raise CountingFailed("a label the registry refuses")


def waits_for(go: Path) -> str:
    return f"import pathlib, time\nprint('started', flush=True)\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)"


async def test_a_fault_while_the_done_is_numbered_is_answered_in_the_done_and_later_cells_run(
    new_session: SessionFactory, tmp_path: Path
) -> None:
    session = await new_session()
    fanout = session._fanout
    sub = session.subscribe(session.last_seq)
    go = tmp_path / "go"
    rec = session.submit(waits_for(go))
    await until(sub, lambda e: e["type"] == "stream")

    def refuse() -> None:
        raise ReservationFailed("the reservation could not be queued")

    behind = session.submit("2+2")  # queued behind it
    # the next number handed out (the cell's done: it prints nothing more) renews the reservation, which fails
    fanout.reserved = fanout.seq + SEQ_BLOCK // 2
    fanout.on_reserve = refuse
    go.touch()
    done = (await until(sub, done_of(rec.execution_id)))[-1]
    assert done["status"] == "ok"
    assert (
        ANNOUNCE_FAILED in done["reason"] and "ReservationFailed: the reservation could not be queued" in done["reason"]
    )
    assert rec.done.done() and rec.done.result().reason == done["reason"]
    async with asyncio.timeout(10):  # without the guard the worker is gone and this waits forever
        later = await until(sub, done_of(behind.execution_id))
    assert [e["type"] for e in later] == ["status", "result", "done"] and later[-1]["status"] == "ok"
    assert later[-1]["reason"] is None


async def test_a_metrics_fault_does_not_stop_the_session(new_session: SessionFactory, tmp_path: Path) -> None:
    session = await new_session()
    session._executions.metrics = FailingMetrics()
    sub = session.subscribe(session.last_seq)
    go = tmp_path / "go"
    first = session.submit(waits_for(go))
    await until(sub, lambda e: e["type"] == "stream")
    second = session.submit("2+2")
    queued = await next_event(sub)
    assert (queued["type"], queued["execution_id"]) == ("queued", second.execution_id)
    go.touch()
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        events += await until(sub, done_of(first.execution_id))
        events += await until(sub, done_of(second.execution_id))
    dones = [e for e in events if e["type"] == "done"]
    assert [(d["execution_id"], d["status"], d["reason"]) for d in dones] == [
        (first.execution_id, "ok", None),
        (second.execution_id, "ok", None),
    ]
