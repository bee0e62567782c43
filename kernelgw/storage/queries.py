"""Reading the history back: a session, its executions in order, its notes.

Plain functions of an engine; the store calls them once its queue is flushed
(`Store.read_engine`), so a client always reads its own writes. A read of more
than one statement (a cell's row, then its output chunks) reads one state of
the database (`on_one_connection`), whatever the writer commits meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, or_, select

from kernelgw.kernels import DEFAULT_KERNEL
from kernelgw.runtime.lineage import LineageCell
from kernelgw.storage import schema
from kernelgw.storage.records import ExecutionRecord, NoteRecord, SessionRecord, as_utc, stored_metadata
from kernelgw.storage.retention import RUNNING
from kernelgw.storage.thread_engine import StoreConnection, StoreEngine, on_one_connection


def _utc(value: datetime | None) -> datetime:
    return as_utc(value) if value is not None else datetime.now(UTC)


CellKey = tuple[str, int]
"""A cell's (execution id, position) in its session: what its output chunks name."""
LATE_PART = 1 << 30
"""Chunks from this part on hold output that came after the cell's ``done``
(`kernelgw.runtime.late_output`): they follow the row's own events."""


def splice(arrays: Sequence[str]) -> str:
    """JSON arrays as one, in order, copied once (a cell's chunks, then its row's tail)."""
    if len(arrays) == 1:
        return arrays[0]
    items = [text[1:-1] for text in arrays if text.strip() != "[]"]
    return "[" + ",".join(items) + "]"


async def _chunks(
    conn: StoreConnection, session_id: str, execution_ids: Sequence[str] | None = None
) -> dict[CellKey, tuple[list[str], list[str]]]:
    """The output chunks of a session's cells (those of ``execution_ids`` only,
    when given), in order, those before its row's events and those after (late
    output): one query for any number of cells."""
    c = schema.execution_chunks
    query = select(c.c.execution_id, c.c.position, c.c.part, c.c.events).where(c.c.session_id == session_id)
    if execution_ids is not None:
        if not execution_ids:
            return {}
        query = query.where(c.c.execution_id.in_(list(execution_ids)))
    found: dict[CellKey, tuple[list[str], list[str]]] = {}
    for row in (await conn.execute(query.order_by(c.c.execution_id, c.c.position, c.c.part, c.c.id))).all():
        before, after = found.setdefault((row.execution_id, row.position), ([], []))
        (after if row.part >= LATE_PART else before).append(row.events)
    return found


def _events(row: Any, chunks: dict[CellKey, tuple[list[str], list[str]]]) -> str:
    """A cell's events: its chunks by part, then its row's own, then its late output."""
    parts = chunks.get((row.execution_id, row.position))
    return splice([*parts[0], row.events, *parts[1]]) if parts else str(row.events)


async def get_session(engine: StoreEngine, session_id: str) -> SessionRecord | None:
    async with engine.connect() as conn:
        row = (await conn.execute(select(schema.sessions).where(schema.sessions.c.id == session_id))).first()
    if row is None:
        return None
    return SessionRecord(
        id=row.id,
        gateway_name=row.gateway_name,
        image=row.image,
        created_at=_utc(row.created_at),
        ended_at=as_utc(row.ended_at) if row.ended_at is not None else None,
        end_reason=row.end_reason,
        language_info=json.loads(row.language_info or "{}"),
        owner=row.owner,
        kernel=row.kernel_name or DEFAULT_KERNEL,
        metadata=stored_metadata(row.session_metadata),
    )


