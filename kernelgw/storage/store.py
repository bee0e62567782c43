"""`Store`: the `Recorder` the session manager calls, plus the history queries.

The recorder methods queue rows; one writer task commits queued rows in
order, in batches (on SQLite in one writer thread, one hop per batch; on
PostgreSQL over asyncpg), so the event loop is never blocked. Only a cell's end
is waited for (acknowledged means stored: its ``done`` is published after the
commit); rows nobody waits on linger briefly to share that commit. Queries
first wait for the queue to drain (`flush`), so a client reads its own writes.

A database that fails or is down never breaks a session: the failed rows are
logged and dropped, the writer tries to reconnect and create the tables again
later, and history queries answer ``StorageUnavailable`` (503) meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, Engine, bindparam, create_engine, delete, event, insert, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from kernelgw import events as ev
from kernelgw.errors import StorageUnavailable
from kernelgw.runtime.backends.base import KernelHandle, KernelSpec
from kernelgw.runtime.recorder import StoredSession
from kernelgw.storage import audit, schema
from kernelgw.storage.health import DatabaseFileReplaced, FileIdentity, WriteHealth
from kernelgw.storage.records import ExecutionRecord, NoteRecord, SessionRecord, as_utc
from kernelgw.tasks import cancel_and_wait

if TYPE_CHECKING:
    from kernelgw.config import Settings
    from kernelgw.runtime.fanout import Published
    from kernelgw.runtime.recorder import RecordedExecution, RecordedSession

log = logging.getLogger(__name__)

DB_FILE = "kernelgw.db"
_ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg"}
RUNNING = "running"
"""The status of an execution's row from its start until its end is stored."""
CUT_OFF_REASON = "the gateway stopped while this cell ran; its output and outcome were not recorded"
CRASHED_REASON = "the gateway stopped without ending the session"
BATCH = 200
"""Most rows committed in one transaction."""
LINGER_S = 0.02
"""Longest rows nobody waits on are held for one that somebody waits on: also how
long a cell runs before its ``running`` row is committed (a gateway killed sooner
leaves no row for it: it was never answered)."""
RECONNECT_INTERVAL_S = 5.0
RETRY_INTERVAL_S = 1.0
"""How often the writer retries rows a storage fault kept back."""
"""How often a store whose database failed tries to set it up again."""


def async_database_url(url: str) -> str:
    """``postgresql://`` -> ``postgresql+asyncpg://``, ``sqlite://`` -> ``sqlite+aiosqlite://``;
    URLs that already name a driver are kept."""
    parsed = make_url(url)
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in _ASYNC_DRIVERS:
        raise ValueError(f"database_url must be a sqlite:// or postgresql:// URL, not {backend}://")
    if not driver or driver in ("psycopg2", "pysqlite", "psycopg"):
        parsed = parsed.set(drivername=_ASYNC_DRIVERS[backend])
    return parsed.render_as_string(hide_password=False)


def database_url_for(settings: Settings) -> str:
    """The settings' ``database_url``, else a SQLite file in ``data_dir``."""
    if settings.database_url:
        return async_database_url(settings.database_url)
    return f"sqlite+aiosqlite:///{Path(settings.data_dir).expanduser().resolve() / DB_FILE}"


def _utc(value: datetime | None) -> datetime | None:
    return as_utc(value) if value is not None else None


def _now() -> datetime:
    return datetime.now(UTC)


Write = Callable[[AsyncConnection], Awaitable[Any]]


# Constant statements (parameters passed apart) are compiled once: building and
# compiling `insert(...).values(...)` per row cost more than the SQLite write.
_INSERT_EXECUTION = insert(schema.executions)
_END_EXECUTION = (
    update(schema.executions)
    .where(
        schema.executions.c.session_id == bindparam("k_session"),
        schema.executions.c.position == bindparam("k_position"),
        schema.executions.c.execution_id == bindparam("k_execution"),
    )
    .values({c: bindparam(c) for c in ("status", "execution_count", "duration_ms", "reason", "state_lost", "events")})
)


@dataclass
class _StartRow:
    """A cell's ``running`` row: written by the writer unless its end came first."""

    position: int
    superseded: bool = False
    """Set on the event loop when the end is queued."""
    inserted: bool = False
    """Set by the writer when the row was written (the end then updates it)."""


