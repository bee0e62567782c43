"""Housekeeping: history older than the retention goes, cut-off cells are marked dead."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import delete, select, update

from kernelgw.storage import schema
from kernelgw.storage.thread_engine import StoreEngine

log = logging.getLogger(__name__)

RUNNING = "running"
"""The status of an execution's row from its start until its end is stored."""
CUT_OFF_REASON = (
    "the gateway stopped while this cell ran; its outcome and its output of the last moments "
    "(up to the state poll, 0.5 s by default) were not recorded"
)
PURGE_CHUNK = 500
"""Sessions deleted per transaction (short transactions: the writer is not held up)."""


async def purge(engine: StoreEngine, cutoff: datetime, audit_cutoff: datetime) -> int:
    """Delete sessions that ended before ``cutoff``, with their executions (and
    their output chunks) and notes, and audit rows before ``audit_cutoff``; returns how many sessions went."""
    s = schema.sessions
    purged = 0
    while True:
        async with engine.begin() as conn:
            ids = (
                (
                    await conn.execute(
                        select(s.c.id).where(s.c.ended_at.is_not(None), s.c.ended_at < cutoff).limit(PURGE_CHUNK)
                    )
                )
                .scalars()
                .all()
            )
            if not ids:
                break
            await conn.execute(delete(schema.executions).where(schema.executions.c.session_id.in_(ids)))
            await conn.execute(delete(schema.execution_chunks).where(schema.execution_chunks.c.session_id.in_(ids)))
            await conn.execute(delete(schema.notes).where(schema.notes.c.session_id.in_(ids)))
            await conn.execute(delete(s).where(s.c.id.in_(ids)))
        purged += len(ids)
    async with engine.begin() as conn:
        await conn.execute(delete(schema.audit).where(schema.audit.c.at < audit_cutoff))
    return purged


async def end_cut_off_executions(engine: StoreEngine, gateway_name: str) -> list[tuple[str, str]]:
    """Rows still ``running`` in this gateway name's open sessions belong to
    cells a gateway death cut off (a live gateway ends every cell it runs):
    mark them dead so history and notebook export show them; returns their
    (session id, execution id)s, so the reattached sessions can end them too."""
    e, s = schema.executions, schema.sessions
    open_sessions = select(s.c.id).where(s.c.gateway_name == gateway_name, s.c.ended_at.is_(None))
    cut_off = (e.c.status == RUNNING) & e.c.session_id.in_(open_sessions)
    async with engine.begin() as conn:
        rows = (await conn.execute(select(e.c.session_id, e.c.execution_id).where(cut_off))).all()
        if rows:
            await conn.execute(update(e).where(cut_off).values(status="dead", reason=CUT_OFF_REASON))
    return [(row.session_id, row.execution_id) for row in rows]
