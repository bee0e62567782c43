"""Acknowledged means stored: a real kernel (local backend) recording into a real
SQLite store. A cell's row exists as ``running`` while it runs and is final
before its ``done`` reaches a subscriber (in the database file, or in the answer
journal beside it, whose rows the next start writes in); a store that cannot
commit still ends the cell, and its ``done`` says the record was not stored."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

from kernelgw.runtime.cell_end import NOT_STORED
from kernelgw.storage.journal import DIRECTORY, read_segments
from kernelgw.storage.store import CUT_OFF_REASON, Store
from tests.unit.runtime.conftest import SessionFactory, recording
from tests.unit.runtime.test_session import WAIT_S, done_of, until


def rows(db: Path, session_id: str) -> list[tuple[Any, ...]]:
    """The session's execution rows as another process would read them (no flush)."""
    with sqlite3.connect(db) as conn:
        return conn.execute(
            "SELECT execution_id, status, reason, events FROM kgw_executions WHERE session_id = ? ORDER BY position",
            (session_id,),
        ).fetchall()


def stored_row(tmp_path: Path, session_id: str, execution_id: str) -> tuple[Any, ...]:
    """The cell's final row as a crash right now would leave it: the database
    file's, or else the journal's (written into the database at the next start)."""
    final = [r for r in rows(tmp_path / "history.db", session_id) if r[0] == execution_id and r[1] != "running"]
    if final:
        return final[0]
    records, _ = read_segments(tmp_path / DIRECTORY, "unit")
    [record] = [r for r in records if r.row["session_id"] == session_id and r.row["execution_id"] == execution_id]
    return (execution_id, record.row["status"], record.row["reason"], record.events)


async def wait_for_row(db: Path, session_id: str, execution_id: str, status: str) -> tuple[Any, ...]:
    async with asyncio.timeout(WAIT_S):
        while True:
            found = [r for r in rows(db, session_id) if r[0] == execution_id and r[1] == status]
            if found:
                return found[0]
            await asyncio.sleep(0.02)


async def test_a_cell_is_running_in_history_while_it_runs_and_final_before_its_done(
    new_session: SessionFactory, store: Store, tmp_path: Path
) -> None:
    db = tmp_path / "history.db"
    session = await recording(new_session, store)
    go = tmp_path / "go"
    sub = session.subscribe(session.last_seq)
    code = f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)\nprint('through')"
    rec = session.submit(code)
    _, _, reason, _ = await wait_for_row(db, session.id, rec.execution_id, "running")
    assert reason is None and not rec.done.done()
    behind = session.submit("1+1")  # queued while the first one runs and while its end is committed
    go.touch()
    await until(sub, done_of(rec.execution_id))
    # the moment the done is seen, the final row is already stored
    first = stored_row(tmp_path, session.id, rec.execution_id)
    assert first[1] == "ok" and first[2] is None
    events = json.loads(first[3])
    assert events[0]["type"] == "queued" and events[-1]["type"] == "done"
    assert "through" in "".join(e.get("text", "") for e in events)
    # the done stored is the done sent, seq and all
    assert events[-1] == json.loads(rec.published[-1].json)
    later = await until(sub, done_of(behind.execution_id))
    assert [e["seq"] for e in later] == sorted(e["seq"] for e in later)
    await store.flush()  # what a reader of the history waits for
    assert [r[1] for r in rows(db, session.id)] == ["ok", "ok"]
    assert read_segments(tmp_path / DIRECTORY, "unit")[0] == []  # committed: the journal is emptied


async def test_a_store_that_cannot_commit_still_ends_the_cell_and_says_so(
    new_session: SessionFactory, store: Store, tmp_path: Path
) -> None:
    session = await recording(new_session, store)
    with sqlite3.connect(tmp_path / "history.db") as conn:  # a real write failure: the table is gone
        conn.execute("DROP TABLE kgw_executions")
    sub = session.subscribe(session.last_seq)
    # the cells that end before the writer has met the fault are answered from the
    # journal (stored there); once it has, a cell's done says it was not stored
    journalled = []
    for i in range(50):
        rec = session.submit(f"{i} + 1")
        done = (await until(sub, done_of(rec.execution_id)))[-1]
        assert done["status"] == "ok"
        if done["reason"] is not None and NOT_STORED in done["reason"]:
            break
        journalled.append(rec.execution_id)
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("every cell was answered as stored while the database could not write")
    records, _ = read_segments(tmp_path / DIRECTORY, "unit")
    assert [r.row["execution_id"] for r in records] == journalled  # nothing answered as stored that is not
    rec2 = session.submit("2+2")  # the session carries on
    assert (await until(sub, done_of(rec2.execution_id)))[-1]["status"] == "ok"


async def test_a_cell_cut_off_by_a_gateway_death_is_marked_dead_at_the_next_start(
    new_session: SessionFactory, store: Store, tmp_path: Path
) -> None:
    db = tmp_path / "history.db"
    session = await recording(new_session, store)
    go = tmp_path / "go"
    rec = session.submit(f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)")
    await wait_for_row(db, session.id, rec.execution_id, "running")
    # the same gateway name as the conftest store: its successor after a crash
    successor = Store(f"sqlite:///{db}", gateway_name="unit", purge_interval_s=0)
    await successor.start()  # as a restarted gateway of the same name would
    try:
        [stored] = await successor.list_executions(session.id)
        assert (stored.status, stored.reason) == ("dead", CUT_OFF_REASON)
    finally:
        await successor.close()
        go.touch()
        async with asyncio.timeout(WAIT_S):
            await rec.done


async def test_a_running_cells_output_so_far_is_in_its_row(
    new_session: SessionFactory, store: Store, tmp_path: Path
) -> None:
    """What a gateway crash keeps of a long cell: its running row is updated with
    the output so far (within a state poll), not only its ``queued`` event."""
    db = tmp_path / "history.db"
    session = await recording(new_session, store)
    go = tmp_path / "go"
    code = (
        "import pathlib, time\n"
        "print('partial result', flush=True)\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)"
    )
    rec = session.submit(code)
    try:
        async with asyncio.timeout(WAIT_S):
            while True:
                found = [r for r in rows(db, session.id) if r[0] == rec.execution_id and r[1] == "running"]
                if found and "partial result" in found[0][3]:
                    break
                await asyncio.sleep(0.05)
        assert not rec.done.done()
    finally:
        go.touch()
        async with asyncio.timeout(WAIT_S):
            await rec.done
    await store.flush()
    [final] = [r for r in rows(db, session.id) if r[0] == rec.execution_id]
    assert final[1] == "ok" and json.loads(final[3])[-1]["type"] == "done"
