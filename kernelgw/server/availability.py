"""Whether the gateway takes new work: not while it drains, not while its store cannot write.

A session or a cell admitted during a storage fault would be answered but not
recorded; one admitted during a drain would be cut off by the exit. Both are
refused with 503 and ``Retry-After`` instead, and ``/readyz`` says why.
"""

from __future__ import annotations

import math

from kernelgw.errors import GatewayDraining, KernelGWError, RateLimited, StorageUnavailable
from kernelgw.server.state import GatewayState

RETRY_AFTER_S: dict[type[KernelGWError], int] = {GatewayDraining: 2, StorageUnavailable: 5}
"""The ``Retry-After`` seconds of the refusals."""
DEFAULT_RETRY_AFTER_S = 5
"""Every other 429 and 503 (session limit, engine or image missing): a client that
backs off by the header alone never hammers the gateway."""


def retry_after_s(exc: KernelGWError) -> int | None:
    """The ``Retry-After`` of an error's answer: on every 429 and 503, on nothing else."""
    if isinstance(exc, RateLimited):
        return max(1, math.ceil(exc.retry_after_s))
    if exc.status_code not in (429, 503):
        return None
    for kind, seconds in RETRY_AFTER_S.items():
        if isinstance(exc, kind):
            return seconds
    return DEFAULT_RETRY_AFTER_S


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
