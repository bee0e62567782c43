"""SessionManager on real kernel subprocesses: limits, ownership, idle reaping, the warm pool."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from kernelgw.config import Settings
from kernelgw.errors import KernelNotOffered, LimitExceeded, SessionLimitReached, SessionNotFound
from kernelgw.keys import KeyQuotas, Principal
from kernelgw.runtime.manager import SessionManager, SessionOptions
from kernelgw.runtime.metrics import Metrics
from tests.support.local_backend import LocalBackend

ManagerFactory = Callable[..., SessionManager]


@pytest.fixture
async def make_manager(local_backend: LocalBackend, tmp_path: Path) -> AsyncIterator[ManagerFactory]:
    managers: list[SessionManager] = []

    def make(**overrides: Any) -> SessionManager:
        base = {"data_dir": tmp_path, "max_memory_mb": 2048, "state_poll_s": 0.1, "pool_size": 0}
        settings = Settings(**{**base, **overrides})
        manager = SessionManager(settings, local_backend, metrics=Metrics())
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        await manager.shutdown()


async def wait_until(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def key(key_id: str, **quotas: Any) -> Principal:
    return Principal(key_id=key_id, name=key_id, role="user", quotas=KeyQuotas(**quotas))


async def test_options_outside_the_maximums_are_refused_before_a_kernel_starts(
    make_manager: ManagerFactory, local_backend: LocalBackend
) -> None:
    manager = make_manager(memory_mb=512, max_memory_mb=1024, max_cpus=2)
    for opts, message in [
        (SessionOptions(memory_mb=4096), "memory_mb"),
        (SessionOptions(memory_mb=10), "memory_mb"),
        (SessionOptions(cpus=8), "cpus"),
        (SessionOptions(timeout=10_000), "timeout"),
        (SessionOptions(image="evil/image"), "image"),
        (SessionOptions(runtime="kata"), "runtime"),
    ]:
        with pytest.raises(LimitExceeded, match=message):
            await manager.create(opts)
    with pytest.raises(LimitExceeded, match="memory_mb"):
        await manager.create(SessionOptions(memory_mb=900), key("k", max_memory_mb=512))
    assert local_backend.started == 0 and len(manager) == 0


async def test_a_session_runs_an_offered_kernel_from_that_kernel_s_image(
    make_manager: ManagerFactory, local_backend: LocalBackend
) -> None:
    manager = make_manager(kernels=["python3", "ruby"], kernel_images={"ruby": "me/ruby:1"})
    with pytest.raises(KernelNotOffered, match=r"kernel 'go' is not offered.*\['python3', 'ruby'\]"):
        await manager.create(SessionOptions(kernel="go"))
    # a Python image is no Ruby kernel, and the other way round
    with pytest.raises(LimitExceeded, match="image"):
        await manager.create(SessionOptions(kernel="ruby", image=manager.settings.image))
    with pytest.raises(LimitExceeded, match="image"):
        await manager.create(SessionOptions(image="me/ruby:1"))
    assert local_backend.started == 0
    ruby = await manager.create(SessionOptions(kernel="ruby"))
    assert (ruby.spec.kernel, ruby.spec.image, ruby.info()["kernel"]) == ("ruby", "me/ruby:1", "ruby")
    python = await manager.create()
    assert (python.spec.kernel, python.spec.image) == ("python3", manager.settings.image)


async def test_sessions_are_visible_to_their_key_only_and_counted_against_limits(
    make_manager: ManagerFactory, local_backend: LocalBackend
) -> None:
    manager = make_manager(max_sessions=2)
    alice, bob = key("alice", max_sessions=1), key("bob")
    mine = await manager.create(principal=alice)
    assert mine.owner == "alice" and manager.get(mine.id, alice) is mine
    with pytest.raises(SessionNotFound):
        manager.get(mine.id, bob)  # another key's session does not exist for bob
    assert manager.list(bob) == [] and manager.list(alice) == [mine]
    with pytest.raises(SessionLimitReached, match="API key"):
        await manager.create(principal=alice)
    await manager.create(principal=bob)
    with pytest.raises(SessionLimitReached, match="maximum of 2"):
        await manager.create(principal=bob)
    await manager.delete(mine.id)
    assert mine.state == "closed" and len(manager) == 1 and len(local_backend.running()) == 1
    with pytest.raises(SessionNotFound):
        await manager.delete(mine.id)


async def test_idle_sessions_are_reaped_unless_watched_or_busy(
    make_manager: ManagerFactory, local_backend: LocalBackend
) -> None:
    manager = make_manager(idle_timeout_s=0.2, reap_interval_s=0.05)
    idle, watched, busy = [await manager.create() for _ in range(3)]
    sub = watched.subscribe()
    running = busy.submit("import time\ntime.sleep(60)")
    await manager.start()  # the reaper loop
    await wait_until(lambda: len(manager) < 3)
    assert idle.state == "closed"
    assert {s.id for s in manager.list()} == {watched.id, busy.id}
    assert watched.state == "idle" and busy.state == "busy"
    watched.unsubscribe(sub)
    await wait_until(lambda: len(manager) < 2)
    assert watched.state == "closed"
    assert busy.state == "busy"
    await busy.interrupt()
    assert (await running.done).status == "interrupted"
    await wait_until(lambda: len(manager) == 0)
    assert local_backend.running() == []


async def test_a_warm_pool_hands_over_a_started_kernel_and_refills(
    make_manager: ManagerFactory, local_backend: LocalBackend
) -> None:
    manager = make_manager(pool_size=1)
    await manager.start()
    assert manager.metrics is not None
    registry = manager.metrics.registry

    def metric(name: str) -> float:
        value = registry.get_sample_value(name)
        assert value is not None, f"no metric {name}"
        return value

    await wait_until(lambda: metric("kernelgw_pool_ready") == 1)
    started = local_backend.started
    session = await manager.create(SessionOptions(env={"REGION": "eu"}))
    assert metric("kernelgw_pool_hits_total") == 1
    rec = session.submit("import os\nprint(os.environ['REGION'])")
    assert (await rec.done).status == "ok"
    assert session.execution_count == 1  # setting the environment left no trace in the history
    await wait_until(lambda: metric("kernelgw_pool_ready") == 1)
    assert local_backend.started == started + 1  # the refill
    cold = await manager.create(SessionOptions(memory_mb=300))  # no pool for this profile
    assert metric("kernelgw_pool_hits_total") == 1 and cold.spec.memory_mb == 300