class _InThread:
    """An `AsyncConnection` stand-in over a sync connection, so a `Write` runs in the
    SQLite writer thread: its ``await conn.execute(...)`` never suspends."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def execute(self, statement: Any, *args: Any) -> Any:
        return self._conn.execute(statement, *args)


def _run_to_end(write: Write, conn: Connection) -> Any:
    """Run ``write`` to its end without an event loop (it awaits only `_InThread`)."""
    steps = write(cast(AsyncConnection, _InThread(conn))).__await__()
    try:
        steps.send(None)
    except StopIteration as end:
        return end.value
    steps.close()
    raise RuntimeError("a history write awaited something other than the database")


async def _nothing(conn: AsyncConnection) -> None:
    """A write that only ends the writer's wait for more rows (`Store.flush`)."""


def _migrate(conn: Any) -> None:
    """Add the columns newer releases added to tables an older one created."""
    from sqlalchemy import inspect, text

    inspector = inspect(conn)
    for table, columns in schema.MIGRATIONS.items():
        present = {c["name"] for c in inspector.get_columns(table)}
        for name, sql_type in columns.items():
            if name not in present:
                conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {name} {sql_type}"))
                log.info("storage: added column %s.%s", table, name)


@dataclass
class _Op:
    what: str
    write: Write
    future: asyncio.Future[Any] | None = None
    queued_at: float = field(default_factory=time.perf_counter)


