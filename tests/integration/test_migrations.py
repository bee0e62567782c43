"""Schema migrations of the history store, on real SQLite files and a real PostgreSQL server.

A database the previous release made (its schema copied verbatim in
tests/support/previous_schema.py), and one the first release made, are
upgraded by a current `Store` at start: every row stays readable through the
store's read API, the new columns are there, the version is at head, and the
migrated schema is exactly what a new database gets. Each test has a
database of its own (on PostgreSQL: created and dropped here), so tests and
other suites sharing the server do not see each other's tables.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, MetaData, insert, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from kernelgw.keys import KeyQuotas
from kernelgw.storage import Store, audit, migrate
from kernelgw.storage.keys import KeyStore
from kernelgw.storage.migrations import REATTACH, VERSION_TABLE
from kernelgw.storage.store import CRASHED_REASON, async_database_url
from tests.integration.test_history import database_url  # noqa: F401  (the sqlite/postgres fixture)
from tests.support import previous_schema
from tests.support.stand_ins import finished_execution, stand_in_session

pytestmark = pytest.mark.integration

NOW = datetime.now(UTC).replace(microsecond=0)
SESSION = "0123456789abcdef0123456789abcdef"
OPEN_SESSION = "fedcba9876543210fedcba9876543210"
KEY_ID = "0a1b2c3d4e5f"


@pytest.fixture
async def url(database_url: str, tmp_path: Path) -> AsyncIterator[str]:  # noqa: F811
    """An empty database of this test's own."""
    base = async_database_url(database_url)
    if make_url(base).get_backend_name() == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'history.db'}"
        return
    name = f"kgw_migrations_{uuid.uuid4().hex[:12]}"
    admin = create_async_engine(base, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f"CREATE DATABASE {name}"))
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        await admin.dispose()


async def on(url: str, work: Any) -> Any:
    """Run ``work(sync_connection)`` in a transaction of its own, as the store's migrations run."""
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            return await conn.run_sync(work)
    finally:
        await engine.dispose()


def old_rows(metadata: MetaData) -> Any:
    """Fill ``metadata``'s tables (an old release's) with what that release would have written."""

    def fill(conn: Connection) -> None:
        metadata.create_all(conn)
        t = metadata.tables
        owned = {"owner": KEY_ID} if "owner" in t["kgw_sessions"].c else {}
        session = {"gateway_name": "old", "image": "kernelgw/python:old", "language_info": '{"name": "python"}'}
        ended = {"created_at": NOW - timedelta(hours=2), "ended_at": NOW - timedelta(hours=1), "end_reason": "deleted"}
        still_open = {"created_at": NOW - timedelta(minutes=5), "ended_at": None, "end_reason": None}
        conn.execute(
            insert(t["kgw_sessions"]),
            [{"id": SESSION, **session, **ended, **owned}, {"id": OPEN_SESSION, **session, **still_open, **owned}],
        )
        conn.execute(
            insert(t["kgw_executions"]),
            [
                {
                    "session_id": SESSION,
                    "position": position,
                    "execution_id": f"e{position}",
                    "seq": 1 + 3 * position,
                    "code": code,
                    "status": status,
                    "execution_count": position + 1,
                    "started_at": NOW - timedelta(hours=2) + timedelta(seconds=position),
                    "duration_ms": 4.5,
                    "reason": None,
                    "state_lost": False,
                    "events": json.dumps(
                        [{"type": "queued", "seq": 1 + 3 * position, "execution_id": f"e{position}", "code": code}]
                    ),
                }
                for position, (code, status) in enumerate([("x = 1", "ok"), ("1 / 0", "error")])
            ],
        )
        conn.execute(
            insert(t["kgw_notes"]),
            {"session_id": SESSION, "after_seq": 3, "markdown": "# ünïcode ✓", "created_at": NOW - timedelta(hours=2)},
        )
        if "kgw_api_keys" in t:
            conn.execute(
                insert(t["kgw_api_keys"]),
                {
                    "id": KEY_ID,
                    "name": "alice",
                    "secret_sha256": "0" * 64,
                    "role": "admin",
                    "quotas": json.dumps({"max_sessions": 3}),
                    "created_at": NOW - timedelta(days=1),
                },
            )
            conn.execute(
                insert(t["kgw_audit"]),
                {"at": NOW - timedelta(hours=1), "kind": "session_deleted", "key_id": KEY_ID, "session_id": SESSION},
            )

    return fill


def session_columns(conn: Connection) -> set[str]:
    return {c["name"] for c in inspect(conn).get_columns("kgw_sessions")}


def execution_columns(conn: Connection) -> set[str]:
    return {c["name"] for c in inspect(conn).get_columns("kgw_executions")}


