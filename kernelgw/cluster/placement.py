"""Where a new session's kernel runs under ``placement=load``."""

from __future__ import annotations

from collections.abc import Sequence

from kernelgw.cluster.registry import Gateway

MEMORY_TOLERANCE_MB = 1024
"""Free memory within this of the most is as good as the most: readings taken
seconds apart on hosts of the same size differ by noise, which must not bounce
creates away from the gateway that received them."""


def least_loaded(gateways: Sequence[Gateway], prefer: str) -> Gateway | None:
    """The live gateway with the fewest running sessions, then the most free
    memory (within `MEMORY_TOLERANCE_MB` counts as a tie); on a tie ``prefer``
    (the receiving gateway: no forwarding), else the most free memory, then by name."""
    if not gateways:
        return None
    fewest = min(g.sessions for g in gateways)
    candidates = [g for g in gateways if g.sessions == fewest]
    most = max(g.free_memory_mb or 0 for g in candidates)
    close = [g for g in candidates if (g.free_memory_mb or 0) >= most - MEMORY_TOLERANCE_MB]
    for g in close:
        if g.name == prefer:
            return g
    return min(close, key=lambda g: (-(g.free_memory_mb or 0), g.name))
