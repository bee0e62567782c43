"""Recovery by replay on a real kernel process, without an engine: the lineage a
replay runs, a restart that replays, ``auto_replay`` after a kernel death and
after a timeout restart, cells queued meanwhile, and what the store records.

A kernel killed from outside (``kill -9``) or exiting stands in for the
out-of-memory killer, as in test_session.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kernelgw.runtime.lineage import Lineage, LineageCell, lineage_of
from kernelgw.storage import queries
from kernelgw.storage.store import Store
from tests.support.local_backend import LocalBackend
from tests.unit.runtime.conftest import SessionFactory, recording
from tests.unit.runtime.test_session import done_of, result_text, run, stdout, until

SWALLOW_INTERRUPTS = (
    "while True:\n    try:\n        while True:\n            pass\n    except KeyboardInterrupt:\n        pass\n"
)


def replay_events(events: list[dict[str, Any]], phase: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "replay" and e["phase"] == phase]


# ------------------------------------------------------------------ the lineage, pure


def test_only_ok_replayable_cells_of_the_current_kernel_join_the_lineage() -> None:
    lineage = Lineage("k1")
    a, b, c, d = (LineageCell(x, f"{x} = 1") for x in "abcd")
    assert lineage.note(a, kernel_id="k1", status="ok", replayable=True)
    assert not lineage.note(b, kernel_id="k1", status="error", replayable=True)
    assert not lineage.note(c, kernel_id="k1", status="ok", replayable=False)
    assert not lineage.note(d, kernel_id="k0", status="ok", replayable=True)  # ran in the kernel before
    assert not lineage.note(d, kernel_id=None, status="ok", replayable=True)  # never reached a kernel
    assert lineage.cells == (a,)
    assert lineage.new_kernel("k2") == (a,)
    assert (lineage.kernel_id, lineage.cells) == ("k2", ())


def test_a_stored_lineage_is_the_kernels_ok_replayable_executions_in_order() -> None:
    def row(position: int, kernel: str | None, status: str = "ok", replayable: bool = True) -> Any:
        return type(
            "Row",
            (),
            {
                "position": position,
                "execution_id": f"e{position}",
                "code": f"c{position}",
                "status": status,
                "kernel_id": kernel,
                "replayable": replayable,
            },
        )()

    rows = [
        row(3, "k2"),
        row(0, "k1"),
        row(1, "k2", "error"),
        row(2, "k2", replayable=False),
        row(4, None),
        row(5, "k2"),
    ]
    assert [c.execution_id for c in lineage_of(rows, "k2")] == ["e3", "e5"]


# ------------------------------------------------------------------ restart with replay


async def test_a_restart_that_replays_restores_the_state_and_reports_each_cell(new_session: SessionFactory) -> None:
    session = await new_session()
    await run(session, "x = 20")
    await run(session, "1 / 0")  # failed: not in the lineage
    await run(session, "y = x + 1")
    sent = (await run(session, "mail = 'sent'", replayable=False))[0]["execution_id"]
    await run(session, "z = y * 2")
    sub = session.subscribe(session.last_seq)
    report = await session.restart(replay=True)
    assert report is not None and report.trigger == "requested" and report.complete
    assert [c.status for c in report.cells] == ["ok", "ok", "ok"]
    assert sent not in {c.replay_of for c in report.cells}
    assert report.replayed == 3 and report.duration_ms > 0
    assert result_text(await run(session, "(x, y, z, 'mail' in dir())")) == "(20, 21, 42, False)"
    # watchers saw it: started, each cell marked right after its queued, finished
    events = await until(sub, lambda e: e["type"] == "replay" and e["phase"] == "finished")
    [started] = replay_events(events, "started")
    assert (started["cells"], started["trigger"]) == (3, "requested")
    cells = replay_events(events, "cell")
    assert [c["replay_of"] for c in cells] == [c.replay_of for c in report.cells]
    assert [c["execution_id"] for c in cells] == [c.execution_id for c in report.cells]
    for cell in cells:
        own = [e["type"] for e in events if e.get("execution_id") == cell["execution_id"]]
        assert own[:2] == ["queued", "replay"] and own[-1] == "done"
    [finished] = replay_events(events, "finished")
    assert finished["replayed"] == 3 and finished["duration_ms"] == report.duration_ms
    session.unsubscribe(sub)


async def test_a_replay_stops_at_the_first_cell_that_fails_and_reports_the_rest_skipped(
    new_session: SessionFactory,
) -> None:
    session = await new_session()
    await run(session, "a = 1")
    await run(session, "secret = 42", replayable=False)
    await run(session, "b = secret + a")  # ok now; a NameError once secret is not replayed
    await run(session, "c = 3")
    report = await session.restart(replay=True)
    assert report is not None and not report.complete
    assert [(c.index, c.status) for c in report.cells] == [(0, "ok"), (1, "error"), (2, "skipped")]
    failed = report.cells[1]
    assert (failed.ename, failed.evalue) == ("NameError", "name 'secret' is not defined")
    assert report.cells[2].execution_id is None and "did not end ok" in (report.cells[2].reason or "")
    assert report.stopped_at == 1 and report.replayed == 1
    assert result_text(await run(session, "('a' in dir(), 'b' in dir(), 'c' in dir())")) == "(True, False, False)"


async def test_replayed_cells_join_the_new_kernels_lineage_and_a_plain_restart_empties_it(
    new_session: SessionFactory,
) -> None:
    session = await new_session()
    await run(session, "n = [1]")
    first = await session.restart(replay=True)
    assert first is not None and first.complete
    await run(session, "n.append(2)")
    second = await session.restart(replay=True)
    assert second is not None and [c.status for c in second.cells] == ["ok", "ok"]
    assert second.cells[0].replay_of == first.cells[0].execution_id  # the replay of a replay
    assert result_text(await run(session, "n")) == "[1, 2]"
    assert await session.restart() is None
    empty = await session.restart(replay=True)
    assert empty is not None and empty.cells == [] and empty.complete


async def test_cells_sent_during_a_replay_run_after_it_in_the_rebuilt_state(new_session: SessionFactory) -> None:
    session = await new_session()
    await run(session, "import time\nslow = time.sleep(0.3) or 'restored'")
    restarting = asyncio.create_task(session.restart(replay=True))
    sub = session.subscribe(session.last_seq)
    await until(sub, lambda e: e["type"] == "replay" and e["phase"] == "started")
    later = session.submit("print(slow)")
    events = await until(sub, done_of(later.execution_id))
    report = await restarting
    assert report is not None and report.complete
    assert stdout([e for e in events if e["execution_id"] == later.execution_id]) == "restored\n"
    finished = next(i for i, e in enumerate(events) if e["type"] == "replay" and e["phase"] == "finished")
    busy = next(i for i, e in enumerate(events) if e["execution_id"] == later.execution_id and e["type"] == "status")
    assert finished < busy
    session.unsubscribe(sub)


# ------------------------------------------------------------------ auto_replay


async def test_auto_replay_after_the_kernel_dies_restores_the_state(
    new_session: SessionFactory, local_backend: LocalBackend
) -> None:
    session = await new_session(auto_replay=True)
    await run(session, "df = {'x': [1, 2, 3]}")
    await run(session, "total = sum(df['x'])")
    old = session.handle
    sub = session.subscribe(session.last_seq)
    killer = session.submit("import os\nos._exit(9)")
    after = session.submit("print(total, len(df['x']))")  # queued behind the death: runs after the replay
    events = await until(sub, done_of(after.execution_id))
    done = next(e for e in events if e["type"] == "done" and e["execution_id"] == killer.execution_id)
    assert done["status"] == "dead" and done["state_lost"] is True
    assert "exited with code 9" in done["reason"] and "auto_replay runs the 2 cells" in done["reason"]
    [started] = replay_events(events, "started")
    assert (started["trigger"], started["cells"]) == ("kernel_died", 2)
    [finished] = replay_events(events, "finished")
    assert finished["replayed"] == 2
    assert stdout([e for e in events if e["execution_id"] == after.execution_id]) == "6 3\n"
    assert session.state == "idle" and session.handle is not None and old is not None
    assert session.handle.kernel_id != old.kernel_id and local_backend.started == 2
    session.unsubscribe(sub)


async def test_a_cell_that_kills_the_replayed_kernel_again_does_not_loop(
    new_session: SessionFactory, tmp_path: Path
) -> None:
    """A replayed cell that kills the kernel stops the replay and leaves the session
    dead: no second automatic recovery."""
    session = await new_session(auto_replay=True)
    marker = str(tmp_path / "ran-once")
    # ok the first time; on its replay it finds the marker and exits
    await run(session, f"import os\nif os.path.exists({marker!r}):\n    os._exit(7)\nopen({marker!r}, 'w').close()")
    sub = session.subscribe(session.last_seq)
    killer = session.submit("import os\nos._exit(9)")
    events = await until(sub, lambda e: e["type"] == "replay" and e["phase"] == "finished")
    done = next(e for e in events if e["type"] == "done" and e["execution_id"] == killer.execution_id)
    assert done["status"] == "dead"
    replayed = replay_events(events, "cell")[0]["execution_id"]
    replayed_done = next(e for e in events if e["type"] == "done" and e["execution_id"] == replayed)
    assert replayed_done["status"] == "dead" and "exited with code 7" in replayed_done["reason"]
    assert "restart the session" in replayed_done["reason"]
    assert replay_events(events, "finished")[0]["replayed"] == 0
    assert session.state == "dead"
    session.unsubscribe(sub)


async def test_auto_replay_after_a_timeout_restart(new_session: SessionFactory) -> None:
    session = await new_session(auto_replay=True, interrupt_grace_s=0.5)
    await run(session, "kept = 'back'")
    sub = session.subscribe(session.last_seq)
    hung = session.submit(SWALLOW_INTERRUPTS, timeout=0.5)
    events = await until(sub, lambda e: e["type"] == "replay" and e["phase"] == "finished")
    done = next(e for e in events if e["type"] == "done" and e["execution_id"] == hung.execution_id)
    assert done["status"] == "timeout" and done["state_lost"] is True
    assert "restarted" in done["reason"] and "auto_replay runs the 1 cell" in done["reason"]
    assert replay_events(events, "started")[0]["trigger"] == "timeout"
    assert stdout(await run(session, "print(kept)")) == "back\n"
    session.unsubscribe(sub)


async def test_without_auto_replay_a_dead_kernel_waits_and_a_restart_can_replay(
    new_session: SessionFactory, local_backend: LocalBackend
) -> None:
    session = await new_session()
    await run(session, "v = 5")
    done = (await run(session, "import os\nos._exit(9)"))[-1]
    assert done["status"] == "dead" and "restart the session" in done["reason"] and "auto_replay" not in done["reason"]
    assert session.state == "dead" and local_backend.started == 1
    report = await session.restart(replay=True)
    assert report is not None and report.complete
    assert result_text(await run(session, "v")) == "5"


# ------------------------------------------------------------------ what the store keeps


async def test_the_store_records_kernels_and_replays_and_rebuilds_the_lineage(
    new_session: SessionFactory, store: Store
) -> None:
    session = await recording(new_session, store)
    await run(session, "x = 1")
    await run(session, "side = 1", replayable=False)
    report = await session.restart(replay=True)
    assert report is not None and report.complete
    await run(session, "y = 2")
    executions = await store.list_executions(session.id)
    assert [(e.code, e.replay_of is not None, e.replayable) for e in executions] == [
        ("x = 1", False, True),
        ("side = 1", False, False),
        ("x = 1", True, True),
        ("y = 2", False, True),
    ]
    first, _, replayed, last = executions
    assert replayed.replay_of == first.execution_id
    assert session.handle is not None
    assert first.kernel_id != replayed.kernel_id == last.kernel_id == session.handle.kernel_id
    # what a restarted gateway reattaches with
    engine = await store.read_engine()
    stored = await queries.lineage(engine, session.id, [session.handle.kernel_id])
    assert [(c.execution_id, c.code) for c in stored] == [
        (replayed.execution_id, "x = 1"),
        (last.execution_id, "y = 2"),
    ]
