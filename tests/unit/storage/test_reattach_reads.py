"""`queries.reattach_reads`: what a restarted gateway reads for its sessions'
replays, for all of them at once (one connection, one lineage query, one
chunk-size query), on a real SQLite file and a real PostgreSQL. Each session
gets its own cells only, the same as the per-session `latest_events` and
`lineage` give."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import insert

from kernelgw.storage import queries, schema
from kernelgw.storage.store import Store
from tests.unit.storage.test_output_chunks import Cell, stand_in_session


@pytest.fixture
def store(dialect_store: Store) -> Store:
    """Each test runs on SQLite and on PostgreSQL (tests/unit/conftest.py)."""
    return dialect_store


def _row(session_id: str, position: int, code: str, kernel_id: str, **values: Any) -> dict[str, Any]:
    events = [{"type": "stream", "name": "stdout", "text": f"{code}\n", "execution_id": f"e{position}"}]
    return {
        "session_id": session_id,
        "position": position,
        "execution_id": f"{session_id[:6]}-{position}",
        "seq": position,
        "code": code,
        "status": "ok",
        "started_at": datetime.now(UTC),
        "duration_ms": 1.0,
        "events": json.dumps(events),
        "kernel_id": kernel_id,
        "no_replay": None,  # every row the same keys: an executemany takes the first row's
        **values,
    }


async def test_each_session_gets_its_own_lineage_and_latest_cells(store: Store) -> None:
    # a's first cell has chunked output (as a flood stores it); its other cells follow
    session = stand_in_session()
    await store.session_started(session)
    flood = Cell(store, session, seq=0)
    for i in range(300):
        flood.print(f"{i}: " + "z" * 1000 + "\n")
    await flood.finish()
    a = session.id
    [stored] = await store.list_executions(a)
    p = stored.position
    b, c, d = (uuid.uuid4().hex for _ in range(3))
    rows = [
        _row(a, p + 1, "a1", "ka-old"),
        _row(a, p + 2, "a2", "ka"),
        _row(a, p + 3, "a3 failed", "ka", status="error"),
        _row(a, p + 4, "a4 side effect", "ka", no_replay=True),
        _row(a, p + 5, "a5", "ka"),
        _row(b, 1, "b1", "kb"),
        _row(b, 2, "b2 ran in a's old kernel id", "ka-old"),  # not in b's lineage kernels
        _row(c, 1, "c1 forked from a", "ka"),  # c's own row in a kernel it resumed from
        _row(c, 2, "c2", "kc"),
    ]
    engine = await store.read_engine()
    async with engine.begin() as conn:
        await conn.execute(insert(schema.executions), rows)

    kernels = {a: ("ka", "ka-old"), b: ("kb",), c: ("kc", "ka"), d: ("kd",)}
    reads = await queries.reattach_reads(await store.read_engine(), kernels, 64 << 20)

    assert set(reads) == set(kernels)
    assert [cell.code for cell in reads[a].lineage] == ["a1", "a2", "a5"]
    assert [cell.code for cell in reads[b].lineage] == ["b1"]
    assert [cell.code for cell in reads[c].lineage] == ["c1 forked from a", "c2"]
    assert reads[d].lineage == [] and reads[d].latest == []
    for sid, ks in kernels.items():
        assert reads[sid].lineage == await queries.lineage(engine, sid, ks)
        assert reads[sid].latest == await queries.latest_events(engine, sid, 64 << 20)
    assert [i for i, _ in reads[a].latest] == [flood.rec.execution_id] + [f"{a[:6]}-{p + i}" for i in range(1, 6)]
    assert json.loads(reads[a].latest[0][1]) == json.loads(flood.events_json)
    assert [i for i, _ in reads[b].latest] == [f"{b[:6]}-1", f"{b[:6]}-2"]

    # a replay buffer's worth: a's flood does not fit beside its newer cells
    small = await queries.reattach_reads(engine, kernels, 1024)
    assert [i for i, _ in small[a].latest] == [f"{a[:6]}-{p + i}" for i in range(1, 6)]
    assert small[b].latest == reads[b].latest
    # no replay buffer: lineages only
    none = await queries.reattach_reads(engine, kernels, 0)
    assert all(r.latest == [] for r in none.values())
    assert none[a].lineage == reads[a].lineage
    assert await queries.reattach_reads(engine, {}, 1024) == {}


@pytest.mark.parametrize(
    "text",
    ['"\\ud800"', '"a\\udc00b"', '"\ud800"'],
    ids=["escaped high", "escaped low", "raw"],
)
def test_stored_events_with_a_lone_surrogate_do_not_parse(text: str) -> None:
    """`Store.open_sessions` parses stored events with ``TEXT_CHECKED`` (their models
    skip the walk of every string for lone surrogates) because pydantic's JSON
    parser refuses them: such a cell is read as unreadable, never kept with
    text no UTF-8 encoder takes. A pydantic that parsed them would fail here."""
    from kernelgw import events as ev

    stored = '[{"type": "stream", "name": "stdout", "text": ' + text + "}]"
    with pytest.raises(ValueError):
        ev.EVENT_LIST_ADAPTER.validate_json(stored, context=ev.TEXT_CHECKED)
    assert ev.EVENT_LIST_ADAPTER.validate_json(stored.replace(text, '"\\ud83d\\ude00"'), context=ev.TEXT_CHECKED)
