"""`Store`: the `Recorder` the session manager calls, plus the history queries.

The recorder methods queue rows for the writer (`kernelgw.storage.writer`),
which commits them in order, in batches, off the event loop. Only a cell's end
is waited for (acknowledged means stored: its ``done`` is published after the
commit, or, for a small cell on SQLite, after its row is in the answer journal,
`kernelgw.storage.journal`). Queries first wait for the queue to drain
(`flush`), so a client reads its own writes.

A database that fails or is down never breaks a session: the failed rows are
held back and retried, the store sets the database up again later
(`kernelgw.storage.database`), and history queries answer
``StorageUnavailable`` (503) meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.engine import make_url

from kernelgw import events as ev
from kernelgw.errors import StorageUnavailable
from kernelgw.events import EVENT_LIST_ADAPTER
from kernelgw.runtime.recorder import TAIL_BYTES, StoredCell, StoredSession
from kernelgw.storage import audit, queries, schema
from kernelgw.storage.cleanup import Cleanup
from kernelgw.storage.database import Database
from kernelgw.storage.engine import DB_FILE, async_database_url, database_url_for
from kernelgw.storage.health import WriteHealth
from kernelgw.storage.journal import MAX_RECORD_BYTES, Journal
from kernelgw.storage.kernels import (
    CRASHED_REASON,
    kernel_values,
    lease_values,
    open_session_rows,
    stored_session,
    terms_values,
)
from kernelgw.storage.records import ExecutionRecord, NoteRecord, SessionRecord, as_utc
from kernelgw.storage.retention import CUT_OFF_REASON, RUNNING
from kernelgw.storage.thread_engine import StoreEngine
from kernelgw.storage.writer import Write, Writer

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from kernelgw.config import Settings
    from kernelgw.runtime.fanout import Published
    from kernelgw.runtime.recorder import RecordedExecution, RecordedSession

__all__ = [
    "CRASHED_REASON",
    "CUT_OFF_REASON",
    "DB_FILE",
    "RUNNING",
    "Store",
    "async_database_url",
    "database_url_for",
]

log = logging.getLogger(__name__)


def _utc(value: datetime | None) -> datetime | None:
    return as_utc(value) if value is not None else None


def _now() -> datetime:
    return datetime.now(UTC)


def _client_values(execution: RecordedExecution) -> dict[str, Any]:
    """A Jupyter client's cell: who sent it and with which header (what its
    return after a restart is sent again)."""
    origin = execution.origin
    if origin is None:
        return {"client_session": None, "client_header": None}
    return {"client_session": origin.session[:255], "client_header": json.dumps(origin.header, default=str)}


def _replay_values(execution: RecordedExecution) -> dict[str, Any]:
    """An execution row's columns for recovery by replay (its kernel and lineage)."""
    return {
        "kernel_id": execution.kernel_id,
        "replay_of": execution.replay_of,
        "no_replay": True if not execution.replayable else None,
    }


# Constant statements (parameters passed apart) are compiled once: building and
# compiling `insert(...).values(...)` per row cost more than the SQLite write.
_INSERT_EXECUTION = insert(schema.executions)
_CHECKPOINT_EXECUTION = (
    update(schema.executions)
    .where(
        schema.executions.c.session_id == bindparam("k_session"),
        schema.executions.c.position == bindparam("k_position"),
        schema.executions.c.execution_id == bindparam("k_execution"),
        schema.executions.c.status == RUNNING,
    )
    .values(events=bindparam("events"))
)
_END_EXECUTION = (
    update(schema.executions)
    .where(
        schema.executions.c.session_id == bindparam("k_session"),
        schema.executions.c.position == bindparam("k_position"),
        schema.executions.c.execution_id == bindparam("k_execution"),
    )
    .values(
        {
            c: bindparam(c)
            for c in (
                "status",
                "execution_count",
                "duration_ms",
                "reason",
                "state_lost",
                "events",
                "kernel_id",
                "client_answered",
            )
        }
    )
)


_INSERT_CHUNK = insert(schema.execution_chunks)
LATE_AUDIT_KIND = "execution_late_output"
LATE_ERROR = (
    "an error came after this execution had ended (its kernel ended it early, which only "
    "code that forges the kernel's messages does): see its late events"
)


