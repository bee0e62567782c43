"""A real kernel's flood recorded into a real SQLite store: its output goes to the
store in chunks while it runs, the gateway lets committed chunks go, and the
history reads back exactly what subscribers were sent (and the WebSocket's
``done`` comes after every chunk is stored). Store-level cases on SQLite and
PostgreSQL are in tests/unit/storage/test_output_chunks.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from kernelgw.runtime.recorder import CHUNK_BYTES
from kernelgw.storage.store import Store
from tests.unit.runtime.conftest import SessionFactory
from tests.unit.runtime.test_session import done_of, until

FLOOD = "for i in range(4000):\n    print(i, 'ünïcode ✓', 'x' * 1000)"


async def test_a_flood_is_stored_in_chunks_as_it_runs_and_reads_back_identical(
    new_session: SessionFactory, store: Store, tmp_path: Path
) -> None:
    session = await new_session(max_output_bytes=16 << 20)
    session.recorder = store
    await store.session_started(session)
    sub = session.subscribe(session.last_seq)
    rec = session.submit(FLOOD)
    events = [e for e in await until(sub, done_of(rec.execution_id)) if e["execution_id"] == rec.execution_id]
    # the done reached the subscriber only once the row and every chunk were committed:
    # read the file as another process would, without waiting for the writer
    with sqlite3.connect(tmp_path / "history.db") as conn:
        parts = conn.execute(
            "SELECT part, bytes FROM kgw_execution_chunks WHERE session_id = ? AND execution_id = ? ORDER BY part",
            (session.id, rec.execution_id),
        ).fetchall()
        [(status, tail)] = conn.execute(
            "SELECT status, events FROM kgw_executions WHERE session_id = ? AND execution_id = ?",
            (session.id, rec.execution_id),
        ).fetchall()
    stored = sum(size for _, size in parts)
    print(f"{len(parts)} chunks, {stored} bytes; tail {len(tail)} bytes; {len(rec.published)} events kept")
    assert [p for p, _ in parts] == list(range(len(parts))) and len(parts) >= 4
    assert max(size for _, size in parts) < 2 * CHUNK_BYTES
    assert status == "ok" and len(tail) < 2 * CHUNK_BYTES
    # what the session keeps of the cell: not its whole output
    assert rec.released > 0 and sum(len(p.json) for p in rec.published) < 2 * CHUNK_BYTES
    assert sum(1 for e in events if e["type"] == "stream") > 4
    [row] = [h for h in await store.list_executions(session.id) if h.execution_id == rec.execution_id]
    assert json.loads(row.events_json) == events
