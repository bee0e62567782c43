"""The store's engine on SQLite: a sync SQLAlchemy engine whose statements run in threads.

SQLAlchemy's asyncio engine (``sqlalchemy.ext.asyncio``) imports its ORM
session with it, and aiosqlite besides: 50-90 ms of CPU at every gateway start,
before the first cell can run, for a store that uses Core only. On SQLite,
whose driver blocks anyway (aiosqlite runs it in a thread of its own), the
store's reads and set-up run here instead: each statement in a worker thread
(`asyncio.to_thread`), its rows fetched there too, so the event loop never
steps a SQLite cursor. PostgreSQL keeps the asyncio engine over asyncpg,
imported only then (`kernelgw.storage.engine.create_store_engine`).

`ThreadEngine` and `ThreadConnection` offer the part of `AsyncEngine` and
`AsyncConnection` the store uses (``connect``, ``begin``, ``dispose``;
``execute``, ``scalar``, ``stream``, ``run_sync``), so the storage modules take either
(`StoreEngine`, `StoreConnection`). The history writer does not come here: it
commits its batches on a sync engine of its own (`kernelgw.storage.writer`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from sqlalchemy import Connection, Engine, Executable, Result, Row
from sqlalchemy.pool import StaticPool

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

T = TypeVar("T")

StoreEngine: TypeAlias = "AsyncEngine | ThreadEngine"
StoreConnection: TypeAlias = "AsyncConnection | ThreadConnection"


def _execute(conn: Connection, statement: Executable, parameters: Any) -> Result[Any]:
    """In a worker thread: run ``statement``; its rows, if any, fetched here (the
    result is closed: a statement without rows keeps its ``rowcount``)."""
    result = conn.execute(statement, parameters)
    if not result.returns_rows:
        return result
    return result.freeze()()


def _connect_and_begin(engine: Engine) -> Connection:
    conn = engine.connect()
    try:
        conn.begin()
    except BaseException:
        conn.close()
        raise
    return conn


def _commit_and_close(conn: Connection) -> None:
    try:
        conn.commit()
    finally:
        conn.close()


class ThreadStream:
    """A statement's rows, fetched in pages in worker threads (`ThreadConnection.stream`)."""

    def __init__(self, conn: ThreadConnection, result: Result[Any], page: int) -> None:
        self._conn = conn
        self._result = result
        self._page = page

    async def __aiter__(self) -> AsyncIterator[Row[Any]]:
        while rows := await self._conn.in_thread(self._result.fetchmany, self._page):
            for row in rows:
                yield row

    async def close(self) -> None:
        await self._conn.in_thread(self._result.close)


class ThreadConnection:
    """One checked-out connection, used by one task at a time, from any worker
    thread. Its calls there take turns (`in_thread`): a statement whose caller
    was cancelled runs to its end before the connection's next call (its close,
    say), as on aiosqlite's one thread per connection."""

    def __init__(self, conn: Connection) -> None:
        self.sync_connection = conn
        self._turn = threading.Lock()

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        def call() -> T:
            with self._turn:
                return fn(*args)

        return await asyncio.to_thread(call)

    async def execute(self, statement: Executable, parameters: Any = None) -> Result[Any]:
        return await self.in_thread(_execute, self.sync_connection, statement, parameters)

    async def scalar(self, statement: Executable, parameters: Any = None) -> Any:
        """The first column of the first row (None without one)."""
        return (await self.execute(statement, parameters)).scalar()

    async def stream(self, statement: Executable) -> ThreadStream:
        """Rows a page at a time (the statement's ``yield_per``, else 100), for a
        reader that may stop early."""
        page = statement.get_execution_options().get("yield_per") or 100
        result = await self.in_thread(self.sync_connection.execute, statement)
        return ThreadStream(self, result, page)

    async def run_sync(self, fn: Callable[[Connection], T]) -> T:
        """``fn(connection)`` in a worker thread (Alembic, the schema's set-up)."""
        return await self.in_thread(fn, self.sync_connection)


