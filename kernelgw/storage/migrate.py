"""Bring a database's schema to the head revision: at every start of the store.

A new database gets the whole schema. A database made by a release before
migrations (our tables, no version row) is recognised by its columns, stamped
with the revision it matches and upgraded from there; the first release's
(no owner column, no key or audit tables) is first brought up to the baseline.

One transaction, serialised between processes: on PostgreSQL an advisory lock
held until commit, on SQLite ``BEGIN IMMEDIATE`` (which also makes SQLite's DDL
part of the transaction: a crash mid-upgrade leaves the old schema whole). A
second gateway starting on the same database waits, then finds nothing to do.

Alembic works on a sync connection: call `upgrade` through
``AsyncConnection.run_sync`` inside ``engine.begin()``. It is imported only
when a database needs it: a start on a database at the head (every restart)
does not pay its import (about 0.1 s of a gateway's start).
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Column, Connection, MetaData, String, inspect, text
from sqlalchemy.exc import OperationalError

from kernelgw.storage import schema
from kernelgw.storage.migrations import BASELINE, HEAD, REATTACH, TABLE_PREFIX, VERSION_TABLE, baseline, include_name

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
LOCK_KEY = zlib.crc32(b"kernelgw history store migrations")
"""The PostgreSQL advisory lock every store takes to migrate (any bigint, the same everywhere)."""
REATTACH_COLUMNS = frozenset({"container_id", "kernel", "execution_count", "last_seq"})
"""What revision 0002 added to ``kgw_sessions``: a database from before
migrations with all of them is at 0002, with none at the baseline."""


class UnrecognisedHistorySchema(Exception):
    """The store's tables predate migrations but match no schema a release made."""


@dataclass(frozen=True)
class Upgrade:
    """What `upgrade` did."""

    before: str | None
    """The revision the database was at (None: new, or made before migrations)."""
    after: str
    adopted: str | None = None
    """The revision tables made before migrations were recognised as and stamped with."""

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def describe(self) -> str:
        if self.adopted is not None:
            was = f"{self.adopted} (tables made before migrations)"
        else:
            was = self.before or "an empty database"
        return f"schema upgraded from {was} to {self.after}"


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration, in code: the migrations ship inside the package."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


def head() -> str:
    """The newest revision (the schema of `kernelgw.storage.schema`): `HEAD`, which a
    unit test holds equal to the head of Alembic's scripts."""
    return HEAD


def current_revision(conn: Connection) -> str | None:
    """The revision the database says it is at (None: no version row).

    Read directly, not through a `MigrationContext`, which logs two lines at
    INFO each time: every start of every gateway would."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def upgrade(conn: Connection) -> Upgrade:
    """Upgrade the database of ``conn`` (in a transaction the caller commits) to `head`."""
    _serialise(conn)
    before = current_revision(conn)
    if before == head():
        return Upgrade(before=before, after=before)
    from alembic import command

    config = alembic_config(conn)
    adopted = _recognise(conn) if before is None else None
    if adopted is not None:
        command.stamp(config, adopted)
    command.upgrade(config, "head")
    after = current_revision(conn)
    assert after is not None
    return Upgrade(before=before, after=after, adopted=adopted)


def differences(conn: Connection, metadata: MetaData = schema.metadata) -> list[Any]:
    """How the database's tables differ from ``metadata`` (Alembic's autogenerate
    diff; empty when they agree): the head revision must make `kernelgw.storage.schema`."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE, "include_name": include_name})
    return list(compare_metadata(context, metadata))


def _serialise(conn: Connection) -> None:
    """Make concurrent upgrades of one database take turns (held until the transaction ends)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
    elif conn.dialect.name == "sqlite":
        try:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        except OperationalError as exc:
            # the caller's connection already holds a transaction: its own, keep it
            if "within a transaction" not in str(exc):
                raise


def _recognise(conn: Connection) -> str | None:
    """The revision of tables made before migrations (brought up to the baseline
    first when the first release made them); None for a database without any."""
    inspector = inspect(conn)
    tables = {t for t in inspector.get_table_names() if t.startswith(TABLE_PREFIX) and t != VERSION_TABLE}
    if not tables:
        return None
    columns = {c["name"] for c in inspector.get_columns("kgw_sessions")} if "kgw_sessions" in tables else set()
    present = REATTACH_COLUMNS & columns
    if present and present != REATTACH_COLUMNS:
        raise UnrecognisedHistorySchema(
            f"kgw_sessions has {', '.join(sorted(present))} but not {', '.join(sorted(REATTACH_COLUMNS - present))}: "
            "no release of kernelgw made that schema"
        )
    revision = REATTACH if present else BASELINE
    first_release: list[str] = []
    baseline.metadata.create_all(conn, checkfirst=True)  # the first release had no keys or audit tables
    if created := sorted(set(baseline.metadata.tables) - tables):
        first_release.append(f"created {', '.join(created)}")
    if columns and "owner" not in columns:  # nor an owner of each session
        from alembic.operations import Operations
        from alembic.runtime.migration import MigrationContext

        Operations(MigrationContext.configure(conn)).add_column("kgw_sessions", Column("owner", String(32)))
        first_release.append("added kgw_sessions.owner")
    log.info(
        "history storage: tables made before migrations are at revision %s%s",
        revision,
        f" ({'; '.join(first_release)})" if first_release else "",
    )
    return revision
