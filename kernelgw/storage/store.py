"""`Store`: the `Recorder` the session manager calls, plus the history queries.

Writes never sit on a session's path. The recorder methods only queue a row
(no await, so the row is queued before the client that awaited ``done`` can
ask for the notebook); one writer task commits queued rows in order, in
batches, over an async driver (aiosqlite, asyncpg), so the event loop is never
blocked either. Queries first wait for the queue to drain (`flush`), so a
client always reads its own writes.

A database that fails or is down never breaks a session: the failed rows are
logged and dropped, the writer tries to reconnect and create the tables again
later, and history queries answer ``StorageUnavailable`` (503) meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, event, insert, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from kernelgw import events as ev
from kernelgw.errors import StorageUnavailable
from kernelgw.storage import audit, schema
from kernelgw.storage.records import ExecutionRecord, NoteRecord, SessionRecord, as_utc
from kernelgw.tasks import cancel_and_wait

if TYPE_CHECKING:
    from kernelgw.config import Settings
    from kernelgw.runtime.recorder import RecordedExecution, RecordedSession

log = logging.getLogger(__name__)

DB_FILE = "kernelgw.db"
_ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg"}
CRASHED_REASON = "the gateway stopped without ending the session"
BATCH = 200
"""Most rows committed in one transaction."""
RECONNECT_INTERVAL_S = 5.0
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

    ``start`` (in the app's lifespan) connects, creates the tables, marks the
    sessions a crashed predecessor of the same ``gateway_name`` left open as
    ended, purges history older than the retention and starts the writer.
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
    ) -> None:
        self.url = async_database_url(url)
        self.gateway_name = gateway_name
        self.retention_days = retention_days
        self.audit_retention_days = audit_retention_days
        self.purge_interval_s = purge_interval_s
        self._queue: asyncio.Queue[_Op] = asyncio.Queue(max_pending)
        self._engine: AsyncEngine | None = None
        self._ready = False
        self._last_attempt = 0.0
        self._positions: dict[str, int] = {}
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
                await self._close_abandoned_sessions()
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
        self._ready = False

    def _create_engine(self) -> AsyncEngine:
        url = make_url(self.url)
        if url.get_backend_name() == "sqlite":
            if url.database and url.database != ":memory:":
                Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            engine = create_async_engine(url, connect_args={"timeout": 30})

            @event.listens_for(engine.sync_engine, "connect")
            def _pragmas(dbapi_connection: Any, _record: Any) -> None:
                # WAL: readers (exports) do not wait for the writer, nor it for them.
                cursor = dbapi_connection.cursor()
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=NORMAL")
                cursor.execute("PRAGMA busy_timeout=30000")
                cursor.close()

            return engine
        return create_async_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=5, connect_args={"timeout": 10})

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
            await self._queue.join()

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except asyncio.QueueEmpty:
                    break
            try:
                await self._write(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _write(self, batch: Sequence[_Op]) -> None:
        if not await self._ensure_ready():
            self._drop(batch, "the database is unavailable")
            return
        assert self._engine is not None
        try:
            async with self._engine.begin() as conn:
                results = [await op.write(conn) for op in batch]
        except Exception:
            if len(batch) > 1:  # find the bad row; keep the others
                for op in batch:
                    await self._write([op])
                return
            log.exception("history storage: writing %s failed", batch[0].what)
            self._ready = await self._reachable()
            self._drop(batch, "writing failed")
            return
        done = time.perf_counter()
        for op, result in zip(batch, results, strict=True):
            if len(self.write_latency_ms) < 100000:
                self.write_latency_ms.append((done - op.queued_at) * 1000)
            if op.future is not None and not op.future.done():
                op.future.set_result(result)

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

    async def execution_finished(self, session: RecordedSession, execution: RecordedExecution) -> None:
        done = execution.done.result() if execution.done.done() and not execution.done.cancelled() else None
        if done is None:  # not finished: nothing the history could show
            return
        position = self._positions.get(session.id, 0)
        self._positions[session.id] = position + 1
        published = execution.published
        duration = done.duration_ms
        values = {
            "session_id": session.id,
            "position": position,
            "execution_id": execution.execution_id,
            "seq": published[0].seq if published else 0,
            "code": execution.code,
            "status": done.status,
            "execution_count": done.execution_count,
            "started_at": _now() - timedelta(milliseconds=duration),
            "duration_ms": duration,
            "reason": done.reason,
            "state_lost": done.state_lost,
            # already serialised when published: splice, do not re-encode
            "events": "[" + ",".join(p.json for p in published) + "]",
        }

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(insert(schema.executions).values(**values))

        self.enqueue(f"execution {execution.execution_id} of session {session.id}", write)
        error = next((p.event for p in published if isinstance(p.event, ev.Error)), None)
        self._audit(
            "execution",
            session,
            execution_id=execution.execution_id,
            code=execution.code,
            code_sha256=audit.code_sha256(execution.code),
            duration_ms=duration,
            status=done.status,
            output_bytes=execution.output_bytes,
            error_name=error.ename[:255] if error is not None else None,
            detail=done.reason,
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

    async def _purge_loop(self) -> None:
        while True:
            await asyncio.sleep(self.purge_interval_s)
            try:
                await self.purge()
            except Exception:
                log.exception("history storage: purging old history failed")

    async def _close_abandoned_sessions(self) -> None:
        """Sessions of this gateway name still open belonged to a predecessor that
        crashed: their containers are reaped at start, so they are over."""
        assert self._engine is not None
        s = schema.sessions
        async with self._engine.begin() as conn:
            await conn.execute(
                update(s)
                .where(s.c.gateway_name == self.gateway_name, s.c.ended_at.is_(None))
                .values(ended_at=_now(), end_reason=CRASHED_REASON)
            )
