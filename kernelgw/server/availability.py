"""Whether the gateway takes new work: not while it drains, not while its store cannot write.

A session or a cell admitted during a storage fault would be answered but not
recorded; one admitted during a drain would be cut off by the exit. Both are
refused with 503 and ``Retry-After`` instead, and ``/readyz`` says why.
"""

from __future__ import annotations

from kernelgw.errors import GatewayDraining, StorageUnavailable
from kernelgw.server.state import GatewayState

RETRY_AFTER_S = {GatewayDraining: 2, StorageUnavailable: 5}
"""The ``Retry-After`` seconds of the refusals."""


def check_available(state: GatewayState) -> None:
    """Raise the refusal of a new session or execution, if any."""
    if state.drain.draining:
        raise GatewayDraining(
            "The gateway is shutting down (draining); retry shortly: a restarted or another gateway will answer."
        )
    health = state.store.health
    if not health.ok:
        raise StorageUnavailable(
            f"The history storage {health.describe()}; new sessions and executions are refused until it "
            "can write again. Retry later."
        )


def unready_reasons(state: GatewayState) -> list[str]:
    """Why a load balancer should send no new work here (empty: ready)."""
    reasons = []
    if state.drain.draining:
        reasons.append("draining: the gateway is shutting down")
    if not state.store.health.ok:
        reasons.append(f"storage: {state.store.health.describe()}")
    return reasons
