"""Where a new session's kernel runs under ``placement=load``."""

from __future__ import annotations

from collections.abc import Sequence

from kernelgw.cluster.registry import Gateway


def least_loaded(gateways: Sequence[Gateway], prefer: str) -> Gateway | None:
    """The live gateway with the fewest running sessions, then the most free
    memory; on a tie ``prefer`` (the receiving gateway: no forwarding), then by name."""
    if not gateways:
        return None
    return min(gateways, key=lambda g: (g.sessions, -(g.free_memory_mb or 0), g.name != prefer, g.name))
