"""Where a new session's kernel runs under ``placement=load``."""

from __future__ import annotations

from collections.abc import Sequence

from kernelgw.cluster.registry import Gateway

MEMORY_STEP_MB = 512
"""Free memory is compared in steps of this size: readings taken seconds apart
on hosts of the same size differ by noise, which must not bounce creates."""


def least_loaded(gateways: Sequence[Gateway], prefer: str) -> Gateway | None:
    """The live gateway with the fewest running sessions, then the most free
    memory (in `MEMORY_STEP_MB` steps); on a tie ``prefer`` (the receiving
    gateway: no forwarding), then by name."""
    if not gateways:
        return None
    return min(
        gateways,
        key=lambda g: (g.sessions, -((g.free_memory_mb or 0) // MEMORY_STEP_MB), g.name != prefer, g.name),
    )