class Store:
    """History storage on SQLite or PostgreSQL; implements `kernelgw.runtime.recorder.Recorder`.

    ``start`` (in the app's lifespan) connects, creates the tables, purges
    history older than the retention and starts the writer. The sessions a
    predecessor of the same ``gateway_name`` left open are the manager's to
    reattach or end (``open_sessions``, ``session_lost``).
    ``close`` commits what is queued, then disconnects.
    """

    def __init__(
        self,
        url: str,
        *,
        gateway_name: str = "default",
        retention_days: float = 30.0,
        audit_retention_days: float = 365.0,
        purge_interval_s: float = 3600.0,
        max_pending: int = 10000,
        durability: str = "process",
    ) -> None:
        self.url = async_database_url(url)
        self.durability = durability
        """"process": a commit survives a crash of the gateway process (SQLite
        ``synchronous=NORMAL``); "fsync": also power loss (``synchronous=FULL``)."""
        self._started: dict[tuple[str, str], _StartRow] = {}
        """(session, execution) -> the ``running`` row queued for it."""
        self.gateway_name = gateway_name
        self.retention_days = retention_days
        self.audit_retention_days = audit_retention_days
        self.purge_interval_s = purge_interval_s
        self._queue: asyncio.Queue[_Op] = asyncio.Queue(max_pending)
        self._engine: AsyncEngine | None = None
        self._ready = False
        self._last_attempt = 0.0
        self._positions: dict[str, int] = {}
        self._health = WriteHealth()
        self._held: list[_Op] = []
        """Rows a storage fault kept back, oldest first: retried before newer ones."""
        self._file_identity: FileIdentity | None = None
        self._lingering = False
        """The writer is holding rows nobody waits on for a moment (`_linger`)."""
        self._sqlite_writer: Engine | None = None
        """SQLite only: a sync engine the writer thread commits a whole batch on, in
        one hop off the event loop (aiosqlite would take about six per commit)."""
        self._writer_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="history-writer")
        self._writer: asyncio.Task[None] | None = None
        self._purger: asyncio.Task[None] | None = None
        self.write_latency_ms: list[float] = []
        """Queue-to-commit time of recent rows (kept for measurements, bounded)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        return cls(
            database_url_for(settings),
            gateway_name=settings.gateway_name,
            retention_days=settings.history_retention_days,
            audit_retention_days=settings.audit_retention_days,
            purge_interval_s=settings.history_purge_interval_s,
            durability=settings.durability,
        )

    @property
    def dialect(self) -> str:
        return make_url(self.url).get_backend_name()

    @property
    def display_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    @property
    def available(self) -> bool:
        return self._ready

    @property
    def health(self) -> WriteHealth:
        """Whether the writer's latest commit worked (a fault refuses new work with 503)."""
        return self._health

    @property
    def _sqlite_file(self) -> Path | None:
        url = make_url(self.url)
        if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
            return None
        return Path(url.database).expanduser()

    # ------------------------------------------------------------ lifecycle
    async def start(self, background: bool = True) -> None:
        """``background=False`` (the CLI): connect and create tables only; no
        writer, no purge, no clean-up of a running gateway's sessions."""
        self._engine = self._create_engine()
        if not background:
            if not await self._ensure_ready(force=True):
                raise StorageUnavailable(f"The database at {self.display_url} does not answer.")
            return
        if await self._ensure_ready(force=True):
            try:
                await self._end_cut_off_executions()
                await self.purge()
            except Exception:
                log.exception("history storage: start-up clean-up failed")
        self._writer = asyncio.create_task(self._write_loop(), name="history-writer")
        if self.purge_interval_s > 0:
            self._purger = asyncio.create_task(self._purge_loop(), name="history-purge")

    async def close(self) -> None:
        try:
            async with asyncio.timeout(30):
                await self.flush()
        except TimeoutError:
            log.error("history storage: %d rows not written at shutdown", self._queue.qsize())
        await cancel_and_wait(self._writer, self._purger)
        self._writer = self._purger = None
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None
        self._dispose_sqlite_writer()
        self._writer_thread.shutdown(wait=False)  # its thread ends; a fresh one if started again
        self._writer_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="history-writer")
        self._ready = False

    def _create_engine(self) -> AsyncEngine:
        url = make_url(self.url)
        if url.get_backend_name() == "sqlite":
            if url.database and url.database != ":memory:":
                Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            engine = create_async_engine(url, connect_args={"timeout": 30})
            self._sqlite_pragmas(engine.sync_engine)
            return engine
        return create_async_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5, connect_args={"timeout": 10})

    def _sqlite_pragmas(self, engine: Engine) -> None:
        synchronous = "FULL" if self.durability == "fsync" else "NORMAL"

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            # WAL: readers (exports) do not wait for the writer, nor it for them.
            # NORMAL: a commit is in the OS once it returns (survives a process
            # crash); FULL also fsyncs the WAL at every commit (survives power loss).
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()

    def _sqlite_writer_engine(self) -> Engine | None:
        """The writer thread's sync engine (SQLite files only), made on first use."""
        path = self._sqlite_file
        if path is None:
            return None
        if self._sqlite_writer is None:
            self._sqlite_writer = create_engine(
                f"sqlite:///{path}", connect_args={"timeout": 30, "check_same_thread": False}
            )
            self._sqlite_pragmas(self._sqlite_writer)
        return self._sqlite_writer

    def _dispose_sqlite_writer(self) -> None:
        if self._sqlite_writer is not None:
            self._sqlite_writer.dispose()
            self._sqlite_writer = None

    def _commit_in_thread(self, engine: Engine, batch: Sequence[_Op]) -> list[Any]:
        """The writer thread: one transaction for the whole batch (blocking)."""
        with engine.begin() as conn:
            results = [_run_to_end(op.write, conn) for op in batch]
            path, identity = self._sqlite_file, self._file_identity
            if path is not None and identity is not None:
                identity.check(path)
        return results

    async def _ensure_ready(self, force: bool = False) -> bool:
        """Create the tables when not done yet; retried at most every few seconds."""
        if self._ready:
            return True
        if self._engine is None:
            return False
        now = time.monotonic()
        if not force and now - self._last_attempt < RECONNECT_INTERVAL_S:
            return False
        self._last_attempt = now
        try:
            async with self._engine.begin() as conn:
                await conn.run_sync(schema.metadata.create_all)
                await conn.run_sync(_migrate)
        except Exception as exc:
            log.error("history storage at %s is unavailable: %s", self.display_url, exc)
            return False
        self._ready = True
        if (path := self._sqlite_file) is not None:
            self._file_identity = await asyncio.to_thread(FileIdentity.of, path)
        log.info("history storage: %s", self.display_url)
        return True

    # ------------------------------------------------------------ the writer
    def enqueue(self, what: str, write: Write, future: asyncio.Future[Any] | None = None) -> None:
        """Queue a write for the writer task; never waits (a full queue drops it, loudly)."""
        try:
            self._queue.put_nowait(_Op(what, write, future))
        except asyncio.QueueFull:
            log.error("history storage is %d rows behind; dropped %s", self._queue.maxsize, what)
            if future is not None and not future.done():
                future.set_exception(StorageUnavailable("The history storage is overloaded; retry later."))

    async def flush(self) -> None:
        """Wait until every row queued so far is committed (or dropped)."""
        if self._writer is not None and not self._writer.done():
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

    async def _write(self, batch: Sequence[_Op]) -> None:
        """Commit ``batch``; a row the database refuses is dropped, a database that
        cannot write holds the batch back for the next try (and fails its futures:
        nobody is told a row is stored before it is)."""
        if not await self._ensure_ready():
            self._hold(batch, "the database does not answer")
            if (path := self._sqlite_file) is not None:  # a deleted data directory: make it again
                await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
            return
        assert self._engine is not None
        committed = False
        try:
            if (writer := self._sqlite_writer_engine()) is not None:
                loop = asyncio.get_running_loop()
                results = await loop.run_in_executor(self._writer_thread, self._commit_in_thread, writer, batch)
                committed = True
                self._committed(batch, results)
                return
            async with self._engine.connect() as conn:
                async with conn.begin():
                    results = [await op.write(conn) for op in batch]
                    await self._check_file()
                committed = True
                # answer the waiting cells now, not after the connection's return to the pool
                self._committed(batch, results)
        except Exception as exc:
            if not committed:
                await self._failed(batch, exc)
            else:
                log.exception("history storage: releasing a connection after a commit failed")

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
            await self._reopen()
        else:
            self._hold(batch, f"{type(exc).__name__}: {exc}")
            self._ready = await self._reachable()

    def _committed(self, batch: Sequence[_Op], results: Sequence[Any]) -> None:
        if self._health.succeeded():
            log.warning("history storage: writes succeed again (%d rows were held back)", len(batch))
        done = time.perf_counter()
        for op, result in zip(batch, results, strict=True):
            if len(self.write_latency_ms) < 100000:
                self.write_latency_ms.append((done - op.queued_at) * 1000)
            if op.future is not None and not op.future.done():
                op.future.set_result(result)

    def _hold(self, batch: Sequence[_Op], why: str) -> None:
        """Keep ``batch`` for a retry (bounded: past ``max_pending`` the oldest go) and report the fault."""
        if self._health.failed(why):
            log.error("history storage at %s cannot write: %s", self.display_url, why)
        for op in batch:
            if op.future is not None and not op.future.done():
                op.future.set_exception(StorageUnavailable(f"The history storage cannot write ({why}); retry later."))
        self._held = [*batch, *self._held]
        if len(self._held) > self._queue.maxsize:
            excess = len(self._held) - self._queue.maxsize
            self._drop(self._held[:excess], "too many rows held back by a storage fault")
            del self._held[:excess]

    async def _check_file(self) -> None:
        """Raise `DatabaseFileReplaced` when the SQLite path no longer names the opened file."""
        path, identity = self._sqlite_file, self._file_identity
        if path is not None and identity is not None:
            await asyncio.to_thread(identity.check, path)

    async def _reopen(self) -> None:
        """Open the database at its path again (a new file, with its tables, when it was deleted)."""
        if self._engine is not None:
            await self._engine.dispose()
        self._dispose_sqlite_writer()
        self._ready = False
        self._file_identity = None
        try:
            self._engine = self._create_engine()
        except OSError as exc:  # the directory cannot be made again (yet)
            log.error("history storage: cannot reopen %s: %s", self.display_url, exc)
            return
        await self._ensure_ready(force=True)

    async def _reachable(self) -> bool:
        assert self._engine is not None
        try:
            async with self._engine.connect() as conn:
                await conn.run_sync(lambda c: None)
            return True
        except Exception:
            return False

    @staticmethod
    def _drop(batch: Sequence[_Op], why: str) -> None:
        log.warning("history storage: dropped %d rows (%s)", len(batch), why)
        for op in batch:
            if op.future is not None and not op.future.done():
                op.future.set_exception(StorageUnavailable(f"The history storage failed: {why}."))

    # ------------------------------------------------------------ Recorder
    async def session_started(self, session: RecordedSession) -> None:
        values = {
            "id": session.id,
            "gateway_name": self.gateway_name,
            "image": session.spec.image,
            "created_at": _utc(session.created_at),
            "language_info": json.dumps(session.kernel_info.get("language_info") or {}),
            "owner": session.owner,
            **_kernel_values(session),
        }
        self._positions[session.id] = 0

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(insert(schema.sessions).values(**values))

        self.enqueue(f"session {session.id}", write)
        spec = session.spec
        self._audit(
            "session_created",
            session,
            detail=json.dumps(
                {"image": spec.image, "memory_mb": spec.memory_mb, "cpus": spec.cpus, "runtime": spec.runtime}
            ),
        )

    def _next_position(self, session_id: str) -> int:
        position = self._positions.get(session_id, 0)
        self._positions[session_id] = position + 1
        return position

    def execution_started(self, session: RecordedSession, execution: RecordedExecution) -> None:
        """Queue a ``running`` row (not awaited). A cell that ends before the row
        is written skips it: its end writes the whole row in one statement."""
        start = _StartRow(self._next_position(session.id))
        self._started[(session.id, execution.execution_id)] = start
        published = execution.published
        values = {
            "session_id": session.id,
            "position": start.position,
            "execution_id": execution.execution_id,
            "seq": published[0].seq if published else 0,
            "code": execution.code,
            "status": RUNNING,
            "execution_count": None,
            "started_at": _now(),
            "duration_ms": 0.0,
            "reason": None,
            "state_lost": False,
            "events": "[" + ",".join(p.json for p in published) + "]",
        }

        async def write(conn: AsyncConnection) -> None:
            if start.superseded:
                return
            await conn.execute(_INSERT_EXECUTION, values)
            start.inserted = True

        self.enqueue(f"start of execution {execution.execution_id} of session {session.id}", write)

    async def execution_finished(
        self, session: RecordedSession, execution: RecordedExecution, done: Published | None = None
    ) -> None:
        """Complete the execution's row and wait for the commit (batched with
        whatever else is queued); raises `StorageUnavailable` when it cannot be."""
        if done is not None:
            published = [*execution.published, done]
            end = done.event
        elif execution.done.done() and not execution.done.cancelled():
            published = list(execution.published)
            end = execution.done.result()
        else:  # not finished: nothing the history could show
            return
        assert isinstance(end, ev.Done)
        start = self._started.pop((session.id, execution.execution_id), None)
        if start is not None:
            start.superseded = True  # writes run in order: it is written before this one or never
        position = start.position if start is not None else self._next_position(session.id)
        duration = end.duration_ms
        final = {
            "status": end.status,
            "execution_count": end.execution_count,
            "duration_ms": duration,
            "reason": end.reason,
            "state_lost": end.state_lost,
            # already serialised when published: splice, do not re-encode
            "events": "[" + ",".join(p.json for p in published) + "]",
        }
        values = {
            "session_id": session.id,
            "position": position,
            "execution_id": execution.execution_id,
            "seq": published[0].seq if published else 0,
            "code": execution.code,
            "started_at": _now() - timedelta(milliseconds=duration),
            **final,
        }

        async def write(conn: AsyncConnection) -> None:
            if start is not None and start.inserted:
                keys = {"k_session": session.id, "k_position": position, "k_execution": values["execution_id"]}
                result = await conn.execute(_END_EXECUTION, {**final, **keys})
                if result.rowcount:
                    return
            # no start row: the cell ended before it was written (or it was rolled back)
            await conn.execute(_INSERT_EXECUTION, values)

        if self._writer is None or self._writer.done():
            raise StorageUnavailable("The history storage is not running.")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.enqueue(f"execution {execution.execution_id} of session {session.id}", write, future)
        try:
            await future
        finally:  # the audit row after: it is not part of what the answer waits for
            error = next((p.event for p in published if isinstance(p.event, ev.Error)), None)
            self._audit(
                "execution",
                session,
                execution_id=execution.execution_id,
                code=execution.code,
                code_sha256=audit.code_sha256(execution.code),
                duration_ms=duration,
                status=end.status,
                output_bytes=execution.output_bytes,
                error_name=error.ename[:255] if error is not None else None,
                detail=end.reason,
            )

    async def session_ended(self, session: RecordedSession, reason: str) -> None:
        self._positions.pop(session.id, None)
        ended_at = _now()

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(
                update(schema.sessions)
                .where(schema.sessions.c.id == session.id)
                .values(ended_at=ended_at, end_reason=reason)
            )

        self.enqueue(f"end of session {session.id}", write)
        kind = {"deleted": "session_deleted", "reaped": "session_reaped"}.get(reason, "session_ended")
        self._audit(kind, session, detail=reason)

    def kernel_changed(self, session: RecordedSession) -> None:
        values = _kernel_values(session)

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(update(schema.sessions).where(schema.sessions.c.id == session.id).values(**values))

        self.enqueue(f"kernel of session {session.id}", write)

    async def open_sessions(self) -> list[StoredSession]:
        """Open sessions of this gateway name with a kernel to reach; those stored
        without one (by a release before reattachment) are ended here."""
        engine = await self.read_engine()
        s = schema.sessions
        async with engine.begin() as conn:
            await conn.execute(
                update(s)
                .where(s.c.gateway_name == self.gateway_name, s.c.ended_at.is_(None), s.c.kernel.is_(None))
                .values(ended_at=_now(), end_reason=CRASHED_REASON)
            )
            rows = (
                await conn.execute(select(s).where(s.c.gateway_name == self.gateway_name, s.c.ended_at.is_(None)))
            ).all()
        stored: list[StoredSession] = []
        for row in rows:
            try:
                stored.append(_stored_session(row))
            except (ValueError, KeyError, TypeError) as exc:
                log.error("session %s: its stored kernel is unreadable (%s); ending it", row.id, exc)
                await self.session_lost(row.id, f"the stored kernel connection was unreadable: {exc}")
        return stored

    async def session_lost(self, session_id: str, reason: str) -> None:
        ended_at = _now()

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(
                update(schema.sessions)
                .where(schema.sessions.c.id == session_id)
                .values(ended_at=ended_at, end_reason=reason)
            )

        self.enqueue(f"end of session {session_id}", write)
        audit.record(self, audit.AuditRecord(at=ended_at, kind="session_ended", session_id=session_id, detail=reason))

    def session_event(self, session: RecordedSession, kind: str, detail: str) -> None:
        """A kernel died or was restarted (audit only)."""
        self._audit(kind, session, detail=detail)

    def _audit(self, kind: str, session: RecordedSession, **values: Any) -> None:
        audit.record(
            self, audit.AuditRecord(at=_now(), kind=kind, key_id=session.owner, session_id=session.id, **values)
        )

    # ------------------------------------------------------------ notes
    async def add_note(self, session_id: str, after_seq: int, markdown: str) -> NoteRecord:
        """A Markdown note after everything the session queued so far."""
        note = NoteRecord(session_id=session_id, after_seq=after_seq, markdown=markdown, created_at=_now())

        async def write(conn: AsyncConnection) -> NoteRecord:
            await conn.execute(
                insert(schema.notes).values(
                    session_id=session_id, after_seq=after_seq, markdown=markdown, created_at=note.created_at
                )
            )
            return note

        future: asyncio.Future[NoteRecord] = asyncio.get_running_loop().create_future()
        self.enqueue(f"note for session {session_id}", write, future)
        return await future

    # ------------------------------------------------------------ queries
    async def read_engine(self) -> AsyncEngine:
        """The engine, after every queued write is committed: readers see their own writes."""
        await self.flush()
        if self._held:
            raise StorageUnavailable(f"The history storage {self._health.describe()}; retry later.")
        if not await self._ensure_ready() or self._engine is None:
            raise StorageUnavailable("The history storage is unavailable (the database does not answer); retry later.")
        return self._engine

    async def get_session(self, session_id: str) -> SessionRecord | None:
        engine = await self.read_engine()
        async with engine.connect() as conn:
            row = (await conn.execute(select(schema.sessions).where(schema.sessions.c.id == session_id))).first()
        if row is None:
            return None
        return SessionRecord(
            id=row.id,
            gateway_name=row.gateway_name,
            image=row.image,
            created_at=_utc(row.created_at) or _now(),
            ended_at=_utc(row.ended_at),
            end_reason=row.end_reason,
            language_info=json.loads(row.language_info or "{}"),
            owner=row.owner,
        )

    async def list_executions(self, session_id: str) -> list[ExecutionRecord]:
        engine = await self.read_engine()
        t = schema.executions
        async with engine.connect() as conn:
            rows = (
                await conn.execute(select(t).where(t.c.session_id == session_id).order_by(t.c.position, t.c.id))
            ).all()
        return [
            ExecutionRecord(
                session_id=row.session_id,
                position=row.position,
                execution_id=row.execution_id,
                seq=row.seq,
                code=row.code,
                status=row.status,
                execution_count=row.execution_count,
                started_at=_utc(row.started_at) or _now(),
                duration_ms=row.duration_ms,
                reason=row.reason,
                state_lost=bool(row.state_lost),
                events_json=row.events,
            )
            for row in rows
        ]

    async def list_notes(self, session_id: str) -> list[NoteRecord]:
        engine = await self.read_engine()
        t = schema.notes
        async with engine.connect() as conn:
            rows = (
                await conn.execute(select(t).where(t.c.session_id == session_id).order_by(t.c.after_seq, t.c.id))
            ).all()
        return [
            NoteRecord(
                session_id=row.session_id,
                after_seq=row.after_seq,
                markdown=row.markdown,
                created_at=_utc(row.created_at) or _now(),
            )
            for row in rows
        ]

    # ------------------------------------------------------------ retention
    async def purge(self, now: datetime | None = None) -> int:
        """Delete sessions that ended more than ``retention_days`` ago, with their
        executions and notes; returns how many sessions went."""
        engine = await self.read_engine()
        cutoff = (now or _now()) - timedelta(days=self.retention_days)
        s = schema.sessions
        purged = 0
        while True:
            async with engine.begin() as conn:
                ids = (
                    (
                        await conn.execute(
                            select(s.c.id).where(s.c.ended_at.is_not(None), s.c.ended_at < cutoff).limit(500)
                        )
                    )
                    .scalars()
                    .all()
                )
                if not ids:
                    break
                await conn.execute(delete(schema.executions).where(schema.executions.c.session_id.in_(ids)))
                await conn.execute(delete(schema.notes).where(schema.notes.c.session_id.in_(ids)))
                await conn.execute(delete(s).where(s.c.id.in_(ids)))
            purged += len(ids)
        async with engine.begin() as conn:
            audit_cutoff = (now or _now()) - timedelta(days=self.audit_retention_days)
            await conn.execute(delete(schema.audit).where(schema.audit.c.at < audit_cutoff))
        if purged:
            log.info("history storage: purged %d sessions older than %g days", purged, self.retention_days)
        return purged

    async def _end_cut_off_executions(self) -> None:
        """Rows still ``running`` in this gateway name's open sessions belong to
        cells a gateway death cut off (a live gateway ends every cell it runs):
        mark them dead so history and notebook export show them."""
        assert self._engine is not None
        e, s = schema.executions, schema.sessions
        open_sessions = select(s.c.id).where(s.c.gateway_name == self.gateway_name, s.c.ended_at.is_(None))
        async with self._engine.begin() as conn:
            result = await conn.execute(
                update(e)
                .where(e.c.status == RUNNING, e.c.session_id.in_(open_sessions))
                .values(status="dead", reason=CUT_OFF_REASON)
            )
        if result.rowcount:
            log.warning("history storage: %d cells were cut off by a gateway stop; marked dead", result.rowcount)

    async def _purge_loop(self) -> None:
        while True:
            await asyncio.sleep(self.purge_interval_s)
            try:
                await self.purge()
            except Exception:
                log.exception("history storage: purging old history failed")


