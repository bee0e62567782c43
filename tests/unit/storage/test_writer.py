"""The history writer's order of commits, on a real SQLite file."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from kernelgw.storage.database import Database
from kernelgw.storage.writer import COMMIT_BYTES, LARGE_BYTES, Writer

CHUNK = 256 << 10


@pytest.fixture
async def writer(tmp_path: Path) -> AsyncIterator[Writer]:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'history.db'}", "normal")
    db.open()
    assert await db.ensure_ready(force=True)
    w = Writer(db, max_pending=100)
    w.start()
    try:
        yield w
    finally:
        await w.close()
        await db.close()


def row(order: list[str], name: str) -> Any:
    async def write(conn: AsyncConnection) -> None:
        await conn.execute(text("SELECT 1"))
        order.append(name)

    return write


async def test_small_answers_commit_before_a_large_row_of_their_batch(writer: Writer) -> None:
    loop, order = asyncio.get_running_loop(), []
    futures = {name: loop.create_future() for name in ("large", "small-1", "small-2")}
    # queued in one go: one batch
    writer.enqueue("large", row(order, "large"), futures["large"], size=LARGE_BYTES)
    writer.enqueue("audit", row(order, "audit"), deferrable=True)
    writer.enqueue("small-1", row(order, "small-1"), futures["small-1"], size=100)
    writer.enqueue("small-2", row(order, "small-2"), futures["small-2"])
    await asyncio.wait_for(asyncio.gather(*futures.values()), 30)
    await writer.flush()
    assert order == ["small-1", "small-2", "large", "audit"]


async def test_a_batch_of_small_rows_keeps_its_order(writer: Writer) -> None:
    loop, order = asyncio.get_running_loop(), []
    futures = [loop.create_future() for _ in range(3)]
    for i, future in enumerate(futures):
        writer.enqueue(f"row {i}", row(order, f"row {i}"), future, size=LARGE_BYTES - 1)
    await asyncio.wait_for(asyncio.gather(*futures), 30)
    assert order == ["row 0", "row 1", "row 2"]


async def test_the_writer_does_not_checkpoint_in_its_commits_but_beside_them(writer: Writer, tmp_path: Path) -> None:
    """The WAL grows past SQLite's own checkpoint size without a checkpoint in a
    commit; the checkpointer then copies it back on its own connection."""
    path = tmp_path / "history.db"
    loop = asyncio.get_running_loop()
    big = "x" * (1 << 20)

    def insert(i: int) -> Any:
        async def write(conn: AsyncConnection) -> None:
            await conn.execute(text("CREATE TABLE IF NOT EXISTS big (i INTEGER, v TEXT)"))
            await conn.execute(text("INSERT INTO big VALUES (:i, :v)"), {"i": i, "v": big})

        return write

    for i in range(6):  # 6 MiB, one commit each: SQLite would have checkpointed inside the 5th
        future = loop.create_future()
        writer.enqueue(f"big {i}", insert(i), future, size=len(big))
        await asyncio.wait_for(future, 30)
    wal, engine = writer.db.wal, writer.db.sqlite_writer_engine()
    assert wal is not None and engine is not None
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
    await asyncio.to_thread(wal.wait)
    assert wal.checkpoints >= 1
    with sqlite3.connect(path) as conn:  # everything is in the database file's view, whole
        assert conn.execute("SELECT count(*), sum(length(v)) FROM big").fetchone() == (6, 6 * len(big))


async def test_a_cells_end_queued_deferrable_commits_after_its_chunks_and_answers_go_first(writer: Writer) -> None:
    """A cell's output chunks are deferrable and its end, queued behind chunks
    not yet committed, too: it stays behind them. Another session's small
    awaited row still commits first; each chunk's callback runs once it is committed."""
    loop, order, committed = asyncio.get_running_loop(), [], []
    end, other = loop.create_future(), loop.create_future()
    for part in range(5):  # 5 chunks: more than one transaction holds (COMMIT_BYTES)
        name = f"chunk {part}"
        writer.enqueue(
            name, row(order, name), deferrable=True, size=CHUNK, committed=lambda name=name: committed.append(name)
        )
    writer.enqueue("end", row(order, "end"), end, deferrable=True, size=100)
    writer.enqueue("other", row(order, "other"), other, size=100)
    await asyncio.wait_for(asyncio.gather(end, other), 30)
    assert order == ["other", *(f"chunk {p}" for p in range(5)), "end"]
    assert committed == [f"chunk {p}" for p in range(5)]


async def test_rows_past_the_commit_size_commit_in_several_transactions_in_order(writer: Writer) -> None:
    loop, order = asyncio.get_running_loop(), []
    transactions: list[list[str]] = []
    commit = writer._commit_in_thread

    def spy(engine: Any, batch: Any, loop: Any) -> Any:
        transactions.append([op.what for op in batch])
        return commit(engine, batch, loop)

    writer._commit_in_thread = spy  # type: ignore[method-assign]
    futures = [loop.create_future() for _ in range(6)]
    for i, future in enumerate(futures):
        writer.enqueue(f"row {i}", row(order, f"row {i}"), future, size=CHUNK)
    await asyncio.wait_for(asyncio.gather(*futures), 30)
    assert order == [f"row {i}" for i in range(6)]
    assert [name for t in transactions for name in t] == order
    assert max(len(t) for t in transactions) * CHUNK <= COMMIT_BYTES, transactions


async def test_an_answer_queued_while_a_floods_chunks_commit_goes_before_the_rest_of_them(writer: Writer) -> None:
    loop, order = asyncio.get_running_loop(), []
    transactions: list[list[str]] = []
    commit = writer._commit_in_thread
    answer = loop.create_future()

    def spy(engine: Any, batch: Any, loop_: Any) -> Any:
        transactions.append([op.what for op in batch])
        if len(transactions) == 1:  # the answer comes while the first part commits
            loop_.call_soon_threadsafe(lambda: writer.enqueue("answer", row(order, "answer"), answer, size=100))
        return commit(engine, batch, loop_)

    writer._commit_in_thread = spy  # type: ignore[method-assign]
    for i in range(8):  # one batch: 2 MiB of chunks, four transactions
        writer.enqueue(f"chunk {i}", row(order, f"chunk {i}"), deferrable=True, size=CHUNK)
    await asyncio.wait_for(answer, 30)
    await writer.flush()
    assert order.index("answer") == 2, order  # after the first part (two chunks), before the other six
    assert [name for name in order if name != "answer"] == [f"chunk {i}" for i in range(8)]
    assert transactions[1] == ["answer"], transactions
