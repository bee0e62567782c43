"""Shared by the E2B face's in-process tests: a sandbox of the module's gateway
(each test module brings its own ``gw``), deleted after the test if still there."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kernelgw.runtime.session import KernelSession
from tests.unit.server.e2b.test_interpreter import Gateway


@pytest.fixture
async def sandbox(gw: Gateway) -> AsyncIterator[tuple[KernelSession, str]]:
    session, token = await gw.sandbox()
    yield session, token
    if session.id in {s.id for s in gw.state.manager.list()}:
        await gw.state.manager.delete(session.id)
