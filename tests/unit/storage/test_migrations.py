"""The history store's migrations on real SQLite files: the head revision makes
exactly the schema `kernelgw.storage.schema` defines (a schema change without a
migration fails here), the baseline is the previous release's schema, and
databases made before migrations are recognised.

The same on PostgreSQL, and through the `Store`, in tests/integration/test_migrations.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, create_engine, inspect, text

from kernelgw.storage import migrate, schema
from kernelgw.storage.migrations import (
    BASELINE,
    CHANNELS,
    GATEWAYS,
    KERNEL_NAME,
    OUTPUT_CHUNKS,
    REATTACH,
    REPLAY,
    SESSION_TERMS,
    VERSION_TABLE,
    MigrationsNeedAConnection,
)
from tests.support import previous_schema


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = create_engine(f"sqlite:///{tmp_path / 'kernelgw.db'}")
    yield e
    e.dispose()


def upgrade(engine: Engine) -> migrate.Upgrade:
    with engine.begin() as conn:
        return migrate.upgrade(conn)


def differences(engine: Engine, metadata: MetaData = schema.metadata) -> list[object]:
    with engine.connect() as conn:
        return migrate.differences(conn, metadata)


def test_the_head_revision_makes_the_schema_the_store_defines(engine: Engine) -> None:
    done = upgrade(engine)
    assert (done.before, done.after, done.adopted) == (None, migrate.head(), None)
    assert differences(engine) == [], "kernelgw/storage/schema.py changed without a migration (or the reverse)"


def test_the_comparison_sees_a_schema_that_differs(engine: Engine) -> None:
    """So an empty comparison above means the schemas agree, not that nothing is compared."""
    upgrade(engine)
    found = differences(engine, previous_schema.metadata)
    removed = {(d[2], d[3].name) for d in found if isinstance(d, tuple) and d[0] == "remove_column"}
    assert removed == {("kgw_sessions", c) for c in ("container_id", "kernel", "execution_count", "last_seq")} | {
        ("kgw_executions", c) for c in ("kernel_id", "replay_of", "no_replay")
    } | {("kgw_sessions", "kernel_name")} | {
        ("kgw_executions", c) for c in ("client_session", "client_header", "client_answered")
    } | {("kgw_sessions", c) for c in ("session_metadata", "lease_until", "on_lease_end", "access_sha256")}
    tables = {d[1].name for d in found if isinstance(d, tuple) and d[0] == "remove_table"}
    assert tables == {"kgw_gateways", "kgw_execution_chunks"}
    indexes = {d[1].name for d in found if isinstance(d, tuple) and d[0] == "remove_index"}
    assert indexes <= {"kgw_execution_chunks_cell"}
    assert len(found) == len(removed) + len(tables) + len(indexes)


def test_the_revisions_are_one_line_from_the_baseline() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config())
    assert script.get_heads() == [migrate.head()]
    assert [r.revision for r in script.walk_revisions()] == [
        SESSION_TERMS,
        OUTPUT_CHUNKS,
        CHANNELS,
        GATEWAYS,
        KERNEL_NAME,
        REPLAY,
        REATTACH,
        BASELINE,
    ]
    assert script.get_base() == BASELINE


def test_the_baseline_is_the_previous_release_schema(engine: Engine) -> None:
    with engine.begin() as conn:
        command.upgrade(migrate.alembic_config(conn), BASELINE)
    assert differences(engine, previous_schema.metadata) == []


def test_downgrading_the_reattach_revision_gives_the_previous_release_schema_back(engine: Engine) -> None:
    upgrade(engine)
    with engine.begin() as conn:
        command.downgrade(migrate.alembic_config(conn), BASELINE)
        assert migrate.current_revision(conn) == BASELINE
    assert differences(engine, previous_schema.metadata) == []
    assert upgrade(engine).after == migrate.head()


def test_downgrading_the_replay_revision_gives_the_reattach_schema_back(engine: Engine) -> None:
    upgrade(engine)
    with engine.begin() as conn:
        command.downgrade(migrate.alembic_config(conn), REATTACH)
        assert migrate.current_revision(conn) == REATTACH
    assert differences(engine, previous_schema.REATTACH_RELEASE) == []
    assert upgrade(engine).after == migrate.head() == SESSION_TERMS


def test_upgrading_from_the_reattach_revision_keeps_every_execution_replayable_in_no_lineage(
    engine: Engine,
) -> None:
    """Rows stored before recovery by replay name no kernel: no replay runs them
    (their kernel is unknown), and nothing marks them replayed or not to replay."""
    with engine.begin() as conn:
        command.upgrade(migrate.alembic_config(conn), REATTACH)
        conn.execute(
            text(
                "INSERT INTO kgw_executions (session_id, position, execution_id, seq, code, status, "
                "started_at, duration_ms, state_lost, events) "
                "VALUES ('s', 0, 'e0', 1, 'x = 1', 'ok', '2025-01-01 00:00:00', 1.0, 0, '[]')"
            )
        )
    assert upgrade(engine).after == SESSION_TERMS
    with engine.connect() as conn:
        row = conn.execute(text("SELECT kernel_id, replay_of, no_replay FROM kgw_executions")).one()
    assert tuple(row) == (None, None, None)
    assert differences(engine) == []


def test_sessions_stored_before_kernel_names_read_back_as_python(engine: Engine) -> None:
    """Every session before 0004 ran Python: the column is NULL, read as python3."""
    with engine.begin() as conn:
        command.upgrade(migrate.alembic_config(conn), REPLAY)
        conn.execute(
            text(
                "INSERT INTO kgw_sessions (id, gateway_name, image, created_at, language_info) "
                "VALUES ('s', 'g', 'kernelgw/python:latest', '2025-01-01 00:00:00', '{}')"
            )
        )
    assert upgrade(engine).after == SESSION_TERMS
    with engine.connect() as conn:
        assert conn.execute(text("SELECT kernel_name FROM kgw_sessions")).scalar() is None
    with engine.begin() as conn:
        command.downgrade(migrate.alembic_config(conn), REPLAY)
    assert "kernel_name" not in {c["name"] for c in inspect(engine).get_columns("kgw_sessions")}
    assert upgrade(engine).after == SESSION_TERMS


def test_a_second_upgrade_changes_nothing(engine: Engine) -> None:
    upgrade(engine)
    again = upgrade(engine)
    assert not again.changed and again.after == migrate.head()
    with engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {VERSION_TABLE}")).scalar() == 1


@pytest.mark.parametrize(
    ("metadata", "adopted"),
    [
        (previous_schema.metadata, BASELINE),
        (previous_schema.FIRST_RELEASE, BASELINE),
        (previous_schema.REATTACH_RELEASE, REATTACH),
    ],
    ids=["previous-release", "first-release", "last-release-before-migrations"],
)
def test_tables_made_before_migrations_are_recognised(engine: Engine, metadata: MetaData, adopted: str) -> None:
    metadata.create_all(engine)
    done = upgrade(engine)
    assert (done.before, done.adopted, done.after) == (None, adopted, migrate.head())
    assert differences(engine) == []


def test_a_database_with_only_some_reattach_columns_is_refused(engine: Engine) -> None:
    previous_schema.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE kgw_sessions ADD COLUMN kernel TEXT"))
    with pytest.raises(migrate.UnrecognisedHistorySchema, match="has kernel but not container_id"):
        upgrade(engine)
    with engine.connect() as conn:  # the failed upgrade left nothing behind
        assert not inspect(conn).has_table(VERSION_TABLE)


def test_another_applications_tables_and_alembic_version_are_left_alone(engine: Engine) -> None:
    theirs = MetaData()
    Table("alembic_version", theirs, Column("version_num", String(32), primary_key=True))
    Table("orders", theirs, Column("id", Integer, primary_key=True))
    theirs.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO alembic_version VALUES ('their-head')"))
    assert upgrade(engine).adopted is None  # their tables are not ours to recognise
    assert differences(engine) == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "their-head"
        assert {"orders", "alembic_version", VERSION_TABLE} <= set(inspect(conn).get_table_names())


def test_a_failed_upgrade_leaves_the_old_schema_whole(engine: Engine) -> None:
    """On SQLite too the upgrade is one transaction (``BEGIN IMMEDIATE``): DDL included."""
    previous_schema.metadata.create_all(engine)
    with pytest.raises(RuntimeError, match="stop"), engine.begin() as conn:
        migrate.upgrade(conn)
        raise RuntimeError("stop before the commit")
    with engine.connect() as conn:
        assert not inspect(conn).has_table(VERSION_TABLE)
        assert "kernel" not in {c["name"] for c in inspect(conn).get_columns("kgw_sessions")}


def test_the_migrations_refuse_to_run_without_the_stores_connection() -> None:
    with pytest.raises(MigrationsNeedAConnection):
        command.upgrade(migrate.alembic_config(), "head")


def test_cells_stored_before_output_chunks_have_none_and_downgrading_drops_the_table(engine: Engine) -> None:
    """0007 only adds a table: rows stored before it keep their whole output in ``events``."""
    with engine.begin() as conn:
        command.upgrade(migrate.alembic_config(conn), CHANNELS)
    assert upgrade(engine).after == SESSION_TERMS
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM kgw_execution_chunks")).scalar() == 0
    with engine.begin() as conn:
        command.downgrade(migrate.alembic_config(conn), CHANNELS)
    assert "kgw_execution_chunks" not in inspect(engine).get_table_names()
    assert upgrade(engine).after == SESSION_TERMS
    assert differences(engine) == []


def test_sessions_stored_before_their_terms_keep_their_rows_and_read_back_with_none(engine: Engine) -> None:
    """0008 adds four nullable columns: an open and an ended session stored at 0007
    are upgraded as they were, with no labels, lease or access hash; a downgrade
    drops the columns and keeps the rows."""
    with engine.begin() as conn:
        command.upgrade(migrate.alembic_config(conn), OUTPUT_CHUNKS)
        conn.execute(
            text(
                "INSERT INTO kgw_sessions (id, gateway_name, image, created_at, ended_at, end_reason, language_info) "
                "VALUES ('open', 'g', 'img', '2025-01-01 00:00:00', NULL, NULL, '{}'), "
                "('ended', 'g', 'img', '2025-01-01 00:00:00', '2025-01-01 01:00:00', 'deleted', '{}')"
            )
        )
    assert upgrade(engine).after == SESSION_TERMS
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT id, end_reason, session_metadata, lease_until, on_lease_end, access_sha256 "
                "FROM kgw_sessions ORDER BY id"
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        ("ended", "deleted", None, None, None, None),
        ("open", None, None, None, None, None),
    ]
    assert differences(engine) == []
    with engine.begin() as conn:
        command.downgrade(migrate.alembic_config(conn), OUTPUT_CHUNKS)
    columns = {c["name"] for c in inspect(engine).get_columns("kgw_sessions")}
    assert columns.isdisjoint({"session_metadata", "lease_until", "on_lease_end", "access_sha256"})
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM kgw_sessions")).scalar() == 2
    assert upgrade(engine).after == SESSION_TERMS