def _kernel_values(session: RecordedSession) -> dict[str, Any]:
    """The session row's columns a restarted gateway reattaches from (the
    connection dict holds the kernel's HMAC key)."""
    handle = session.handle
    if handle is None:
        return {}
    kernel = {
        "kernel_id": handle.kernel_id,
        "conn_dir": str(handle.conn_dir),
        "connection": handle.connection,
        "spec": dataclasses.asdict(session.spec),
        "exec_timeout_s": session.config.exec_timeout_s,
    }
    return {
        "container_id": handle.container_id,
        "kernel": json.dumps(kernel),
        "execution_count": session.execution_count,
        "last_seq": session.last_seq,
    }


def _stored_session(row: Any) -> StoredSession:
    kernel = json.loads(row.kernel)
    spec = KernelSpec(**kernel["spec"])
    handle = KernelHandle(
        kernel_id=kernel["kernel_id"],
        session_id=row.id,
        container_id=row.container_id,
        conn_dir=Path(kernel["conn_dir"]),
        connection=dict(kernel["connection"]),
    )
    return StoredSession(
        session_id=row.id,
        owner=row.owner,
        created_at=_utc(row.created_at) or _now(),
        handle=handle,
        spec=spec,
        exec_timeout_s=float(kernel["exec_timeout_s"]),
        execution_count=row.execution_count or 0,
        last_seq=row.last_seq or 0,
    )
