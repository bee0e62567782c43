"""A kernel's use of its limits (E2B's sandbox metrics): the engine's stats read
as counters (cgroup v1 and v2), a CPU rate from two readings, and a real kernel
(local backend) measured while idle and while it spins, its workspace's disk
read by the image's helper (here on the host's file system; the real tmpfs
and its growth: tests/integration/e2b/test_metrics.py)."""

from __future__ import annotations

import asyncio

from kernelgw.runtime.backends.base import KernelCounters
from kernelgw.runtime.backends.engine_stats import counters_from_stats
from kernelgw.runtime.usage import MIB, measure, usage_from
from tests.support.waiting import until
from tests.unit.runtime.conftest import SessionFactory, spec
from tests.unit.runtime.test_session import run

V1 = {
    "cpu_stats": {"cpu_usage": {"total_usage": 308_276_079}},
    "memory_stats": {
        "usage": 38_920_192,
        "limit": 536_870_912,
        "stats": {"cache": 32_768, "total_inactive_file": 4096, "rss": 36_044_800},
    },
}
V2 = {
    "cpu_stats": {"cpu_usage": {"total_usage": 5_000_000}},
    "memory_stats": {
        "usage": 10_000_000,
        "limit": 268_435_456,
        "stats": {"file": 2_000_000, "inactive_file": 1_000_000},
    },
}


def test_the_engines_stats_are_read_for_either_cgroup_version() -> None:
    v1 = counters_from_stats(V1, 1.0)
    assert (v1.cpu_ns, v1.memory_bytes, v1.cache_bytes, v1.memory_limit) == (
        308_276_079,
        38_916_096,
        32_768,
        536_870_912,
    )
    v2 = counters_from_stats(V2, 2.0)
    assert (v2.cpu_ns, v2.memory_bytes, v2.cache_bytes, v2.memory_limit) == (
        5_000_000,
        9_000_000,
        2_000_000,
        268_435_456,
    )
    empty = counters_from_stats({}, 3.0)  # a container that stopped between two questions
    assert (empty.cpu_ns, empty.memory_bytes, empty.memory_limit) == (0, 0, None)


def test_cpu_is_a_share_of_the_sessions_quota() -> None:
    first = KernelCounters(at=10.0, cpu_ns=0, memory_bytes=0, cache_bytes=0, memory_limit=None)
    half_a_core = KernelCounters(at=10.5, cpu_ns=250_000_000, memory_bytes=5 * MIB, cache_bytes=MIB, memory_limit=None)
    usage = usage_from(first, half_a_core, spec(cpus=1.0, memory_mb=512), 100, 1000)
    assert (usage.cpu_count, usage.cpu_used_pct) == (1, 50.0)
    assert (usage.memory_used, usage.memory_total, usage.memory_cache) == (5 * MIB, 512 * MIB, MIB)
    assert (usage.disk_used, usage.disk_total) == (100, 1000)
    two = usage_from(first, half_a_core, spec(cpus=2.0, memory_mb=512), 0, 0)
    assert (two.cpu_count, two.cpu_used_pct) == (2, 25.0)
    # more than the quota (a burst the engine allowed) reads as all of it; a lower limit wins
    burst = KernelCounters(at=10.5, cpu_ns=900_000_000, memory_bytes=0, cache_bytes=0, memory_limit=256 * MIB)
    capped = usage_from(first, burst, spec(cpus=1.0, memory_mb=512), 0, 0)
    assert capped.cpu_used_pct == 100.0 and capped.memory_total == 256 * MIB


async def test_a_kernel_is_measured_idle_and_spinning(new_session: SessionFactory) -> None:
    session = await new_session()
    idle = await session.usage()
    assert idle is not None
    assert idle.memory_used > 0 and idle.disk_total > 0 and 0 <= idle.disk_used <= idle.disk_total
    assert idle.cpu_count == max(1, int(session.spec.cpus + 0.999))
    spinning = asyncio.ensure_future(run(session, "import time\nend = time.time() + 4\nwhile time.time() < end: pass"))
    try:

        async def sent() -> bool:
            return session.state == "busy"

        await until(sent, "the spinning cell to be sent")
        assert session.handle is not None
        busy = await measure(session.backend, session.handle, session.spec, sample_s=1.0)
        assert busy.cpu_used_pct > 0
    finally:
        await spinning