def _late_reason(status: str, reason: str | None) -> str:
    """The reason of a cell whose error came after its end (its status was ``status``)."""
    note = f"{LATE_ERROR}; it had ended {status}"
    return f"{note}: {reason}" if reason else note


@dataclass
class _StartRow:
    """A cell's ``running`` row: written by the writer unless its end came first."""

    position: int
    seq: int
    """The ``seq`` of the cell's ``queued`` event (its first: it may be released)."""
    superseded: bool = False
    """Set on the event loop when the end is queued."""
    inserted: bool = False
    """Set by the writer when the row was written (the end then updates it)."""
    parts: int = 0
    """Output chunks queued for the cell."""
    uncommitted: int = 0
    """Of them, those not committed yet: the cell's end is queued behind them."""
    written: int = 0
    """Of them, those the writer wrote (in its thread)."""
    tail: tuple[int, list[Published]] = (0, [])
    """The latest events after its chunks, for the row's next rewrite, with how
    many chunks were queued before them (set at once: read in the writer's thread)."""
    tail_queued: bool = False
    """A rewrite of the row's tail is queued: a later one would only repeat it."""


class Store:
    """History storage on SQLite or PostgreSQL; implements `kernelgw.runtime.recorder.Recorder`.

    ``start`` (in the app's lifespan) connects, upgrades the schema to the head
    revision (`kernelgw.storage.migrate`), cleans up after its predecessor,
    starts the writer, and then purges history older than the retention now
    and then (`kernelgw.storage.cleanup`). The sessions a predecessor of the same
    ``gateway_name`` left open are the manager's to reattach or end
    (``open_sessions``, ``session_lost``).
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
        self._positions: dict[str, int] = {}
        self._db = Database(self.url, durability)
        self._writer = Writer(self._db, max_pending)
        self._cleanup = Cleanup(
            self._db,
            gateway_name,
            durability=durability,
            retention_days=retention_days,
            audit_retention_days=audit_retention_days,
            purge_interval_s=purge_interval_s,
        )
        self._journal: Journal | None = None
        """Small cells' end rows answered before their commit (`kernelgw.storage.journal`)."""

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
    def retention_days(self) -> float:
        """How long ended sessions' history is kept (settable: the next purge uses it)."""
        return self._cleanup.retention_days

    @retention_days.setter
    def retention_days(self, days: float) -> None:
        self._cleanup.retention_days = days

    @property
    def audit_retention_days(self) -> float:
        """How long audit rows are kept (settable: the next purge uses it)."""
        return self._cleanup.audit_retention_days

    @audit_retention_days.setter
    def audit_retention_days(self, days: float) -> None:
        self._cleanup.audit_retention_days = days

    @property
    def dialect(self) -> str:
        return make_url(self.url).get_backend_name()

    @property
    def display_url(self) -> str:
        return self._db.display_url

    @property
    def available(self) -> bool:
        return self._db.ready

    @property
    def health(self) -> WriteHealth:
        """Whether the writer's latest commit worked (a fault refuses new work with 503)."""
        return self._writer.health

    @property
    def write_latency_ms(self) -> list[float]:
        """Queue-to-commit time of recent rows (kept for measurements, bounded)."""
        return self._writer.write_latency_ms

    # ------------------------------------------------------------ lifecycle
    async def start(self, background: bool = True) -> None:
        """``background=False`` (the CLI): connect and upgrade the schema only; no
        writer, no purge, no clean-up of a running gateway's sessions."""
        self._db.open()
        if not background:
            if not await self._db.ensure_ready(force=True):
                raise StorageUnavailable(f"The database at {self.display_url} is unavailable: {self._db.last_error}")
            return
        if await self._db.ensure_ready(force=True):
            await self._cleanup.after_predecessor()
        if (directory := self._cleanup.journal_directory()) is not None:
            self._journal = Journal(directory, self.gateway_name)
        self._writer.start()
        self._cleanup.start_purging(self.purge)

    async def close(self) -> None:
        await self._writer.close()
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        await self._cleanup.stop_purging()
        await self._db.close()

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
        ``deferrable``, ``size``, ``committed``: see `Writer.enqueue`."""
        self._writer.enqueue(what, write, future, deferrable=deferrable, size=size, committed=committed)

    async def flush(self) -> None:
        """Wait until every row queued so far is committed (or dropped)."""
        await self._writer.flush()

    async def answers(self) -> bool:
        """The database answers a connection (`Database.answers`, for readiness)."""
        return await self._db.answers()

    # ------------------------------------------------------------ Recorder
    async def session_started(self, session: RecordedSession) -> None:
        values = {
            "id": session.id,
            "gateway_name": self.gateway_name,
            "image": session.spec.image,
            "created_at": _utc(session.created_at),
            "language_info": json.dumps(session.kernel_info.get("language_info") or {}),
            "owner": session.owner,
            "kernel_name": session.spec.kernel,
            **kernel_values(session),
            **terms_values(session),
        }
        self._positions[session.id] = 0

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(insert(schema.sessions).values(**values))

        # a session is acknowledged (201) once its row is stored, as a cell is
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.enqueue(f"session {session.id}", write, future)
        await future
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
        published = execution.published
        start = _StartRow(self._next_position(session.id), published[0].seq if published else 0)
        self._started[(session.id, execution.execution_id)] = start
        values = {
            "session_id": session.id,
            "position": start.position,
            "execution_id": execution.execution_id,
            "seq": start.seq,
            "code": execution.code,
            "status": RUNNING,
            "execution_count": None,
            "started_at": _now(),
            "duration_ms": 0.0,
            "reason": None,
            "state_lost": False,
            "events": ev.json_array(p.json for p in published),
            **_replay_values(execution),
            **_client_values(execution),
        }

        async def write(conn: AsyncConnection) -> None:
            if start.superseded:
                return
            await conn.execute(_INSERT_EXECUTION, values)
            start.inserted = True

        self.enqueue(f"start of execution {execution.execution_id} of session {session.id}", write, deferrable=True)

    def execution_progress(self, session: RecordedSession, execution: RecordedExecution) -> None:
        """Queue the running cell's events not yet stored (not awaited): what a
        cell cut off by a gateway crash keeps. From `TAIL_BYTES` of them on they
        go as the cell's next output chunk, appended, never rewritten; fewer
        rewrite the running row's tail. Skipped when the cell has no start row."""
        start = self._started.get((session.id, execution.execution_id))
        if start is None:
            return
        tail = execution.published[execution.stored_events :]
        if not tail:
            return
        keys = {"k_session": session.id, "k_position": start.position, "k_execution": execution.execution_id}
        size = sum(len(p.json) for p in tail)
        if size < TAIL_BYTES:
            start.tail = (start.parts, list(tail))
            if start.tail_queued:  # the queued rewrite writes this newer tail
                return
            start.tail_queued = True

            async def rewrite(conn: AsyncConnection) -> None:
                # the latest tail when written; one that follows a chunk not yet
                # written is left to that chunk's write (no event twice, none out of order)
                start.tail_queued = False
                parts, events = start.tail
                if start.inserted and not start.superseded and parts == start.written:
                    text = ev.json_array([p.json for p in events])  # joined in the writer's thread
                    await conn.execute(_CHECKPOINT_EXECUTION, {**keys, "events": text})

            self.enqueue(
                f"output so far of execution {execution.execution_id} of session {session.id}",
                rewrite,
                deferrable=True,
                size=size,
            )
            return
        first, chunk = execution.take_chunk()
        part = start.parts
        start.parts += 1
        start.uncommitted += 1
        values = {
            "session_id": session.id,
            "execution_id": execution.execution_id,
            "position": start.position,
            "part": part,
        }

        async def append(conn: AsyncConnection) -> None:
            events = ev.json_array([p.json for p in chunk])
            await conn.execute(_INSERT_CHUNK, {**values, "events": events, "bytes": len(events)})
            start.written = part + 1
            if start.inserted and not start.superseded:  # the row keeps only what follows its chunks
                parts, after = start.tail
                text = ev.json_array([p.json for p in after]) if parts == start.written else "[]"
                await conn.execute(_CHECKPOINT_EXECUTION, {**keys, "events": text})

        def committed() -> None:
            start.uncommitted -= 1
            execution.release(first, len(chunk))

        self.enqueue(
            f"output chunk {part} of execution {execution.execution_id} of session {session.id}",
            append,
            deferrable=True,
            size=size,
            committed=committed,
        )

    async def execution_finished(
        self, session: RecordedSession, execution: RecordedExecution, done: Published | None = None
    ) -> None:
        """Complete the execution's row and wait for the commit (batched with
        whatever else is queued); raises `StorageUnavailable` when it cannot be."""
        # the events after its output chunks: the row's own
        if done is not None:
            published = [*execution.published[execution.stored_events :], done]
            end = done.event
        elif execution.done.done() and not execution.done.cancelled():
            published = list(execution.published[execution.stored_events :])
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
            "kernel_id": execution.kernel_id,  # known once the cell was sent, after its start row
            "client_answered": origin.answered if (origin := execution.origin) is not None else None,
        }
        values = {
            "session_id": session.id,
            "position": position,
            "execution_id": execution.execution_id,
            "seq": start.seq if start is not None else published[0].seq if published else 0,
            "code": execution.code,
            "started_at": _now() - timedelta(milliseconds=duration),
            **_replay_values(execution),
            **_client_values(execution),
            **final,
        }

        size = sum(len(p.json) for p in published)
        deferrable = start is not None and start.uncommitted > 0
        # behind output chunks still queued, it is committed after them, and not
        # answered before (the journal holds the row, not the chunks)
        journal = self._journal if not deferrable and self._writer.answers_may_journal else None
        spliced: str | None = None
        release: Callable[[], None] | None = None
        if journal is not None and size < MAX_RECORD_BYTES:  # a larger row is not spliced on the loop for nothing
            spliced = ev.json_array(p.json for p in published)
            release = journal.append(values, spliced)

        async def write(conn: AsyncConnection) -> None:
            # already serialised when published: spliced (in the writer's thread,
            # not on the event loop), not re-encoded
            events = spliced if spliced is not None else ev.json_array(p.json for p in published)
            if start is not None and start.inserted:
                keys = {"k_session": session.id, "k_position": position, "k_execution": values["execution_id"]}
                result = await conn.execute(_END_EXECUTION, {**final, "events": events, **keys})
                if result.rowcount:
                    return
            # no start row: the cell ended before it was written (or it was rolled back)
            await conn.execute(_INSERT_EXECUTION, {**values, "events": events})

        if not self._writer.running:
            raise StorageUnavailable("The history storage is not running.")
        what = f"execution {execution.execution_id} of session {session.id}"
        if release is not None:  # in the journal: stored; committed with the writer's next batch
            self.enqueue(what, write, size=size, committed=release)
            future: asyncio.Future[None] | None = None
        else:
            future = asyncio.get_running_loop().create_future()
            self.enqueue(what, write, future, deferrable=deferrable, size=size)
        try:
            if future is not None:
                await future
        finally:  # the audit row after: it is not part of what the answer waits for
            error = execution.last_error  # its latest, also one in a chunk already let go
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

    async def execution_late(
        self, session: RecordedSession, execution_id: str, events: Sequence[Published], part: int, error: bool
    ) -> None:
        """Append late output to an ended execution's record as a chunk after its row's
        events (`queries.LATE_PART`), turn its status to ``error`` when ``error``,
        and wait for the commit; then an audit row says what came late."""
        text = ev.json_array(p.json for p in events)
        t = schema.executions
        found = (
            select(t.c.position, t.c.status, t.c.reason)
            .where(t.c.session_id == session.id, t.c.execution_id == execution_id)
            .order_by(t.c.position.desc())
            .limit(1)
        )

        async def write(conn: AsyncConnection) -> None:
            row = (await conn.execute(found)).first()
            if row is None:  # never stored (its record failed): nothing to append to
                log.warning("session %s: late output of %s has no record to join", session.id, execution_id)
                return
            values = {"session_id": session.id, "execution_id": execution_id, "position": row.position}
            await conn.execute(
                _INSERT_CHUNK, {**values, "part": queries.LATE_PART + part, "events": text, "bytes": len(text)}
            )
            if error and row.status not in ("error", RUNNING):
                await conn.execute(
                    update(t)
                    .where(t.c.session_id == session.id, t.c.position == row.position, t.c.execution_id == execution_id)
                    .values(status="error", reason=_late_reason(row.status, row.reason))
                )

        if not self._writer.running:
            raise StorageUnavailable("The history storage is not running.")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # deferrable, though awaited: behind every row queued before it, also the
        # cell's end answered from the journal (an answer's row would jump ahead of it)
        what = f"late output of execution {execution_id} of session {session.id}"
        self.enqueue(what, write, future, deferrable=True, size=len(text))
        await future
        errors = [p.event.event for p in events if isinstance(p.event, ev.Late) and isinstance(p.event.event, ev.Error)]
        self._audit(
            LATE_AUDIT_KIND,
            session,
            execution_id=execution_id,
            status="error" if error else None,
            output_bytes=len(text),
            error_name=errors[-1].ename[:255] if errors else None,
            detail=f"{len(events)} events the kernel sent after the execution's end, appended to its record",
        )

    async def execution_followed(
        self, session: RecordedSession, execution_id: str, done: ev.Done, interim_reason: str
    ) -> None:
        """Replace the interim end of a cell a previous gateway left running (its
        row ``dead`` with ``interim_reason``; a row completed already is left) by
        how it really ended, and wait for the commit: behind its late output
        queued before (deferrable, like that)."""
        t = schema.executions
        found = (
            select(t.c.position)
            .where(
                t.c.session_id == session.id,
                t.c.execution_id == execution_id,
                t.c.status == "dead",
                t.c.reason == interim_reason,
            )
            .order_by(t.c.position.desc())
            .limit(1)
        )
        final = {
            "status": done.status,
            "execution_count": done.execution_count,
            "duration_ms": done.duration_ms,
            "reason": done.reason,
            "state_lost": done.state_lost,
        }

        async def write(conn: AsyncConnection) -> None:
            row = (await conn.execute(found)).first()
            if row is None:
                log.warning(
                    "session %s: followed execution %s has no interim record to complete", session.id, execution_id
                )
                return
            where = (t.c.session_id == session.id) & (t.c.position == row.position) & (t.c.execution_id == execution_id)
            await conn.execute(update(t).where(where).values(**final))

        if not self._writer.running:
            raise StorageUnavailable("The history storage is not running.")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.enqueue(
            f"end of followed execution {execution_id} of session {session.id}", write, future, deferrable=True
        )
        await future

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
        values = kernel_values(session)

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(update(schema.sessions).where(schema.sessions.c.id == session.id).values(**values))

        self.enqueue(f"kernel of session {session.id}", write)
        self._queue_lease(session)  # a pause stops the lease

    async def lease_changed(self, session: RecordedSession) -> None:
        """Store the session's lease and wait for the commit: a lease acknowledged
        is one a restarted gateway enforces."""
        if not self._writer.running:
            raise StorageUnavailable("The history storage is not running.")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue_lease(session, future)
        await future

    def _queue_lease(self, session: RecordedSession, future: asyncio.Future[None] | None = None) -> None:
        """Queue the lease as it is now. Every lease write is deferrable, so they
        commit in the order they were queued: an awaited one (an answer) would
        otherwise commit ahead of the lease a resume queued just before, without
        a lease, and be overwritten by it."""
        values = lease_values(session)

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(update(schema.sessions).where(schema.sessions.c.id == session.id).values(**values))

        self.enqueue(f"lease of session {session.id}", write, future, deferrable=True)

    async def open_sessions(self, replay_bytes: int = 0) -> list[StoredSession]:
        """Open sessions of this gateway name with a kernel to reach, each with its
        latest cells (up to ``replay_bytes`` of events) to refill its replay
        buffer; those stored without a kernel (by a release before reattachment)
        are ended here."""
        engine = await self.read_engine()
        async with engine.begin() as conn:
            rows = await open_session_rows(conn, self.gateway_name)
        sessions: list[StoredSession] = []
        for row in rows:
            try:
                sessions.append(stored_session(row))
            except (ValueError, KeyError, TypeError) as exc:
                log.error("session %s: its stored kernel is unreadable (%s); ending it", row.id, exc)
                await self.session_lost(row.id, f"the stored kernel connection was unreadable: {exc}")
        reads = await queries.reattach_reads(
            engine, {s.session_id: s.lineage_kernels or (s.handle.kernel_id,) for s in sessions}, replay_bytes
        )
        stored: list[StoredSession] = []
        for session in sessions:
            read = reads[session.session_id]
            cells: list[StoredCell] = []
            for execution_id, events in read.latest:
                try:
                    # pydantic's JSON parser refuses lone surrogates (escaped or
                    # raw), so the events' walk of every string for them is skipped:
                    # a third of a restart's open_sessions
                    parsed = EVENT_LIST_ADAPTER.validate_json(events, context=ev.TEXT_CHECKED)
                except ValueError:
                    log.warning("session %s: stored events of %s are unreadable", session.session_id, execution_id)
                    parsed = []
                cut_off = (session.session_id, execution_id) in self._cleanup.cut_off
                cells.append(StoredCell(execution_id=execution_id, events=parsed, cut_off=cut_off))
            stored.append(dataclasses.replace(session, cells=cells, lineage=read.lineage))
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

    def child_execution(
        self, parent: RecordedSession, child_id: str, execution: RecordedExecution, end: ev.Done
    ) -> None:
        """A cell of one of ``parent``'s children (an E2B context, not stored as a
        session: `kernelgw.runtime.child_audit`): audited as the parent's, the
        context named in the detail (audit only; never waits)."""
        error = execution.last_error
        self._audit(
            "execution",
            parent,
            execution_id=execution.execution_id,
            code=execution.code,
            code_sha256=audit.code_sha256(execution.code),
            duration_ms=end.duration_ms,
            status=end.status,
            output_bytes=execution.output_bytes,
            error_name=error.ename[:255] if error is not None else None,
            detail=f"context {child_id}" + (f": {end.reason}" if end.reason else ""),
        )

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
    async def read_engine(self) -> StoreEngine:
        """The engine, after every queued write is committed: readers see their own writes."""
        await self.flush()
        if self._writer.holding:
            raise StorageUnavailable(f"The history storage {self.health.describe()}; retry later.")
        if not await self._db.ensure_ready() or self._db.engine is None:
            raise StorageUnavailable("The history storage is unavailable (the database does not answer); retry later.")
        return self._db.engine

    async def get_session(self, session_id: str) -> SessionRecord | None:
        return await queries.get_session(await self.read_engine(), session_id)

    async def list_executions(self, session_id: str) -> list[ExecutionRecord]:
        return await queries.list_executions(await self.read_engine(), session_id)

    async def list_notes(self, session_id: str) -> list[NoteRecord]:
        return await queries.list_notes(await self.read_engine(), session_id)

    async def unanswered_client_cells(self, session_id: str, client_session: str) -> list[ExecutionRecord]:
        """The ended cells a Jupyter client sent in this session whose answer never
        reached it, oldest first (what its return is sent again)."""
        return await queries.unanswered_client_cells(await self.read_engine(), session_id, client_session)

    def client_answered(self, session_id: str, execution_ids: Sequence[str]) -> None:
        """Queue: these cells' answers reached their client (not sent again)."""
        if not execution_ids:
            return
        t = schema.executions
        statement = (
            update(t)
            .where(t.c.session_id == session_id, t.c.execution_id.in_(list(execution_ids)))
            .values(client_answered=True)
        )

        async def write(conn: AsyncConnection) -> None:
            await conn.execute(statement)

        self.enqueue(f"answers of {len(execution_ids)} Jupyter cells of session {session_id}", write, deferrable=True)

    # ------------------------------------------------------------ retention (`kernelgw.storage.cleanup`)
    async def purge(self, now: datetime | None = None) -> int:
        """Delete sessions that ended more than ``retention_days`` ago, with their
        executions and notes; returns how many sessions went (`Cleanup.purge`)."""
        return await self._cleanup.purge(await self.read_engine(), now or _now())
