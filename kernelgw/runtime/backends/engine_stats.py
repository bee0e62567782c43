"""The engine's stats of a container (``GET /containers/{id}/stats``) as
`KernelCounters`: cgroup v1 and v2 spell memory differently.

Memory in use leaves out the page cache the kernel can drop, as ``docker
stats`` does (v1: ``total_inactive_file``, v2: ``inactive_file``); files in the
session's tmpfs workspace are not droppable and count. Under gVisor the engine
reports the sandbox's cgroup, which holds gVisor's own memory too.
"""

from __future__ import annotations

from typing import Any

from kernelgw.runtime.backends.base import KernelCounters


def counters_from_stats(stats: dict[str, Any], at: float) -> KernelCounters:
    cpu = (stats.get("cpu_stats") or {}).get("cpu_usage") or {}
    memory = stats.get("memory_stats") or {}
    detail = memory.get("stats") or {}
    usage = int(memory.get("usage") or 0)
    inactive = int(detail.get("total_inactive_file", detail.get("inactive_file", 0)) or 0)
    cache = int(detail.get("cache", detail.get("file", 0)) or 0)
    limit = memory.get("limit")
    return KernelCounters(
        at=at,
        cpu_ns=int(cpu.get("total_usage") or 0),
        memory_bytes=max(0, usage - inactive),
        cache_bytes=cache,
        memory_limit=int(limit) if limit else None,
    )
