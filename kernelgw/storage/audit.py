"""The audit log: who ran what, and what happened to every session.

One row per execution (key, session, code and its SHA-256, duration, status,
output bytes, error name) and one per lifecycle event (session created,
deleted, reaped, kernel died, kernel restarted; keys created and revoked).
Rows go through the history writer's queue, so auditing never waits on the
database; they live in the same database as the history. The kinds of record
are `kernelgw.audit_kinds`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import insert, select

from kernelgw.storage import schema
from kernelgw.storage.records import as_utc
from kernelgw.storage.thread_engine import StoreEngine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection


class AuditStore(Protocol):
    """What the audit log needs of the history store (`kernelgw.storage.Store`)."""

    def enqueue(
        self, what: str, write: Callable[[AsyncConnection], Awaitable[Any]], *, deferrable: bool = False
    ) -> None:
        """Queue a write for the writer task; never waits (``deferrable``: it may
        commit after rows an answer waits for)."""
        ...

    async def read_engine(self) -> StoreEngine:
        """The engine, once every queued write is committed."""
        ...


@dataclass(frozen=True)
class AuditRecord:
    at: datetime
    kind: str
    key_id: str | None = None
    session_id: str | None = None
    execution_id: str | None = None
    code: str | None = None
    code_sha256: str | None = None
    duration_ms: float | None = None
    status: str | None = None
    output_bytes: int | None = None
    error_name: str | None = None
    detail: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["at"] = self.at.isoformat()
        return data


def code_sha256(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


def record(store: AuditStore, row: AuditRecord) -> None:
    """Queue one audit row (never waits)."""
    values = dict(vars(row))  # its fields are flat values: asdict's deep copy cost a cell ~0.1 ms

    async def write(conn: AsyncConnection) -> None:
        await conn.execute(insert(schema.audit), values)  # parameters apart: compiled once

    store.enqueue(f"audit {row.kind}", write, deferrable=True)


async def query(
    store: AuditStore,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    key_id: str | None = None,
    session_id: str | None = None,
    kind: str | None = None,
    limit: int | None = None,
) -> list[AuditRecord]:
    """Audit rows, oldest first, narrowed by whatever is given."""
    engine = await store.read_engine()
    t = schema.audit
    q = select(t).order_by(t.c.at, t.c.id)
    if since is not None:
        q = q.where(t.c.at >= since)
    if until is not None:
        q = q.where(t.c.at < until)
    if key_id is not None:
        q = q.where(t.c.key_id == key_id)
    if session_id is not None:
        q = q.where(t.c.session_id == session_id)
    if kind is not None:
        q = q.where(t.c.kind == kind)
    if limit is not None:
        q = q.limit(limit)
    async with engine.connect() as conn:
        rows = (await conn.execute(q)).all()
    return [
        AuditRecord(
            at=as_utc(r.at),
            kind=r.kind,
            key_id=r.key_id,
            session_id=r.session_id,
            execution_id=r.execution_id,
            code=r.code,
            code_sha256=r.code_sha256,
            duration_ms=r.duration_ms,
            status=r.status,
            output_bytes=r.output_bytes,
            error_name=r.error_name,
            detail=r.detail,
        )
        for r in rows
    ]


async def write_now(store: AuditStore, row: AuditRecord) -> None:
    """Write one row at once (the CLI, which has no writer task)."""
    engine = await store.read_engine()
    async with engine.begin() as conn:
        await conn.execute(insert(schema.audit).values(**asdict(row)))
