"""Sessions on real ipykernel subprocesses (tests/support/local_backend.py), no engine.

Every test gets its own backend; afterwards no kernel process may be left
running, as the integration suite checks that no container is left.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kernelgw.runtime.backends.base import KernelSpec
from kernelgw.runtime.session import KernelSession, SessionConfig
from kernelgw.storage.store import Store
from tests.support.local_backend import LocalBackend, image_helper

SessionFactory = Callable[..., Awaitable[KernelSession]]


@pytest.fixture(scope="module")
def launcher() -> Iterator[ModuleType]:
    """The kernel image's ``kernelgw_kernel.launcher``, imported from images/python."""
    with image_helper("launcher") as module:
        yield module


def spec(session_id: str = "s", **overrides: Any) -> KernelSpec:
    base: dict[str, Any] = dict(
        session_id=session_id,
        image="local",
        memory_mb=512,
        cpus=1.0,
        pids_limit=64,
        tmp_size_mb=16,
        workspace_size_mb=16,
        shm_size_mb=16,
    )
    base.update(overrides)
    return KernelSpec(**base)


def session_config(**overrides: Any) -> SessionConfig:
    base: dict[str, Any] = dict(
        exec_timeout_s=30,
        max_exec_timeout_s=60,
        interrupt_grace_s=2,
        kernel_start_timeout_s=30,
        max_output_bytes=1024 * 1024,
        replay_buffer=2000,
        subscriber_queue=1000,
        state_poll_s=0.1,
    )
    base.update(overrides)
    return SessionConfig(**base)


@pytest.fixture
async def new_session(local_backend: LocalBackend) -> AsyncIterator[SessionFactory]:
    """Start a session with ``session_config(**overrides)``; closed after the test."""
    sessions: list[KernelSession] = []

    async def start(**overrides: Any) -> KernelSession:
        sid = uuid.uuid4().hex
        session = KernelSession(sid, spec(sid), local_backend, session_config(**overrides))
        sessions.append(session)
        await session.start()
        return session

    yield start
    for session in sessions:
        await session.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A real history store (SQLite in the test's directory), for sessions that record."""
    store = Store(f"sqlite:///{tmp_path / 'history.db'}", gateway_name="unit", purge_interval_s=0)
    await store.start()
    yield store
    await store.close()


async def recording(new_session: SessionFactory, store: Store) -> KernelSession:
    """A new session whose cells are recorded in ``store``."""
    session = await new_session()
    session.recorder = store
    await store.session_started(session)
    return session