class _Inline(ThreadConnection):
    """A `ThreadConnection` used inside its worker thread (`ThreadEngine.run`):
    its calls run where they are, and its awaits never suspend."""

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)


class AwaitedElsewhere(RuntimeError):
    """Work run inline in a worker thread (`run_inline`) awaited something other than its connection."""


def run_inline(work: Callable[[ThreadConnection], Awaitable[T]], conn: Connection, what: str) -> T:
    """``work`` on ``conn`` to its end in this (worker) thread, without an event
    loop: it may await only its connection, whose calls run where they are (the
    history writer's batches, `ThreadEngine.run`). ``what`` names it in the error."""
    steps = work(_Inline(conn)).__await__()
    try:
        steps.send(None)
    except StopIteration as end:
        return end.value  # type: ignore[no-any-return]
    steps.close()
    raise AwaitedElsewhere(f"{what} awaited something other than its connection")


async def on_one_connection(engine: StoreEngine, work: Callable[[StoreConnection], Coroutine[Any, Any, T]]) -> T:
    """``work``, a read, on one connection, all of its statements reading one state
    of the database (one read transaction, never committed): a history read takes
    a cell's row, then its output chunks, and a commit between the two (a late
    error: its chunk and its row's status ``error``) was read half, the chunk
    without the status. On SQLite all of it in one worker-thread hop: a read of
    many small queries (a restart's reattach reads: 5 a session) does not wait
    for the GIL at each of them, while the start-up's other threads import and build."""
    if isinstance(engine, ThreadEngine):
        return await engine.run(work)
    async with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            # READ COMMITTED, the default, reads each statement's own snapshot
            await conn.execution_options(isolation_level="REPEATABLE READ")
        return await work(conn)


async def _checked_out(engine: Engine, begin: bool) -> ThreadConnection:
    """A connection from the pool (in a transaction when ``begin``); one whose
    caller was cancelled meanwhile goes back to the pool when it arrives."""
    made = asyncio.ensure_future(asyncio.to_thread(_connect_and_begin if begin else Engine.connect, engine))
    try:
        return ThreadConnection(await asyncio.shield(made))
    except asyncio.CancelledError:
        made.add_done_callback(lambda f: None if f.cancelled() or f.exception() else f.result().close())
        raise


class ThreadEngine:
    """A sync engine (its connections made with ``check_same_thread=False``: a
    connection's statements may run in different worker threads, one at a time)."""

    def __init__(self, engine: Engine) -> None:
        self.sync_engine = engine
        self._own_connections = not isinstance(engine.pool, StaticPool)
        """A file's connections are each its own; an in-memory database's one is
        shared (with the writer too): a read transaction there would take in others' writes."""

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[ThreadConnection]:
        conn = await _checked_out(self.sync_engine, begin=False)
        try:
            yield conn
        finally:
            await conn.in_thread(conn.sync_connection.close)  # a transaction left open is rolled back

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[ThreadConnection]:
        """A connection in a transaction, committed at the block's end (rolled back
        on an error); two thread hops besides the statements'."""
        conn = await _checked_out(self.sync_engine, begin=True)
        try:
            yield conn
        except BaseException:
            await conn.in_thread(conn.sync_connection.close)  # rolls the transaction back
            raise
        await conn.in_thread(_commit_and_close, conn.sync_connection)

    async def run(self, work: Callable[[ThreadConnection], Coroutine[Any, Any, T]]) -> T:
        """``work`` on one connection, all of it in one worker thread, in one read
        transaction on a file (`on_one_connection`)."""

        def in_thread() -> T:
            with self.sync_engine.connect() as conn:
                if self._own_connections:
                    # pysqlite opens a transaction only before a write, so each read
                    # statement would see the latest commit; the read transaction
                    # is rolled back when the connection goes back to the pool
                    conn.exec_driver_sql("BEGIN")
                return run_inline(work, conn, "a store read run in one thread hop")

        return await asyncio.to_thread(in_thread)

    async def dispose(self) -> None:
        await asyncio.to_thread(self.sync_engine.dispose)
