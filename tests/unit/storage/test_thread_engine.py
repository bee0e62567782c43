"""The store's engine on SQLite (kernelgw/storage/thread_engine.py), on a real
SQLite file: rows are fetched in the worker thread (a result outlives its
connection), ``begin`` commits or rolls back as SQLAlchemy's asyncio engine does,
and a statement whose caller was cancelled ends before its connection goes back
to the pool."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from kernelgw.storage.engine import create_database_engine
from kernelgw.storage.thread_engine import StoreConnection, ThreadEngine, on_one_connection


@pytest.fixture
async def engine(tmp_path: Path) -> Any:
    made = create_database_engine(f"sqlite+aiosqlite:///{tmp_path / 'db' / 'h.db'}", "process")
    assert isinstance(made, ThreadEngine)
    async with made.begin() as conn:
        await conn.execute(text("CREATE TABLE t (x INTEGER)"))
    yield made
    await made.dispose()


async def test_a_result_is_read_in_the_thread_and_outlives_its_connection(engine: ThreadEngine) -> None:
    """SQLite steps a query's rows as they are fetched (no ORDER BY: none is
    computed ahead): all of them in the worker thread, none on the event loop's."""
    stepped_in: set[int] = set()

    @event.listens_for(engine.sync_engine, "connect")
    def _function(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.create_function("seen", 1, lambda x: stepped_in.add(threading.get_ident()) or x)

    await engine.dispose()  # new connections, with the function
    async with engine.begin() as conn:
        await conn.execute(text("INSERT INTO t VALUES (1), (2), (3)"))
    async with engine.connect() as conn:
        result = await conn.execute(text("SELECT seen(x) AS x FROM t"))
        update = await conn.execute(text("UPDATE t SET x = x + 10 WHERE x > 1"))
    assert [row.x for row in result] == [1, 2, 3]  # the connection is back in the pool
    assert update.rowcount == 2
    assert stepped_in and threading.get_ident() not in stepped_in


async def test_begin_commits_at_the_end_and_rolls_back_on_an_error(engine: ThreadEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("INSERT INTO t VALUES (1)"))
    with pytest.raises(RuntimeError):
        async with engine.begin() as conn:
            await conn.execute(text("INSERT INTO t VALUES (2)"))
            raise RuntimeError("no")
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT x FROM t"))).scalars().all() == [1]
        assert await conn.scalar(text("SELECT count(*) FROM t")) == 1


async def test_a_stream_stops_early_and_is_closed(engine: ThreadEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("INSERT INTO t VALUES (1), (2), (3), (4), (5)"))
    async with engine.connect() as conn:
        result = await conn.stream(text("SELECT x FROM t ORDER BY x").execution_options(yield_per=2))
        seen = []
        async for row in result:
            seen.append(row.x)
            if len(seen) == 3:
                break
        await result.close()
        assert await conn.scalar(text("SELECT max(x) FROM t")) == 5  # the connection is usable after it
    assert seen == [1, 2, 3]


async def test_a_cancelled_statement_ends_before_its_connection_is_returned(engine: ThreadEngine) -> None:
    """The statement waits for its connection's return to the pool, or 1 s: a close
    that did not wait for it returns the connection meanwhile (and fails below);
    one that waits lets the statement time out first."""
    started, returned = threading.Event(), threading.Event()
    order: list[str] = []

    def slow() -> int:
        started.set()
        returned.wait(1.0)
        order.append("statement ended")
        return 1

    @event.listens_for(engine.sync_engine, "connect")
    def _function(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.create_function("slow", 0, slow)

    @event.listens_for(engine.sync_engine, "checkin")
    def _returned(_dbapi_connection: Any, _record: Any) -> None:
        order.append("returned to the pool")
        returned.set()

    await engine.dispose()  # new connections, with the function

    async def query() -> None:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT slow()"))

    task = asyncio.create_task(query())
    assert await asyncio.to_thread(started.wait, 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert order == ["statement ended", "returned to the pool"]


async def test_work_on_one_connection_runs_in_one_thread_hop(engine: ThreadEngine) -> None:
    """A restart's reattach reads (queries.reattach_reads): all its statements in one
    worker thread, rows streamed there too; work that awaits anything else fails."""
    threads: list[int] = []

    @event.listens_for(engine.sync_engine, "connect")
    def _function(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.create_function("seen", 1, lambda x: threads.append(threading.get_ident()) or x)

    await engine.dispose()  # new connections, with the function
    async with engine.begin() as conn:
        await conn.execute(text("INSERT INTO t VALUES (1), (2), (3)"))

    async def read(conn: StoreConnection) -> list[int]:
        first = (await conn.execute(text("SELECT seen(x) AS x FROM t"))).scalars().all()
        stream = await conn.stream(text("SELECT seen(x) AS x FROM t").execution_options(yield_per=1))
        streamed = [row.x async for row in stream]
        await stream.close()
        return [*first, *streamed]

    assert await on_one_connection(engine, read) == [1, 2, 3, 1, 2, 3]
    assert len(threads) == 6 and len(set(threads)) == 1 and threading.get_ident() not in threads

    async def waits(conn: StoreConnection) -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="awaited something other"):
        await on_one_connection(engine, waits)
