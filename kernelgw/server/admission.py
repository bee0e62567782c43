"""What every new execution must pass, on REST and WebSocket alike: code size,
the optional code policy, and the key's executions-per-minute quota."""

from __future__ import annotations

import asyncio

from kernelgw.errors import PayloadTooLarge, PolicyViolation, RateLimited
from kernelgw.kernels import DEFAULT_KERNEL, profile
from kernelgw.keys import Principal
from kernelgw.server import policy
from kernelgw.server.availability import check_available
from kernelgw.server.state import GatewayState


def check_code_size(limit: int, code: str) -> None:
    if len(code.encode("utf-8", "surrogatepass")) > limit:
        raise PayloadTooLarge(f"code is larger than the gateway's limit of {limit} bytes")


INLINE_POLICY_BYTES = 16 * 1024
"""Cells up to this size are parsed on the event loop (well under a millisecond);
larger ones in a thread: parsing a 1 MiB cell takes seconds of CPU."""


async def check_code(state: GatewayState, code: str, where: str = "", kernel: str = DEFAULT_KERNEL) -> None:
    """Size and code policy (also for cells a restore replays). The policy reads
    Python: other languages' cells are not checked by it (a Ruby ``eval(...)``
    would look like Python's)."""
    check_code_size(state.settings.max_code_bytes, code)
    code_policy = state.code_policy
    if code_policy.enabled and profile(kernel).python:
        try:
            if len(code) <= INLINE_POLICY_BYTES:
                code_policy.check(code)
            else:
                await asyncio.to_thread(code_policy.check, code)
        except policy.PolicyViolation as exc:
            raise PolicyViolation(f"{where}{exc}") from None


async def admit(state: GatewayState, principal: Principal, code: str, kernel: str = DEFAULT_KERNEL) -> None:
    """Raise the error that refuses this execution, if any."""
    settings = state.settings
    check_available(state)
    await check_code(state, code, kernel=kernel)
    per_minute = principal.quotas.executions_per_minute or settings.executions_per_minute
    if per_minute is not None:
        wait = state.rate_limiter.acquire(principal.key_id or "", per_minute)
        if wait > 0:
            raise RateLimited(f"This API key may start {per_minute} executions per minute; retry in {wait:.1f}s.", wait)
