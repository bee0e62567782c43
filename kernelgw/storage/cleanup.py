"""The store's clean-up: after the gateway that ran before it, and of old history.

At start, before the writer runs (`Store.start`): the end rows a previous
gateway of the same name answered from its journal but never committed (it was
killed) are written (`Cleanup.replay_journal`); cells still ``running`` in this
name's open sessions were cut off by its stop and are marked dead
(`Cleanup.end_cut_off_executions`). History past its retention is purged soon
after start, then every ``purge_interval_s`` (`Cleanup.start_purging`). The SQL
of the last two is `kernelgw.storage.retention`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import insert, select, update

from kernelgw.storage import retention, schema
from kernelgw.storage.database import Database
from kernelgw.storage.journal import DIRECTORY as JOURNAL_DIRECTORY
from kernelgw.storage.journal import JournalRecord, read_segments
from kernelgw.storage.retention import RUNNING
from kernelgw.storage.thread_engine import StoreConnection, StoreEngine
from kernelgw.tasks import cancel_and_wait

log = logging.getLogger(__name__)

FIRST_PURGE_DELAY_S = 10.0
"""How long after start the first purge runs (sooner when ``purge_interval_s`` is
shorter). It ran in the store's start until then: 10-30 ms of a restart before
the reattached sessions' first answers, for history nobody waits to see go."""


async def replay_row(conn: StoreConnection, record: JournalRecord) -> bool:
    """Write a journalled end row unless it is stored already; whether it was written."""
    row = dict(record.row)
    row["started_at"] = datetime.fromisoformat(row["started_at"])
    table = schema.executions
    where = (
        (table.c.session_id == row["session_id"])
        & (table.c.position == row["position"])
        & (table.c.execution_id == row["execution_id"])
    )
    found = (await conn.execute(select(table.c.status).where(where))).first()
    if found is not None and found.status != RUNNING:
        return False
    if found is not None:  # its running row was committed, its end was not
        keys = ("session_id", "position", "execution_id")
        await conn.execute(
            update(table).where(where).values(events=record.events, **{k: v for k, v in row.items() if k not in keys})
        )
    else:
        await conn.execute(insert(table).values(events=record.events, **row))
    return True


class Cleanup:
    """One store's clean-up: what its predecessor left, and history past its retention."""

    def __init__(
        self,
        db: Database,
        gateway_name: str,
        *,
        durability: str,
        retention_days: float,
        audit_retention_days: float,
        purge_interval_s: float,
    ) -> None:
        self._db = db
        self.gateway_name = gateway_name
        self.durability = durability
        self.retention_days = retention_days
        self.audit_retention_days = audit_retention_days
        self.purge_interval_s = purge_interval_s
        self.cut_off: set[tuple[str, str]] = set()
        """(session id, execution id) of the cells this start marked as cut off."""
        self._purger: asyncio.Task[None] | None = None

    def journal_directory(self) -> Path | None:
        """Where this gateway's answer journal lives, if it keeps one: beside a
        SQLite file, with the default durability (see `kernelgw.storage.journal`)."""
        path = self._db.sqlite_file
        if path is None or self.durability != "process":
            return None
        return path.parent / JOURNAL_DIRECTORY

    async def after_predecessor(self) -> None:
        """At start, once the database is set up: the journal, then the cut-off
        cells. A failure is logged: the gateway starts anyway."""
        try:
            await self.replay_journal()
            await self.end_cut_off_executions()
        except Exception:
            log.exception("history storage: start-up clean-up failed")

    async def replay_journal(self) -> None:
        """Write into the database the end rows a previous gateway of this name
        answered and did not commit (it was killed), then remove its journal."""
        if (directory := self.journal_directory()) is None:
            return
        records, paths = await asyncio.to_thread(read_segments, directory, self.gateway_name)
        if records:
            assert self._db.engine is not None
            async with self._db.engine.begin() as conn:
                written = [await replay_row(conn, record) for record in records]
            log.warning(
                "history storage: %d cells answered before a gateway stop were written from its journal "
                "(%d were already stored)",
                written.count(True),
                written.count(False),
            )
        for path in paths:
            await asyncio.to_thread(path.unlink, missing_ok=True)

    async def end_cut_off_executions(self) -> None:
        assert self._db.engine is not None
        if cut_off := await retention.end_cut_off_executions(self._db.engine, self.gateway_name):
            self.cut_off.update(cut_off)
            log.warning("history storage: %d cells were cut off by a gateway stop; marked dead", len(cut_off))

    async def purge(self, engine: StoreEngine, now: datetime) -> int:
        """Delete sessions that ended more than ``retention_days`` before ``now``,
        with their executions and notes; returns how many sessions went."""
        purged = await retention.purge(
            engine, now - timedelta(days=self.retention_days), now - timedelta(days=self.audit_retention_days)
        )
        if purged:
            log.info("history storage: purged %d sessions older than %g days", purged, self.retention_days)
        return purged

    def start_purging(self, purge: Callable[[], Awaitable[int]]) -> None:
        """Call ``purge`` (the store's, which reads its own writes) once soon after
        start (`FIRST_PURGE_DELAY_S`), then every ``purge_interval_s`` (0: never again)."""
        self._purger = asyncio.create_task(self._purge_loop(purge), name="history-purge")

    async def stop_purging(self) -> None:
        await cancel_and_wait(self._purger)
        self._purger = None

    async def _purge_loop(self, purge: Callable[[], Awaitable[int]]) -> None:
        interval = self.purge_interval_s
        await asyncio.sleep(min(FIRST_PURGE_DELAY_S, interval) if interval > 0 else FIRST_PURGE_DELAY_S)
        while True:
            try:
                await purge()
            except Exception:
                log.exception("history storage: purging old history failed")
            if self.purge_interval_s <= 0:
                return
            await asyncio.sleep(self.purge_interval_s)
