"""The history writer: one task commits queued writes in order, in batches.

Recorder calls only queue (`Writer.enqueue` never waits), so the event loop is
never held up by the database. On a SQLite file a batch is committed in one
writer thread, in one hop; on PostgreSQL over asyncpg. A write somebody waits
on (a cell's end, a note) gets its future resolved only after the commit:
acknowledged means stored. Rows nobody waits on linger briefly to share such a
commit.

A database that cannot write holds the batch back (bounded) and retries it
before anything newer; a row the database refuses is dropped alone, loudly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DataError, IntegrityError

from kernelgw.errors import StorageUnavailable
from kernelgw.storage.database import Database
from kernelgw.storage.health import DatabaseFileReplaced, WriteHealth
from kernelgw.storage.thread_engine import ThreadConnection, run_inline
from kernelgw.tasks import cancel_and_wait

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger(__name__)

BATCH = 200
"""Most rows committed in one transaction."""
LARGE_BYTES = 256 << 10
"""A row this large (a cell's output) commits after the small awaited rows of
its batch, not with them: other sessions' answers do not wait for its writing."""
COMMIT_BYTES = 512 << 10
"""About the most one transaction writes (two output chunks): the rows of a
batch past it commit in further transactions, so a commit is never large."""
LINGER_S = 0.02
"""Longest rows nobody waits on are held for one that somebody waits on: also how
long a cell runs before its ``running`` row is committed (a gateway killed sooner
leaves no row for it: it was never answered)."""
ANSWERS_OUT_S = 0.002
"""How long deferrable rows wait after the answers of their batch (`Writer._answers_out`)."""
RETRY_INTERVAL_S = 1.0
"""How often the writer retries rows a storage fault kept back."""
CLOSE_TIMEOUT_S = 30.0
"""Longest a shutdown waits for queued rows to be committed."""

Write = Callable[["AsyncConnection"], Awaitable[Any]]


def _run_in_thread(write: Write, conn: Connection) -> Any:
    """A `Write` in the SQLite writer thread: its ``await conn.execute(...)`` never suspends."""
    return run_inline(cast("Callable[[ThreadConnection], Awaitable[Any]]", write), conn, "a history write")


async def _nothing(conn: AsyncConnection) -> None:
    """A write that only ends the writer's wait for more rows (`Writer.flush`)."""


@dataclass
class _Op:
    what: str
    write: Write
    future: asyncio.Future[Any] | None = None
    deferrable: bool = False
    """May commit after the other rows of its batch (see `Writer._write`)."""
    size: int = 0
    """About how many bytes it writes (`LARGE_BYTES`)."""
    committed: Callable[[], None] | None = None
    """Called on the event loop once it is committed (an output chunk: its events may go)."""
    queued_at: float = field(default_factory=time.perf_counter)


def _answer(op: _Op) -> bool:
    """A small row an answer waits for: committed before the rest of its batch
    (deferrable rows, large ones), see `Writer._write`."""
    return op.future is not None and not op.deferrable and op.size < LARGE_BYTES


class Writer:
    """The queue of history writes and the task that commits them."""

    def __init__(self, db: Database, max_pending: int) -> None:
        self.db = db
        self.health = WriteHealth()
        self._queue: asyncio.Queue[_Op] = asyncio.Queue(max_pending)
        self._held: list[_Op] = []
        """Rows a storage fault kept back, oldest first: retried before newer ones."""
        self._lingering = False
        """The writer is holding rows nobody waits on for a moment (`_linger`)."""
        self._arrived = asyncio.Event()
        """Set by each `enqueue` (`_answers_out`)."""
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="history-writer")
        self._conn: Connection | None = None
        self._conn_engine: Engine | None = None
        """The writer thread's connection (`_connection`) and the engine it came from."""
        self._task: asyncio.Task[None] | None = None
        self.write_latency_ms: list[float] = []
        """Queue-to-commit time of recent rows (kept for measurements, bounded)."""

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def holding(self) -> bool:
        """Rows are held back by a storage fault (readers would not see them)."""
        return bool(self._held)

    @property
    def answers_may_journal(self) -> bool:
        """An answer may go out before its row's commit (`kernelgw.storage.journal`):
        not while a fault holds rows back, when the answer must say it was not stored."""
        return self.running and not self._held and self.health.ok

    def start(self) -> None:
        self._task = asyncio.create_task(self._write_loop(), name="history-writer")

    async def close(self) -> None:
        """Commit what is queued (for a while), then stop the task and its thread."""
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.flush()
        except TimeoutError:
            log.error("history storage: %d rows not written at shutdown", self._queue.qsize())
        await cancel_and_wait(self._task)
        self._task = None
        self._thread.submit(self._release_connection)  # after a commit still running there
        self._thread.shutdown(wait=False)  # its thread ends; a fresh one if started again
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="history-writer")

    def enqueue(
        self,
        what: str,
        write: Write,
        future: asyncio.Future[Any] | None = None,
        *,
        deferrable: bool = False,
        size: int = 0,
        committed: Callable[[], None] | None = None,
    ) -> None:
        """Queue a write for the writer task; never waits (a full queue drops it, loudly).
        ``deferrable``: nothing acknowledged depends on it (an audit row, a cell's
        running row or its output so far), so it may commit after an answer's row;
        deferrable rows keep their order among themselves, and so does an awaited
        row queued deferrable (a cell's end behind its output chunks).
        ``size``: about how many bytes it writes (a large row commits on its own).
        ``committed``: called once it is committed."""
        try:
            self._queue.put_nowait(_Op(what, write, future, deferrable, size, committed))
            self._arrived.set()
        except asyncio.QueueFull:
            log.error("history storage is %d rows behind; dropped %s", self._queue.maxsize, what)
            if future is not None and not future.done():
                future.set_exception(StorageUnavailable("The history storage is overloaded; retry later."))

    async def flush(self) -> None:
        """Wait until every row queued so far is committed (or dropped)."""
        if self.running:
            if self._lingering:  # a reader waits: commit now
                self.enqueue("flush", _nothing, asyncio.get_running_loop().create_future())
            await self._queue.join()

    async def _write_loop(self) -> None:
        while True:
            batch = self._held
            self._held = []
            try:
                wait = RETRY_INTERVAL_S if batch else None  # held rows: retry them soon
                new = [await asyncio.wait_for(self._queue.get(), wait)]
            except TimeoutError:
                new = []
            self._take_queued(new)
            if new and not batch:
                await self._linger(new)
            try:
                await self._write(batch + new)
            finally:
                for _ in new:
                    self._queue.task_done()

    def _take_queued(self, new: list[_Op]) -> None:
        while len(new) < BATCH:
            try:
                new.append(self._queue.get_nowait())
            except asyncio.QueueEmpty:
                break

    async def _linger(self, new: list[_Op]) -> None:
        """Rows nobody waits on (a cell's start, audit) wait up to `LINGER_S` for
        one somebody waits on (a cell's end, a note, a reader's flush), so they share
        its commit: a fast cell pays one commit on its answer's path, not two."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER_S
        self._lingering = True
        try:
            while len(new) < BATCH and all(op.future is None for op in new):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                try:
                    async with asyncio.timeout(remaining):
                        new.append(await self._queue.get())
                except TimeoutError:
                    return
                self._take_queued(new)
        finally:
            self._lingering = False

    async def _answers_out(self) -> None:
        """Let the answers just committed go out before the thread commits the
        rest: it holds the GIL while it does, and a ``done`` waited for it (0.25 ms
        at p50 for a WebSocket ``1+1``, the audit row's commit). A new row cuts
        the wait short: it would otherwise wait for it."""
        self._arrived.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ANSWERS_OUT_S):
                await self._arrived.wait()

    def _commit_in_thread(self, engine: Engine, batch: Sequence[_Op], loop: asyncio.AbstractEventLoop) -> None:
        """The writer thread: one transaction for the whole batch (blocking). The
        waiting answers are released from here, in the loop's next turn: through
        the executor's future and `_write` they took two turns more."""
        try:
            conn = self._connection(engine)
            with conn.begin():
                results = [_run_in_thread(op.write, conn) for op in batch]
                self.db.check_file()
        except BaseException:
            self._release_connection()  # a failed transaction's connection is not reused
            raise
        loop.call_soon_threadsafe(self._committed, batch, results)

    def _connection(self, engine: Engine) -> Connection:
        """The writer thread's one connection, held from batch to batch: a pool
        checkout and its reset were a third of a small commit's time."""
        if self._conn is not None and self._conn_engine is not engine:  # the file was opened again
            self._release_connection()
        if self._conn is None:
            self._conn = engine.connect()
            self._conn_engine = engine
        return self._conn

    def _release_connection(self) -> None:
        """In the writer thread (its connection is used there only)."""
        conn, self._conn, self._conn_engine = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    async def _write(self, batch: Sequence[_Op]) -> None:
        """Commit ``batch``; a row the database refuses is dropped, a database that
        cannot write holds the batch back for the next try (and fails its futures:
        nobody is told a row is stored before it is)."""
        if not batch:  # a split below left nothing here: no empty transaction in the thread
            return
        first = [op for op in batch if _answer(op)]
        if first and len(first) < len(batch):
            # the small rows answers wait for commit first, then the rest (deferrable
            # rows, and large ones: a flood's 16 MiB of output) at once, off the
            # other answers' path. Safe to reorder: a cell's running row is skipped
            # once its end row is queued, a checkpoint only updates a row still
            # running, audit rows are read by time, not by position, a large
            # row is a cell's end, of a session that sends nothing else meanwhile,
            # and a cell's end behind output chunks not yet committed is queued
            # deferrable, so it stays behind them.
            await self._write(first)
            rest = [op for op in batch if op not in first]
            await self._write([op for op in rest if not op.deferrable])
            await self._answers_out()
            await self._write([op for op in rest if op.deferrable])
            return
        if (
            any(op.future is not None for op in batch)
            and any(op.deferrable for op in batch)
            and not all(op.deferrable for op in batch)
        ):
            # large rows answers wait for, then the deferrable ones
            await self._write([op for op in batch if not op.deferrable])
            await self._answers_out()
            await self._write([op for op in batch if op.deferrable])
            return
        if len(batch) > 1 and sum(op.size for op in batch) > COMMIT_BYTES:
            await self._write_in_parts(batch)
            return
        db = self.db
        if not await db.ensure_ready():
            self._hold(batch, "the database does not answer")
            if (path := db.sqlite_file) is not None:  # a deleted data directory: make it again
                await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
            return
        assert db.engine is not None
        committed = False
        try:
            if (writer := db.sqlite_writer_engine()) is not None:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._thread, self._commit_in_thread, writer, batch, loop)
                committed = True  # and `_committed` ran, scheduled by the thread before it returned
                if db.wal is not None:
                    db.wal.committed([op.size for op in batch])
                return
            engine = cast("AsyncEngine", db.engine)  # PostgreSQL: SQLite's writes went to the thread above
            async with engine.connect() as conn:
                async with conn.begin():
                    results = [await op.write(conn) for op in batch]
                    if db.sqlite_file is not None:
                        await asyncio.to_thread(db.check_file)
                committed = True
                # answer the waiting cells now, not after the connection's return to the pool
                self._committed(batch, results)
        except Exception as exc:
            if not committed:
                await self._failed(batch, exc)
            else:
                log.exception("history storage: releasing a connection after a commit failed")

    async def _write_in_parts(self, batch: Sequence[_Op]) -> None:
        """Commit ``batch`` in order, in transactions of about `COMMIT_BYTES` at
        most, and between two the answers queued meanwhile: a flood's chunks
        (16 MiB: 32 transactions) kept an answer that came after its batch was
        taken waiting for all of them (a bystander's ``1+1`` p95 rose 7x under a
        100 MB line flood, against 3x with one large row). Once a part is held
        back by a fault, the rest is held behind it."""
        pending = list(batch)
        taken = 0
        """Rows taken from the queue here: done (`task_done`) once written. A count,
        not the rows: a flood's chunks, committed, stayed alive in such a list
        until the flood ended (60 MB of a 100 MB stream)."""
        try:
            while pending:
                part = [pending.pop(0)]
                size = part[0].size
                while pending and size + pending[0].size <= COMMIT_BYTES:
                    part.append(pending.pop(0))
                    size += part[-1].size
                held = len(self._held)
                await self._write(part)
                if len(self._held) > held:  # held back: the rest waits behind it, in order
                    self._hold_behind(part[-1], pending)
                    return
                if not pending:
                    return
                fresh: list[_Op] = []
                self._take_queued(fresh)
                taken += len(fresh)
                answers = [op for op in fresh if _answer(op)]
                pending.extend(op for op in fresh if not _answer(op))
                if answers:
                    held = len(self._held)
                    await self._write(answers)
                    if len(self._held) > held:
                        self._hold_behind(answers[-1], pending)
                        return
        finally:
            for _ in range(taken):
                self._queue.task_done()

    def _hold_behind(self, last: _Op, rest: Sequence[_Op]) -> None:
        """Hold ``rest`` right after ``last``, which a fault just held back (their
        futures fail as its did: nobody is told a row is stored before it is)."""
        for op in rest:
            if op.future is not None and not op.future.done():
                op.future.set_exception(StorageUnavailable("The history storage cannot write; retry later."))
        at = next((i + 1 for i, op in enumerate(self._held) if op is last), len(self._held))
        self._held[at:at] = rest

    async def _failed(self, batch: Sequence[_Op], exc: Exception) -> None:
        """Sort out a batch whose transaction raised ``exc``."""
        if isinstance(exc, IntegrityError | DataError):
            if len(batch) > 1:  # find the bad row; keep the others
                for op in batch:
                    await self._write([op])
                return
            log.error("history storage: writing %s failed", batch[0].what, exc_info=exc)
            self._drop(batch, "the database refused the row")
        elif isinstance(exc, DatabaseFileReplaced):
            self._hold(batch, str(exc))
            await self.db.reopen()
        else:
            self._hold(batch, f"{type(exc).__name__}: {exc}")
            await self.db.recheck()

    def _committed(self, batch: Sequence[_Op], results: Sequence[Any]) -> None:
        if self.health.succeeded():
            log.warning("history storage: writes succeed again (%d rows were held back)", len(batch))
        done = time.perf_counter()
        for op, result in zip(batch, results, strict=True):
            if len(self.write_latency_ms) < 100000:
                self.write_latency_ms.append((done - op.queued_at) * 1000)
            if op.future is not None and not op.future.done():
                op.future.set_result(result)
            if op.committed is not None:
                try:
                    op.committed()
                except Exception:
                    log.exception("history storage: after committing %s", op.what)

    def _hold(self, batch: Sequence[_Op], why: str) -> None:
        """Keep ``batch`` for a retry (bounded: past ``max_pending`` the oldest go) and report the fault."""
        if self.health.failed(why):
            log.error("history storage at %s cannot write: %s", self.db.display_url, why)
        for op in batch:
            if op.future is not None and not op.future.done():
                op.future.set_exception(StorageUnavailable(f"The history storage cannot write ({why}); retry later."))
        self._held = [*batch, *self._held]
        if len(self._held) > self._queue.maxsize:
            excess = len(self._held) - self._queue.maxsize
            self._drop(self._held[:excess], "too many rows held back by a storage fault")
            del self._held[:excess]

    @staticmethod
    def _drop(batch: Sequence[_Op], why: str) -> None:
        log.warning("history storage: dropped %d rows (%s)", len(batch), why)
        for op in batch:
            if op.future is not None and not op.future.done():
                op.future.set_exception(StorageUnavailable(f"The history storage failed: {why}."))
