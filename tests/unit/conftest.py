"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.local_backend import LocalBackend


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