async def assert_at_head_as_a_new_database_would_be(url: str) -> None:
    assert await on(url, migrate.current_revision) == migrate.head()
    assert await on(url, migrate.differences) == []
    assert {"container_id", "kernel", "execution_count", "last_seq"} <= await on(url, session_columns)
    assert {"kernel_id", "replay_of", "no_replay"} <= await on(url, execution_columns)
    versions = await on(url, lambda c: c.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all())
    assert versions == [migrate.head()]


async def started(url: str, name: str = "migrated") -> Store:
    store = Store(url, gateway_name=name, purge_interval_s=0)
    await store.start()
    assert store.available, "the store could not set its database up (see the log)"
    return store


async def test_a_previous_release_database_is_upgraded_and_reads_as_before(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    await on(url, old_rows(previous_schema.metadata))
    with caplog.at_level(logging.INFO, logger="kernelgw.storage"):
        store = await started(url, name="old")
    assert f"schema upgraded from 0001 (tables made before migrations) to {migrate.head()}" in caplog.text
    try:
        record = await store.get_session(SESSION)
        assert record is not None
        assert (record.gateway_name, record.image, record.owner) == ("old", "kernelgw/python:old", KEY_ID)
        assert (record.created_at, record.ended_at) == (NOW - timedelta(hours=2), NOW - timedelta(hours=1))
        assert (record.end_reason, record.language_info) == ("deleted", {"name": "python"})
        executions = await store.list_executions(SESSION)
        assert [(e.position, e.execution_id, e.code, e.status, e.execution_count) for e in executions] == [
            (0, "e0", "x = 1", "ok", 1),
            (1, "e1", "1 / 0", "error", 2),
        ]
        assert executions[1].started_at == NOW - timedelta(hours=2) + timedelta(seconds=1)
        assert [e.type for e in executions[1].events] == ["queued"]
        [note] = await store.list_notes(SESSION)
        assert (note.after_seq, note.markdown) == (3, "# ünïcode ✓")
        key = await KeyStore(store).get(KEY_ID)
        assert key is not None and (key.name, key.role, key.quotas) == ("alice", "admin", KeyQuotas(max_sessions=3))
        [row] = await audit.query(store, session_id=SESSION)
        assert (row.kind, row.key_id, row.at) == ("session_deleted", KEY_ID, NOW - timedelta(hours=1))
        # a session the old release left open has no kernel to reattach: ended, as before migrations
        assert await store.open_sessions() == []
        lost = await store.get_session(OPEN_SESSION)
        assert lost is not None and lost.end_reason == CRASHED_REASON
        # and the store writes into the upgraded tables
        new = stand_in_session(uuid.uuid4().hex)
        await store.session_started(new)
        await store.execution_finished(new, finished_execution("e9", "print(1)"))
        await store.add_note(SESSION, 9, "after the upgrade")
        assert [e.code for e in await store.list_executions(new.id)] == ["print(1)"]
        assert [n.markdown for n in await store.list_notes(SESSION)] == ["# ünïcode ✓", "after the upgrade"]
    finally:
        await store.close()
    await assert_at_head_as_a_new_database_would_be(url)

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kernelgw.storage"):
        again = await started(url, name="old")
    try:
        assert "schema upgraded" not in caplog.text  # a second start changes nothing
        assert len(await again.list_executions(SESSION)) == 2
    finally:
        await again.close()
    assert not (await on(url, migrate.upgrade)).changed


async def test_a_reattach_release_database_is_upgraded_and_its_executions_are_in_no_lineage(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Revision 0002 (sessions keep their kernel) to recovery by replay: old rows
    read as before, name no kernel and are neither replayed nor marked."""

    def made_by_0002(conn: Connection) -> None:
        old_rows(previous_schema.REATTACH_RELEASE)(conn)
        command.stamp(migrate.alembic_config(conn), REATTACH)

    await on(url, made_by_0002)
    with caplog.at_level(logging.INFO, logger="kernelgw.storage"):
        store = await started(url, name="old")
    try:
        executions = await store.list_executions(SESSION)
        assert [(e.code, e.status, e.kernel_id, e.replay_of, e.replayable) for e in executions] == [
            ("x = 1", "ok", None, None, True),
            ("1 / 0", "error", None, None, True),
        ]
        [note] = await store.list_notes(SESSION)
        assert note.markdown == "# ünïcode ✓"
    finally:
        await store.close()
    await assert_at_head_as_a_new_database_would_be(url)


async def test_a_first_release_database_gets_owners_keys_and_audit(url: str) -> None:
    await on(url, old_rows(previous_schema.FIRST_RELEASE))
    store = await started(url)
    try:
        record = await store.get_session(SESSION)
        assert record is not None and record.owner is None and record.image == "kernelgw/python:old"
        assert [e.code for e in await store.list_executions(SESSION)] == ["x = 1", "1 / 0"]
        assert [n.markdown for n in await store.list_notes(SESSION)] == ["# ünïcode ✓"]
        key, _ = await KeyStore(store).create("bob")
        assert [k.id for k in await KeyStore(store).list()] == [key.id]
        audit.record(store, audit.AuditRecord(at=NOW, kind="key_created", key_id=key.id))
        assert [r.kind for r in await audit.query(store, key_id=key.id)] == ["key_created"]
    finally:
        await store.close()
    await assert_at_head_as_a_new_database_would_be(url)


async def test_a_new_database_ends_at_head(url: str) -> None:
    store = await started(url)
    await store.close()
    await assert_at_head_as_a_new_database_would_be(url)


async def test_gateways_starting_at_once_on_one_new_database_all_come_up(url: str) -> None:
    """The upgrade takes turns (an advisory lock on PostgreSQL, ``BEGIN IMMEDIATE`` on
    SQLite): without it, concurrent CREATE TABLEs fail all but one gateway."""
    stores = [Store(url, gateway_name=f"g{i}", purge_interval_s=0) for i in range(4)]
    await asyncio.gather(*(s.start() for s in stores))
    try:
        assert all(s.available for s in stores)
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    await assert_at_head_as_a_new_database_would_be(url)


async def test_an_output_chunks_database_is_upgraded_and_its_sessions_have_no_terms(url: str) -> None:
    """0007 to session terms (0008): an open session with a kernel to reattach and
    an ended one read as before, with no metadata, no lease and no access hash;
    the reattached one then takes a lease."""
    from kernelgw.storage.migrations import OUTPUT_CHUNKS, SESSION_TERMS

    kernel = {
        "kernel_id": "k1",
        "conn_dir": "/tmp/none",
        "connection": {"key": "secret", "transport": "ipc"},
        "spec": {
            "session_id": OPEN_SESSION,
            "image": "kernelgw/python:old",
            "memory_mb": 512,
            "cpus": 1.0,
            "pids_limit": 64,
            "tmp_size_mb": 16,
            "workspace_size_mb": 16,
            "shm_size_mb": 16,
        },
        "exec_timeout_s": 30.0,
    }

    def made_by_0007(conn: Connection) -> None:
        command.upgrade(migrate.alembic_config(conn), OUTPUT_CHUNKS)
        base = {"gateway_name": "old", "image": "kernelgw/python:old", "language_info": "{}", "owner": KEY_ID}
        conn.execute(
            text(
                "INSERT INTO kgw_sessions (id, gateway_name, image, created_at, ended_at, end_reason, "
                "language_info, owner, container_id, kernel, execution_count, last_seq) VALUES "
                "(:id, :gateway_name, :image, :created_at, :ended_at, :end_reason, :language_info, :owner, "
                ":container_id, :kernel, :execution_count, :last_seq)"
            ),
            [
                {
                    "id": SESSION,
                    **base,
                    "created_at": NOW - timedelta(hours=2),
                    "ended_at": NOW - timedelta(hours=1),
                    "end_reason": "deleted",
                    "container_id": None,
                    "kernel": None,
                    "execution_count": None,
                    "last_seq": None,
                },
                {
                    "id": OPEN_SESSION,
                    **base,
                    "created_at": NOW - timedelta(minutes=5),
                    "ended_at": None,
                    "end_reason": None,
                    "container_id": "c1",
                    "kernel": json.dumps(kernel),
                    "execution_count": 3,
                    "last_seq": 9,
                },
            ],
        )

    await on(url, made_by_0007)
    store = await started(url, name="old")
    try:
        ended = await store.get_session(SESSION)
        assert ended is not None and (ended.end_reason, ended.owner, ended.metadata) == ("deleted", KEY_ID, {})
        [stored] = await store.open_sessions()
        assert (stored.session_id, stored.execution_count, stored.last_seq) == (OPEN_SESSION, 3, 9)
        assert (stored.metadata, stored.lease_until, stored.on_lease_end, stored.access_sha256) == (
            {},
            None,
            "end",
            None,
        )
        reattached = stand_in_session(OPEN_SESSION)
        reattached.lease_until = NOW + timedelta(minutes=10)
        await store.lease_changed(reattached)
        value = await on(
            url, lambda c: c.execute(text(f"SELECT lease_until FROM kgw_sessions WHERE id = '{OPEN_SESSION}'")).scalar()
        )
        assert value is not None
    finally:
        await store.close()
    assert await on(url, migrate.current_revision) == SESSION_TERMS
    await assert_at_head_as_a_new_database_would_be(url)
