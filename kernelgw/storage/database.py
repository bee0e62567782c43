"""The store's database: opened, set up once it answers, and opened again after a fault.

A database that is down at start-up (or goes down later) is set up again at
most every `RECONNECT_INTERVAL_S`, on the next write or read. A SQLite file
deleted or replaced under a running gateway is noticed at commit
(`FileIdentity`) and opened afresh at its path: SQLite would otherwise keep
writing into the unlinked inode and every commit would "succeed" into nowhere.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from kernelgw.storage import migrate
from kernelgw.storage.engine import create_database_engine, create_sqlite_writer_engine, enable_wal, sqlite_file
from kernelgw.storage.health import FileIdentity
from kernelgw.storage.thread_engine import StoreEngine, ThreadEngine
from kernelgw.storage.wal import WalCheckpointer

log = logging.getLogger(__name__)

RECONNECT_INTERVAL_S = 5.0
"""How often a store whose database failed tries to set it up again."""
PROBE_INTERVAL_S = 2.0
"""Readiness probes closer together than this share one answer (`Database.answers`)."""
PROBE_TIMEOUT_S = 2.0


class Database:
    """One database URL: its engines, whether its tables are set up, and which file it opened."""

    def __init__(self, url: str, durability: str) -> None:
        self.url = url
        self.durability = durability
        self._sqlite_file = sqlite_file(url)
        self.engine: StoreEngine | None = None
        self.ready = False
        """The tables are set up and the latest commit did not find the database gone."""
        self.last_error: str | None = None
        """Why the latest set-up failed (for the CLI's message)."""
        self._last_attempt = 0.0
        self._file_identity: FileIdentity | None = None
        self._sqlite_writer: Engine | None = None
        """SQLite only: a sync engine the writer thread commits a whole batch on, in
        one hop off the event loop (aiosqlite would take about six per commit)."""
        self._probed_at = -PROBE_INTERVAL_S
        self._answered = True
        self.wal: WalCheckpointer | None = None
        """SQLite only: checkpoints what the writer engine commits (it does not itself)."""

    @property
    def display_url(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    @property
    def sqlite_file(self) -> Path | None:
        """The SQLite file (None for PostgreSQL), parsed once: the writer asks at every commit."""
        return self._sqlite_file

    def open(self) -> None:
        """Make the engine (connects lazily)."""
        self.engine = create_database_engine(self.url, self.durability)

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.dispose()
            self.engine = None
        self._dispose_sqlite_writer()
        self.ready = False

    async def ensure_ready(self, force: bool = False) -> bool:
        """Upgrade the schema to the head revision when not done yet (`kernelgw.storage.migrate`);
        retried at most every few seconds."""
        if self.ready:
            return True
        if self.engine is None:
            return False
        now = time.monotonic()
        if not force and now - self._last_attempt < RECONNECT_INTERVAL_S:
            return False
        self._last_attempt = now
        try:
            if (path := self.sqlite_file) is not None:
                await asyncio.to_thread(enable_wal, path)
            async with self.engine.begin() as conn:
                upgrade = await conn.run_sync(migrate.upgrade)
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.error("history storage at %s is unavailable: %s", self.display_url, exc)
            return False
        self.last_error = None
        if upgrade.changed:
            log.info("history storage: %s", upgrade.describe())
        self.ready = True
        if (path := self.sqlite_file) is not None:
            self._file_identity = await asyncio.to_thread(FileIdentity.of, path)
        log.info("history storage: %s", self.display_url)
        return True

    def sqlite_writer_engine(self) -> Engine | None:
        """The writer thread's sync engine (SQLite only), made on first use; an
        in-memory database's is the store's own (one connection)."""
        path = self.sqlite_file
        if path is None:
            return self.engine.sync_engine if isinstance(self.engine, ThreadEngine) else None
        if self._sqlite_writer is None:
            self._sqlite_writer = create_sqlite_writer_engine(path, self.durability)
            self.wal = WalCheckpointer(path)
        return self._sqlite_writer

    def _dispose_sqlite_writer(self) -> None:
        if self.wal is not None:
            self.wal.close()
            self.wal = None
        if self._sqlite_writer is not None:
            self._sqlite_writer.dispose()
            self._sqlite_writer = None

    def check_file(self) -> None:
        """Raise `DatabaseFileReplaced` when the SQLite path no longer names the opened file (blocking)."""
        path, identity = self.sqlite_file, self._file_identity
        if path is not None and identity is not None:
            identity.check(path)

    async def reopen(self) -> None:
        """Open the database at its path again (a new file, with its tables, when it was deleted)."""
        if self.engine is not None:
            await self.engine.dispose()
        self._dispose_sqlite_writer()
        self.ready = False
        self._file_identity = None
        try:
            self.open()
        except OSError as exc:  # the directory cannot be made again (yet)
            log.error("history storage: cannot reopen %s: %s", self.display_url, exc)
            return
        await self.ensure_ready(force=True)

    async def recheck(self) -> None:
        """After a failed commit: set the database up again on the next try unless it still answers."""
        self.ready = await self._reachable()

    async def answers(self) -> bool:
        """Whether the database answers a connection now (at most one try per
        `PROBE_INTERVAL_S`, each within `PROBE_TIMEOUT_S`). A write fault shows
        in `WriteHealth` only after a write failed; a PostgreSQL that went away
        while nothing was written shows here, so a load balancer's readiness
        probe stops sending work before the first answer would be a 503."""
        now = time.monotonic()
        if now - self._probed_at < PROBE_INTERVAL_S or self.engine is None:
            return self._answered
        self._probed_at = now
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                self._answered = await self._reachable()
        except TimeoutError:
            self._answered = False
        return self._answered

    async def _reachable(self) -> bool:
        assert self.engine is not None
        try:
            async with self.engine.connect() as conn:
                await conn.run_sync(lambda c: None)
            return True
        except Exception:
            return False
