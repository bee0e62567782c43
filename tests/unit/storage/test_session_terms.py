"""A session's terms (labels, lease, access hash) in its row, on a real SQLite file
and a real PostgreSQL: written at creation, at a lease change (awaited) and with
the kernel (a pause clears the lease), and read back as a restarted gateway
reads them (`Store.open_sessions`) and as history shows them."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import select, update

from kernelgw.runtime.backends.base import KernelHandle, KernelSpec
from kernelgw.runtime.lease import access_sha256
from kernelgw.runtime.recorder import StoredSession
from kernelgw.storage import schema
from kernelgw.storage.store import Store


@pytest.fixture
def store(dialect_store: Store) -> Store:
    """Each test runs on SQLite and on PostgreSQL (tests/unit/conftest.py)."""
    return dialect_store


def reattachable(**terms: Any) -> Any:
    """What the store reads of a session with a kernel to reattach, and ``terms``."""
    sid = str(uuid.uuid4())
    spec = KernelSpec(
        session_id=sid,
        image="img:test",
        memory_mb=512,
        cpus=1.0,
        pids_limit=64,
        tmp_size_mb=16,
        workspace_size_mb=16,
        shm_size_mb=16,
    )
    handle = KernelHandle("k1", sid, "c1", Path("/tmp/none"), {"key": "secret", "transport": "ipc"})
    base: dict[str, Any] = {"metadata": {}, "lease_until": None, "on_lease_end": "end", "access_sha256": None}
    return SimpleNamespace(
        id=sid,
        spec=spec,
        owner="key1",
        created_at=datetime.now(UTC),
        kernel_info={},
        handle=handle,
        paused_from=None,
        lineage_kernels=("k1",),
        config=SimpleNamespace(exec_timeout_s=30.0, auto_replay=False),
        execution_count=0,
        resume_seq=0,
        **{**base, **terms},
    )


async def reread(store: Store, session: Any) -> StoredSession:
    (stored,) = [s for s in await store.open_sessions() if s.session_id == session.id]
    return stored


async def test_terms_written_at_creation_read_back_as_given(store: Store) -> None:
    until = datetime.now(UTC).replace(microsecond=123456) + timedelta(seconds=90)
    labels = {"user": "ünïcode ✓", "k" * 128: "v" * 1024, "empty": ""}
    session = reattachable(
        metadata=labels, lease_until=until, on_lease_end="pause", access_sha256=access_sha256("token")
    )
    plain = reattachable()
    await store.session_started(session)
    await store.session_started(plain)
    stored = await reread(store, session)
    assert (stored.metadata, stored.lease_until, stored.on_lease_end, stored.access_sha256) == (
        labels,
        until,
        "pause",
        access_sha256("token"),
    )
    assert stored.lease_until is not None and stored.lease_until.tzinfo is not None
    none = await reread(store, plain)
    assert (none.metadata, none.lease_until, none.on_lease_end, none.access_sha256) == ({}, None, "end", None)
    record = await store.get_session(session.id)
    assert record is not None and record.metadata == labels
    engine = await store.read_engine()
    async with engine.connect() as conn:
        row = (await conn.execute(select(schema.sessions).where(schema.sessions.c.id == session.id))).one()
    assert "token" not in str(tuple(row))  # only its hash is kept


async def test_a_lease_change_is_committed_when_acknowledged_and_a_pause_clears_it(store: Store) -> None:
    session = reattachable(lease_until=datetime.now(UTC) + timedelta(seconds=5), on_lease_end="pause")
    await store.session_started(session)
    later = datetime.now(UTC).replace(microsecond=7) + timedelta(hours=2)
    session.lease_until = later
    await store.lease_changed(session)
    # read without the store's flush: lease_changed returned, so it is committed
    engine = store._db.engine
    assert engine is not None
    async with engine.connect() as conn:
        value = (
            await conn.execute(select(schema.sessions.c.lease_until).where(schema.sessions.c.id == session.id))
        ).scalar_one()
    assert value is not None and value.replace(tzinfo=value.tzinfo or UTC) == later
    # a pause: the kernel's values are written with the lease, cleared
    session.lease_until, session.paused_from, session.handle = None, session.handle, None
    store.kernel_changed(session)
    stored = await reread(store, session)
    assert stored.paused and stored.lease_until is None and stored.on_lease_end == "pause"


async def test_unreadable_stored_metadata_reads_back_as_none(store: Store) -> None:
    session = reattachable(metadata={"a": "b"})
    await store.session_started(session)
    engine = await store.read_engine()
    async with engine.begin() as conn:
        await conn.execute(
            update(schema.sessions).where(schema.sessions.c.id == session.id).values(session_metadata="{not json")
        )
    assert (await reread(store, session)).metadata == {}


async def test_lease_writes_commit_in_the_order_they_were_made(store: Store) -> None:
    """A resume queues the kernel (no lease) and the face at once sets a lease,
    awaited: in one batch of the writer the awaited row went first (an answer),
    then the resume's row cleared the lease (seen in the integration test). And
    a lease set just before a pause is cleared by it."""
    session = reattachable(on_lease_end="pause")
    await store.session_started(session)
    later = datetime.now(UTC) + timedelta(minutes=5)
    store.kernel_changed(session)  # the resume: no lease runs
    session.lease_until = later
    await store.lease_changed(session)  # the face's set_lease right after
    assert (await reread(store, session)).lease_until == later

    session.lease_until = later + timedelta(minutes=1)
    lease = asyncio.ensure_future(store.lease_changed(session))  # queued, not yet committed
    session.lease_until = None
    store.kernel_changed(session)  # a pause right after
    await lease
    assert (await reread(store, session)).lease_until is None
