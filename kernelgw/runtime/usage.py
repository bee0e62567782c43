"""What a session's kernel uses of its limits now: CPU, memory and disk (E2B's
sandbox metrics).

CPU is a rate: two readings of the engine's counters (`Backend.counters`), at
least ``SAMPLE_S`` apart, the workspace's disk read in between (the image's
``kernelgw_kernel.usage`` helper). The percentage is of the session's CPU
quota (``cpus``): 100 is all of it, whatever the host has.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

from kernelgw.errors import BackendError
from kernelgw.runtime.backends.base import Backend, KernelCounters, KernelHandle, KernelSpec
from kernelgw.runtime.workspace import PYTHON, HelperAnswer

USAGE_HELPER = [PYTHON, "-I", "-m", "kernelgw_kernel.usage"]
SAMPLE_S = 0.25
"""The least time between the two CPU readings (shorter is noisier)."""
MIB = 1024 * 1024


@dataclass(frozen=True)
class KernelUsage:
    cpu_count: int
    cpu_used_pct: float
    memory_used: int
    memory_total: int
    memory_cache: int
    disk_used: int
    disk_total: int


async def measure(backend: Backend, handle: KernelHandle, spec: KernelSpec, sample_s: float = SAMPLE_S) -> KernelUsage:
    """The kernel's use now (about ``sample_s`` to read); `KernelDied` when it is gone."""
    first = await backend.counters(handle)
    disk_used, disk_total = await disk(backend, handle)
    left = sample_s - (time.monotonic() - first.at)
    if left > 0:
        await asyncio.sleep(left)
    second = await backend.counters(handle)
    return usage_from(first, second, spec, disk_used, disk_total)


async def disk(backend: Backend, handle: KernelHandle, timeout: float = 30.0) -> tuple[int, int]:
    """The workspace's bytes in use and its size, as its file system counts them."""
    proc = await backend.exec(handle, USAGE_HELPER, timeout=timeout)  # the backend runs it clean (helper_command)
    try:
        answer = await HelperAnswer(proc).line()
    finally:
        await proc.close()
    try:
        return int(answer["disk_used"]), int(answer["disk_total"])
    except (KeyError, TypeError, ValueError):
        raise BackendError(f"The usage helper in the kernel container answered {str(answer)[:200]!r}.") from None


def usage_from(
    first: KernelCounters, second: KernelCounters, spec: KernelSpec, disk_used: int, disk_total: int
) -> KernelUsage:
    wall_ns = max(1.0, (second.at - first.at) * 1e9)
    quota = spec.cpus if spec.cpus and spec.cpus > 0 else 1.0
    used = max(0, second.cpu_ns - first.cpu_ns) / (wall_ns * quota) * 100
    configured = spec.memory_mb * MIB
    limit = second.memory_limit
    return KernelUsage(
        cpu_count=max(1, math.ceil(quota)),
        cpu_used_pct=round(min(100.0, used), 2),
        memory_used=second.memory_bytes,
        memory_total=min(limit, configured) if limit else configured,
        memory_cache=second.cache_bytes,
        disk_used=disk_used,
        disk_total=disk_total,
    )