def _header(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


async def list_executions(engine: StoreEngine, session_id: str) -> list[ExecutionRecord]:
    t = schema.executions

    async def read(conn: StoreConnection) -> list[ExecutionRecord]:
        # the rows and their chunks of one state (`on_one_connection`): a late error
        # committed in between was read as its chunk with the status before it
        rows = (await conn.execute(select(t).where(t.c.session_id == session_id).order_by(t.c.position, t.c.id))).all()
        chunks = await _chunks(conn, session_id) if rows else {}
        return [_execution(row, chunks) for row in rows]

    return await on_one_connection(engine, read)


MAX_UNANSWERED = 100
"""The most cells a returning Jupyter client is sent again (the latest)."""


async def unanswered_client_cells(engine: StoreEngine, session_id: str, client_session: str) -> list[ExecutionRecord]:
    """A Jupyter client's ended cells whose answer never reached it, oldest first."""
    t = schema.executions
    query = (
        select(t)
        .where(
            t.c.session_id == session_id,
            t.c.client_session == client_session,
            or_(t.c.client_answered.is_(None), t.c.client_answered.is_(False)),
            t.c.status != RUNNING,
        )
        .order_by(t.c.position.desc(), t.c.id.desc())
        .limit(MAX_UNANSWERED)
    )

    async def read(conn: StoreConnection) -> list[ExecutionRecord]:
        rows = (await conn.execute(query)).all()
        chunks = await _chunks(conn, session_id, sorted({row.execution_id for row in rows}))
        return [_execution(row, chunks) for row in reversed(rows)]

    return await on_one_connection(engine, read)


def _execution(row: Any, chunks: dict[CellKey, tuple[list[str], list[str]]]) -> ExecutionRecord:
    return ExecutionRecord(
        session_id=row.session_id,
        position=row.position,
        execution_id=row.execution_id,
        seq=row.seq,
        code=row.code,
        status=row.status,
        execution_count=row.execution_count,
        started_at=_utc(row.started_at),
        duration_ms=row.duration_ms,
        reason=row.reason,
        state_lost=bool(row.state_lost),
        events_json=_events(row, chunks),
        kernel_id=row.kernel_id,
        replay_of=row.replay_of,
        replayable=not row.no_replay,
        client_session=row.client_session,
        client_header=_header(row.client_header),
        client_answered=bool(row.client_answered),
    )


async def lineage(engine: StoreEngine, session_id: str, kernel_ids: Sequence[str]) -> list[LineageCell]:
    """The cells that built the state of the session's kernel (`kernelgw.runtime.lineage`),
    oldest first: what a replay runs again. ``kernel_ids``: that kernel, and those
    its state was resumed from."""
    async with engine.connect() as conn:
        return (await _lineages(conn, {session_id: kernel_ids}))[session_id]


async def _lineages(
    conn: StoreConnection, kernels_by_session: Mapping[str, Sequence[str]]
) -> dict[str, list[LineageCell]]:
    """`lineage` of each session (id -> its kernels), in one query."""
    t = schema.executions
    kernels = sorted({k for ks in kernels_by_session.values() for k in ks})
    query = (
        select(t.c.session_id, t.c.kernel_id, t.c.execution_id, t.c.code)
        .where(
            t.c.session_id.in_(list(kernels_by_session)),
            t.c.kernel_id.in_(kernels),
            t.c.status == "ok",
            or_(t.c.no_replay.is_(None), t.c.no_replay.is_(False)),
        )
        .order_by(t.c.session_id, t.c.position, t.c.id)
    )
    found: dict[str, list[LineageCell]] = {sid: [] for sid in kernels_by_session}
    for row in (await conn.execute(query)).all():
        if row.kernel_id in kernels_by_session[row.session_id]:  # another session's kernel: not its own lineage
            found[row.session_id].append(LineageCell(row.execution_id, row.code))
    return found


async def list_notes(engine: StoreEngine, session_id: str) -> list[NoteRecord]:
    t = schema.notes
    async with engine.connect() as conn:
        rows = (await conn.execute(select(t).where(t.c.session_id == session_id).order_by(t.c.after_seq, t.c.id))).all()
    return [
        NoteRecord(
            session_id=row.session_id,
            after_seq=row.after_seq,
            markdown=row.markdown,
            created_at=_utc(row.created_at),
        )
        for row in rows
    ]


async def latest_events(engine: StoreEngine, session_id: str, max_bytes: int) -> list[tuple[str, str]]:
    """(execution id, events JSON) of the session's latest executions, oldest
    first, as many as fit in ``max_bytes`` of events (a replay buffer's worth,
    read newest first so a long history is not loaded; output chunks are
    counted by their stored size and loaded only for the cells taken)."""

    async def read(conn: StoreConnection) -> list[tuple[str, str]]:
        sizes = await _chunk_sizes(conn, [session_id])
        return await _latest_events(conn, session_id, max_bytes, sizes.get(session_id, {}))

    return await on_one_connection(engine, read)


@dataclass(frozen=True)
class ReattachReads:
    """What a reattached session's replay needs from its history."""

    latest: list[tuple[str, str]]
    """`latest_events` (empty when no replay buffer was asked for)."""
    lineage: list[LineageCell]


async def reattach_reads(
    engine: StoreEngine, kernels_by_session: Mapping[str, Sequence[str]], max_bytes: int
) -> dict[str, ReattachReads]:
    """`latest_events` (when ``max_bytes`` > 0) and `lineage` of every session
    (id -> its lineage kernels) at a gateway's start: on one connection (on SQLite
    in one thread hop), with one query for all their lineages and one for all their
    chunk sizes (a query and a connection per session each cost 20 sessions'
    restart 60-70 ms)."""
    if not kernels_by_session:
        return {}

    async def read(conn: StoreConnection) -> dict[str, ReattachReads]:
        lineages = await _lineages(conn, kernels_by_session)
        latest: dict[str, list[tuple[str, str]]] = {sid: [] for sid in kernels_by_session}
        if max_bytes > 0:
            sizes = await _chunk_sizes(conn, list(kernels_by_session))
            for sid in kernels_by_session:
                latest[sid] = await _latest_events(conn, sid, max_bytes, sizes.get(sid, {}))
        return {sid: ReattachReads(latest=latest[sid], lineage=lineages[sid]) for sid in kernels_by_session}

    return await on_one_connection(engine, read)


async def _chunk_sizes(conn: StoreConnection, session_ids: Sequence[str]) -> dict[str, dict[CellKey, int]]:
    """The stored size of each chunked cell's output, by session."""
    c = schema.execution_chunks
    query = (
        select(c.c.session_id, c.c.execution_id, c.c.position, func.sum(c.c.bytes).label("bytes"))
        .where(c.c.session_id.in_(list(session_ids)))
        .group_by(c.c.session_id, c.c.execution_id, c.c.position)
    )
    found: dict[str, dict[CellKey, int]] = {}
    for row in (await conn.execute(query)).all():
        found.setdefault(row.session_id, {})[(row.execution_id, row.position)] = int(row.bytes)
    return found


async def _latest_events(
    conn: StoreConnection, session_id: str, max_bytes: int, chunked: dict[CellKey, int]
) -> list[tuple[str, str]]:
    t = schema.executions
    query = (
        select(t.c.execution_id, t.c.position, t.c.events)
        .where(t.c.session_id == session_id)
        .order_by(t.c.position.desc(), t.c.id.desc())
    )
    cells: list[Any] = []
    total = 0
    result = await conn.stream(query.execution_options(yield_per=50))
    async for row in result:
        total += len(row.events) + chunked.get((row.execution_id, row.position), 0)
        if cells and total > max_bytes:
            break
        cells.append(row)
    await result.close()
    taken = sorted({row.execution_id for row in cells if (row.execution_id, row.position) in chunked})
    chunks = await _chunks(conn, session_id, taken)
    cells.reverse()
    return [(row.execution_id, _events(row, chunks)) for row in cells]
