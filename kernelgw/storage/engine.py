"""Database URLs and engines: which driver, and how SQLite is tuned.

Users write ``sqlite://`` or ``postgresql://``; URLs are kept with the async
drivers' names (aiosqlite, asyncpg). The store's engine on PostgreSQL is
SQLAlchemy's asyncio engine over asyncpg; on SQLite a sync engine run in
threads (`kernelgw.storage.thread_engine`: no asyncio engine, ORM or aiosqlite
to import at start), plus one sync engine for the writer thread (a whole batch
per hop off the event loop).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import StaticPool

from kernelgw.storage.thread_engine import StoreEngine, ThreadEngine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from kernelgw.config import Settings

DB_FILE = "kernelgw.db"
_ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg"}


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


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names; None for PostgreSQL and in-memory SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database).expanduser()


SQLITE_BUSY_TIMEOUT_S = 30
"""How long a SQLite connection waits for another's lock before "database is locked"."""


def create_database_engine(url: str, durability: str) -> StoreEngine:
    """The store's engine: in threads on SQLite (a file's directory is made first),
    else `create_store_engine`'s."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_store_engine(url, durability)
    # its statements hop between worker threads, one at a time; an in-memory
    # database is one connection (each would otherwise be a database of its own)
    in_file = _make_directory(url) is not None
    return ThreadEngine(_sync_sqlite_engine(parsed, durability, **({} if in_file else {"poolclass": StaticPool})))


def create_store_engine(url: str, durability: str) -> AsyncEngine:
    """SQLAlchemy's asyncio engine on the store's database (imported here: on
    SQLite only a cluster's registry and the workers' supervisor use it)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        _make_directory(url)
        engine = create_async_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
        sqlite_pragmas(engine.sync_engine, durability)
        return engine
    return create_async_engine(parsed, pool_pre_ping=True, pool_size=5, max_overflow=5, connect_args={"timeout": 10})


def create_sqlite_writer_engine(path: Path, durability: str) -> Engine:
    """The writer thread's sync engine on the same file (shared across threads).
    Its commits never checkpoint the WAL: `kernelgw.storage.wal` does, beside it."""
    engine = _sync_sqlite_engine(make_url(f"sqlite:///{path}"), durability)

    @event.listens_for(engine, "connect")
    def _no_autocheckpoint(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA wal_autocheckpoint=0")

    return engine


def _sync_sqlite_engine(url: URL, durability: str, **options: Any) -> Engine:
    """A sync engine on SQLite whose connections any thread may use (one at a time)."""
    engine = create_engine(
        url.set(drivername="sqlite+pysqlite"),
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
        **options,
    )
    sqlite_pragmas(engine, durability)
    return engine


def _make_directory(url: str) -> Path | None:
    """The SQLite file ``url`` names, its directory made; None when in memory."""
    if (path := sqlite_file(url)) is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return path


WAL_SWITCH_TIMEOUT_S = 30.0


def enable_wal(path: Path) -> None:
    """Put a SQLite file in WAL mode once, before any engine connects (blocking).

    The switch needs an exclusive lock, and SQLite answers "database is locked"
    at once, without waiting out the busy timeout, when waiting could deadlock:
    gateways starting together on a new file then failed their connection hook.
    WAL mode is stored in the file, so after this the hook's pragma is a no-op.
    """
    deadline = time.monotonic() + WAL_SWITCH_TIMEOUT_S
    while True:
        conn = sqlite3.connect(path, timeout=WAL_SWITCH_TIMEOUT_S)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        finally:
            conn.close()
        time.sleep(0.05)


def sqlite_pragmas(engine: Engine, durability: str) -> None:
    """Set every new connection's journal and sync mode."""
    synchronous = "FULL" if durability == "fsync" else "NORMAL"

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        # WAL: readers (exports) do not wait for the writer, nor it for them.
        # NORMAL: a commit is in the OS once it returns (survives a process
        # crash); FULL also fsyncs the WAL at every commit (survives power loss).
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
        cursor.close()
