"""Fixtures of the unit tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kernelgw.storage.store import Store
from tests.support.local_backend import LocalBackend
from tests.support.postgres import postgres_url


@pytest.fixture
async def local_backend() -> AsyncIterator[LocalBackend]:
    """Kernels as host subprocesses (no engine). Afterwards no kernel process may
    be left running, as the integration suite checks that no container is left."""
    be = LocalBackend()
    try:
        yield be
        assert not be.running(), f"kernel processes left running: {be.running()}"
    finally:
        await be.kill_all()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A history database of each dialect: SQLite in the test's directory, and
    the real PostgreSQL server (skipped without ``KERNELGW_TEST_DATABASE_URL``)."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'history.db'}"
    return postgres_url()


@pytest.fixture
async def dialect_store(database_url: str) -> AsyncIterator[Store]:
    """A started store on ``database_url``, under a gateway name of its own."""
    store = Store(database_url, gateway_name=f"unit{uuid.uuid4().hex[:8]}", purge_interval_s=0)
    await store.start()
    try:
        yield store
    finally:
        await store.close()
