"""A cell's output stored in chunks as it comes, on a real SQLite file and a real
PostgreSQL: every reader gets the same events in the same order, a cell cut
off by a gateway death keeps its output so far, purging removes the chunks,
and no transaction of a 16 MiB output is much larger than two chunks.

The store is driven as the session's queue drives it (`ExecutionQueue.publish`
hands it the output every `CHUNK_BYTES`, the state poll at checkpoints); the
same path with a real kernel is in tests/unit/runtime/test_output_chunks.py.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select

from kernelgw import events as ev
from kernelgw.runtime.execution import QueuedExecution
from kernelgw.runtime.fanout import Published
from kernelgw.runtime.recorder import CHUNK_BYTES, TAIL_BYTES
from kernelgw.server.notebook import build_notebook
from kernelgw.storage import queries, schema
from kernelgw.storage.store import CUT_OFF_REASON, Store


@pytest.fixture
def store(dialect_store: Store) -> Store:
    """Each test runs on SQLite and on PostgreSQL (tests/unit/conftest.py)."""
    return dialect_store


def stand_in_session() -> Any:
    """What the store reads of a KernelSession (no kernel needed to record one)."""
    return SimpleNamespace(
        id=uuid.uuid4().hex,
        spec=SimpleNamespace(image="img:test", memory_mb=512, cpus=1.0, runtime="runc", kernel="python3"),
        owner=None,
        created_at=datetime.now(UTC),
        kernel_info={"language_info": {"name": "python", "version": "3.11"}},
        handle=None,
        paused_from=None,
        lineage_kernels=(),
        metadata={},
        lease_until=None,
        on_lease_end="end",
        access_sha256=None,
    )


class Cell:
    """A running cell as the queue feeds it: events published one by one, the
    store handed the output at `CHUNK_BYTES` and at checkpoints."""

    def __init__(self, store: Store, session: Any, seq: int) -> None:
        self.store, self.session, self.seq = store, session, seq
        self.rec = QueuedExecution(execution_id=uuid.uuid4().hex, code="flood()", timeout=60)
        self.sent: list[str] = []
        self.publish(ev.Queued(execution_id=self.rec.execution_id, code="flood()"))
        store.execution_started(session, self.rec)

    def publish(self, event: ev.Event) -> None:
        self.seq += 1
        event = event.model_copy(update={"seq": self.seq})
        pub = Published(self.seq, event, event.model_dump_json())
        self.rec.published.append(pub)
        if isinstance(event, ev.Error):
            self.rec.last_error = event
        self.sent.append(pub.json)
        self.rec.unstored_bytes += len(pub.json)
        if self.rec.unstored_bytes >= CHUNK_BYTES:
            self.checkpoint()

    def print(self, text: str) -> None:
        self.publish(ev.Stream(execution_id=self.rec.execution_id, name="stdout", text=text))

    def checkpoint(self) -> None:
        self.rec.checkpointed, self.rec.unstored_bytes = self.rec.event_count, 0
        self.store.execution_progress(self.session, self.rec)

    async def finish(self) -> None:
        done = ev.Done(
            execution_id=self.rec.execution_id, status="error", execution_count=1, duration_ms=5.0, seq=self.seq + 1
        )
        pub = Published(self.seq + 1, done, done.model_dump_json())
        self.sent.append(pub.json)
        await self.store.execution_finished(self.session, self.rec, pub)

    @property
    def events_json(self) -> str:
        return ev.json_array(self.sent)


async def chunk_rows(store: Store, session_id: str) -> int:
    c = schema.execution_chunks
    async with (await store.read_engine()).connect() as conn:
        count = await conn.scalar(select(func.count()).select_from(c).where(c.c.session_id == session_id))
    return int(count or 0)


async def test_a_cell_over_many_chunks_reads_back_identical_everywhere(store: Store) -> None:
    session = stand_in_session()
    await store.session_started(session)
    small = Cell(store, session, seq=0)
    small.print("before\n")
    await small.finish()
    cell = Cell(store, session, seq=small.seq + 1)
    for i in range(3000):  # about 3 MiB of JSON, in lines of different lengths
        cell.print(f"line {i} ünïcode ✓ " + "x" * (i % 2000) + "\n")
        if i % 700 == 0:
            cell.checkpoint()  # the state poll's moments, in between
    cell.publish(
        ev.Error(
            execution_id=cell.rec.execution_id,
            ename="ValueError",
            evalue="late",
            traceback=[],
            traceback_text=["ValueError: late"],
        )
    )
    cell.print("tail\n")
    await cell.finish()

    parts = await chunk_rows(store, session.id)
    print(f"{parts} chunks of {len(cell.events_json)} bytes; {len(cell.rec.published)} events still in memory")
    assert parts >= len(cell.events_json) // CHUNK_BYTES - 1
    # committed chunks left memory: what is kept is about one chunk's worth
    assert cell.rec.released > 0
    assert sum(len(p.json) for p in cell.rec.published) < CHUNK_BYTES + TAIL_BYTES + (64 << 10)

    history = await store.list_executions(session.id)
    assert [h.execution_id for h in history] == [small.rec.execution_id, cell.rec.execution_id]
    assert json.loads(history[0].events_json) == json.loads(small.events_json)
    assert json.loads(history[1].events_json) == json.loads(cell.events_json)
    assert history[1].events[0].type == "queued" and history[1].events[-1].type == "done"

    notebook = build_notebook(history)
    outputs = notebook.cells[1].outputs
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert text == "".join(json.loads(j).get("text", "") for j in cell.sent if json.loads(j)["type"] == "stream")
    assert [o.output_type for o in outputs][-2:] == ["error", "stream"]

    replay = await queries.latest_events(await store.read_engine(), session.id, 64 << 20)
    assert [(i, json.loads(e)) for i, e in replay] == [
        (small.rec.execution_id, json.loads(small.events_json)),
        (cell.rec.execution_id, json.loads(cell.events_json)),
    ]
    # a replay buffer's worth counts the chunks: only the small, latest cell would
    # not fit with the flood; the flood (newest) comes alone
    just_latest = await queries.latest_events(await store.read_engine(), session.id, 1024)
    assert [i for i, _ in just_latest] == [cell.rec.execution_id]
    assert json.loads(just_latest[0][1]) == json.loads(cell.events_json)


async def test_a_cell_cut_off_by_a_gateway_death_keeps_its_chunks(database_url: str) -> None:
    name = f"cut{uuid.uuid4().hex[:8]}"
    first = Store(database_url, gateway_name=name, purge_interval_s=0)
    await first.start()
    session = stand_in_session()
    await first.session_started(session)
    cell = Cell(first, session, seq=0)
    for i in range(600):
        cell.print(f"{i}: " + "y" * 1000 + "\n")
    cell.print("last words\n")
    cell.checkpoint()  # the last state poll before the death
    await first.flush()
    assert await chunk_rows(first, session.id) >= 2
    await first.close()  # as if the gateway died: the cell never ended

    second = Store(database_url, gateway_name=name, purge_interval_s=0)
    await second.start()  # marks the running cell dead, its output kept
    try:
        [row] = await second.list_executions(session.id)
        assert (row.status, row.reason) == ("dead", CUT_OFF_REASON)
        assert json.loads(row.events_json) == json.loads(cell.events_json)
    finally:
        await second.close()


async def test_purging_a_session_removes_its_chunks(store: Store) -> None:
    store.retention_days = 1
    session, other = stand_in_session(), stand_in_session()
    for s in (session, other):
        await store.session_started(s)
        cell = Cell(store, s, seq=0)
        for _ in range(400):
            cell.print("z" * 2000 + "\n")
        await cell.finish()
    await store.session_ended(session, "deleted")
    assert await chunk_rows(store, session.id) >= 2
    await store.purge(datetime.now(UTC) + timedelta(days=2))
    assert await chunk_rows(store, session.id) == 0
    assert await store.list_executions(session.id) == []
    assert await chunk_rows(store, other.id) >= 2  # still open: kept


@pytest.fixture
def transactions() -> Iterator[list[int]]:
    """Bytes of parameters each committed transaction carried, on any engine."""
    sizes: list[int] = []
    current: dict[int, int] = {}
    lock = threading.Lock()

    def size_of(params: Any) -> int:
        rows = params if isinstance(params, list | tuple) else [params]
        total = 0
        for row in rows:
            values = row.values() if isinstance(row, dict) else row if isinstance(row, list | tuple) else [row]
            total += sum(len(v) for v in values if isinstance(v, str | bytes))
        return total

    def on_begin(conn: Any) -> None:
        with lock:
            current[id(conn)] = 0

    def on_execute(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        with lock:
            current[id(conn)] = current.get(id(conn), 0) + size_of(params)

    def on_commit(conn: Any) -> None:
        with lock:
            sizes.append(current.pop(id(conn), 0))

    listeners = [("begin", on_begin), ("before_cursor_execute", on_execute), ("commit", on_commit)]
    for name, fn in listeners:
        event.listen(Engine, name, fn)
    yield sizes
    for name, fn in listeners:
        event.remove(Engine, name, fn)


async def test_no_transaction_of_a_16_mib_output_is_larger_than_about_two_chunks(
    store: Store, transactions: list[int]
) -> None:
    session = stand_in_session()
    await store.session_started(session)
    cell = Cell(store, session, seq=0)
    line = "flood " * 1000 + "\n"  # about 6 KB a message, as the kernel slices a flood
    while sum(len(j) for j in cell.sent) < 16 << 20:
        cell.print(line)
    await cell.finish()
    output = sum(len(j) for j in cell.sent)
    history = await store.list_executions(session.id)
    assert json.loads(history[0].events_json) == json.loads(cell.events_json)
    largest, written = max(transactions), sum(transactions)
    print(f"{output} bytes of output: {len(transactions)} transactions, largest {largest}, {written} in sum")
    assert largest <= 2 * CHUNK_BYTES + 2 * len(line) + (16 << 10)
    assert written < 2 * output  # each event written once (and read back once), not rewritten


async def test_a_tail_rewritten_across_a_chunk_is_neither_lost_nor_doubled(database_url: str) -> None:
    """All queued before the writer runs: a rewrite of the row's tail, then a
    chunk that takes that tail, then a newer tail the queued rewrite picks up.
    A gateway dying then keeps every event once, in order."""
    name = f"tail{uuid.uuid4().hex[:8]}"
    first = Store(database_url, gateway_name=name, purge_interval_s=0)
    await first.start()
    session = stand_in_session()
    await first.session_started(session)
    cell = Cell(first, session, seq=0)
    cell.print("early\n")
    cell.checkpoint()  # a tail rewrite is queued
    while cell.rec.stored_events == 0:
        cell.print("w" * 4000 + "\n")  # until a chunk is taken
    cell.print("after the chunk\n")
    cell.checkpoint()  # the queued rewrite now holds this tail
    await first.flush()
    await first.close()  # dies with the cell running

    second = Store(database_url, gateway_name=name, purge_interval_s=0)
    await second.start()
    try:
        [row] = await second.list_executions(session.id)
        assert row.status == "dead"
        assert json.loads(row.events_json) == json.loads(cell.events_json)
    finally:
        await second.close()
