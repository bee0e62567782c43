"""API keys and the audit log on real SQLite and a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from kernelgw.keys import KeyQuotas, parse_key
from kernelgw.storage import Store, audit
from kernelgw.storage.keys import KeyStore
from kernelgw.storage.store import async_database_url
from tests.integration.test_history import database_url  # noqa: F401  (the sqlite/postgres fixture)

pytestmark = pytest.mark.integration


PREFIX = "kst-"
"""Names of the keys these tests make: removed afterwards, since other tests'
gateways share the PostgreSQL database and would otherwise require keys."""


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:  # noqa: F811
    s = Store(database_url, gateway_name=f"keys{os.getpid()}")
    await s.start()
    yield s
    engine = await s.read_engine()
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM kgw_api_keys WHERE name LIKE :p"), {"p": PREFIX + "%"})
    await s.close()


async def test_keys_are_created_listed_revoked_and_never_stored_in_clear(store: Store) -> None:
    keys = KeyStore(store)
    before = await keys.count()
    key, text_ = await keys.create(PREFIX + "alice", quotas=KeyQuotas(max_sessions=3, executions_per_minute=30))
    parsed = parse_key(text_)
    assert parsed is not None and parsed[0] == key.id
    assert key.matches(parsed[1]) and key.active
    got = await keys.get(key.id)
    assert got is not None and got.quotas == KeyQuotas(max_sessions=3, executions_per_minute=30)
    assert got.role == "user" and got.matches(parsed[1])
    engine = await store.read_engine()
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT * FROM kgw_api_keys WHERE id = :i"), {"i": key.id})).mappings().one()
    assert parsed[1] not in " ".join(str(v) for v in row.values())
    admin, _ = await keys.create(PREFIX + "ops", role="admin")
    assert (await keys.get(admin.id)).role == "admin"  # type: ignore[union-attr]
    revoked = await keys.revoke(key.id)
    assert revoked is not None and not revoked.active
    assert await keys.revoke("000000000000") is None
    assert await keys.count() == before + 2  # revoked keys still count: auth stays on
    active = {k.id for k in await keys.list(include_revoked=False)}
    assert key.id not in active and admin.id in active
    with pytest.raises(ValueError):
        await keys.create(PREFIX + "x", role="root")  # type: ignore[arg-type]


async def test_audit_rows_are_written_and_filtered(store: Store) -> None:
    session = uuid.uuid4().hex
    t0 = datetime.now(UTC) - timedelta(seconds=1)
    for i, (kind, key_id) in enumerate(
        [("session_created", "k1"), ("execution", "k1"), ("execution", "k2"), ("session_deleted", "k1")]
    ):
        audit.record(
            store,
            audit.AuditRecord(
                at=t0 + timedelta(milliseconds=10 * i),
                kind=kind,
                key_id=key_id,
                session_id=session,
                code="print(1)" if kind == "execution" else None,
                code_sha256=audit.code_sha256("print(1)") if kind == "execution" else None,
                status="ok" if kind == "execution" else None,
            ),
        )
    rows = await audit.query(store, session_id=session)
    assert [r.kind for r in rows] == ["session_created", "execution", "execution", "session_deleted"]
    assert rows[1].code_sha256 == audit.code_sha256("print(1)") and rows[1].at.tzinfo is not None
    assert [r.key_id for r in await audit.query(store, session_id=session, kind="execution")] == ["k1", "k2"]
    assert len(await audit.query(store, session_id=session, key_id="k1")) == 3
    assert len(await audit.query(store, session_id=session, limit=2)) == 2
    later = await audit.query(store, session_id=session, since=t0 + timedelta(milliseconds=15))
    assert [r.kind for r in later] == ["execution", "session_deleted"]
    assert await audit.query(store, session_id=session, until=t0) == []


async def test_old_audit_rows_are_purged(store: Store) -> None:
    session = uuid.uuid4().hex
    store.audit_retention_days = 30
    old = datetime.now(UTC) - timedelta(days=31)
    audit.record(store, audit.AuditRecord(at=old, kind="session_created", session_id=session))
    audit.record(store, audit.AuditRecord(at=datetime.now(UTC), kind="session_deleted", session_id=session))
    await store.flush()
    await store.purge()
    assert [r.kind for r in await audit.query(store, session_id=session)] == ["session_deleted"]


async def test_a_database_from_before_ownership_gets_the_owner_column(database_url: str, tmp_path: Path) -> None:  # noqa: F811
    """An existing history database (no ``owner`` column) is migrated in place."""
    url = async_database_url(database_url)
    if url.startswith("sqlite"):
        url = f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    else:  # a database of its own, so the shared one is untouched
        name = f"kgw_migrate_{os.getpid()}"
        admin = create_async_engine(url, isolation_level="AUTOCOMMIT")
        async with admin.connect() as conn:
            await conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
            await conn.execute(text(f"CREATE DATABASE {name}"))
        await admin.dispose()
        url = make_url(url).set(database=name).render_as_string(hide_password=False)
    old = create_async_engine(url)
    async with old.begin() as conn:
        await conn.execute(
            text(
                "CREATE TABLE kgw_sessions (id VARCHAR(64) PRIMARY KEY, gateway_name VARCHAR(255) NOT NULL, "
                "image VARCHAR(512) NOT NULL, created_at TIMESTAMP NOT NULL, ended_at TIMESTAMP, "
                "end_reason TEXT, language_info TEXT NOT NULL)"
            )
        )
        await conn.execute(
            text("INSERT INTO kgw_sessions VALUES ('s1', 'g', 'img', CURRENT_TIMESTAMP, NULL, NULL, '{}')")
        )
    await old.dispose()
    store = Store(url, gateway_name="other")
    await store.start()
    try:
        record = await store.get_session("s1")
        assert record is not None and record.owner is None and record.image == "img"
    finally:
        await store.close()
    await asyncio.sleep(0)
