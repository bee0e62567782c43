"""E2B's sandbox metrics: CPU, memory and disk of a running sandbox, read from
the engine when asked (`KernelSession.usage`).

E2B's cloud samples every few seconds and answers a time range with the
samples in it; kernelgw keeps no history: an answer holds one reading, taken
now, if now is in the range asked for (none for a paused sandbox, which runs
nothing). ``GET /sandboxes/metrics`` reads the sandboxes of the key this
gateway runs (in a cluster, ask for one sandbox to reach its gateway).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from kernelgw.errors import KernelDied, SessionNotFound
from kernelgw.runtime.session import KernelSession
from kernelgw.server.e2b.auth import Caller, authenticate
from kernelgw.server.e2b.errors import E2BError, E2BRoute
from kernelgw.server.e2b.models import SandboxMetric
from kernelgw.server.e2b.wire import find, is_snapshot
from kernelgw.server.state import gateway_state

router = APIRouter(route_class=E2BRoute, tags=["e2b"])
"""Included by `kernelgw.server.e2b.control`'s router, under its ``/e2b``."""

MAX_SANDBOXES = 100
"""Sandboxes one ``GET /sandboxes/metrics`` reads (each takes a quarter of a second, in parallel)."""


async def reading(session: KernelSession) -> SandboxMetric | None:
    """The sandbox's use now; None when it runs no kernel (paused, restarting, gone)."""
    try:
        usage = await session.usage()
    except KernelDied:
        return None  # its kernel went away while it was read: nothing to report
    if usage is None:
        return None
    now = datetime.now(UTC)
    return SandboxMetric(
        timestamp=now,
        timestamp_unix=int(now.timestamp()),
        cpu_count=usage.cpu_count,
        cpu_used_pct=usage.cpu_used_pct,
        mem_used=usage.memory_used,
        mem_total=usage.memory_total,
        mem_cache=usage.memory_cache,
        disk_used=usage.disk_used,
        disk_total=usage.disk_total,
    )


async def sandboxes_metrics(request: Request, caller: Caller, sandbox_ids: str) -> Response:
    """The latest reading of each sandbox named (comma-separated ``sandbox_ids``)
    that the key has and that runs, by id (`kernelgw.server.e2b.control` routes
    it: before ``/sandboxes/{sandbox_id}``, which would take ``metrics`` for an id)."""
    ids = [s.strip() for s in sandbox_ids.split(",") if s.strip()]
    if len(ids) > MAX_SANDBOXES:
        raise E2BError(400, f"sandbox_ids names {len(ids)} sandboxes; at most {MAX_SANDBOXES} at a time")
    state = gateway_state(request)
    sessions = []
    for sandbox_id in dict.fromkeys(ids):
        try:
            session = state.manager.get(sandbox_id, caller.principal)
        except SessionNotFound:
            continue
        if not is_snapshot(session):
            sessions.append(session)
    readings = await asyncio.gather(*(reading(s) for s in sessions))
    found = {s.id: r.wire() for s, r in zip(sessions, readings, strict=True) if r is not None}
    return JSONResponse({"sandboxes": found})


@router.get("/sandboxes/{sandbox_id}/metrics")
async def sandbox_metrics(
    sandbox_id: str,
    request: Request,
    caller: Caller = Depends(authenticate),
    start: int | None = Query(None, description="Unix seconds"),
    end: int | None = Query(None, description="Unix seconds"),
) -> Response:
    """The sandbox's readings in ``[start, end]``: one, taken now, if now is in it."""
    session = await find(gateway_state(request), caller.principal, sandbox_id)
    if start is not None and end is not None and start > end:
        raise E2BError(400, f"start ({start}) is after end ({end})")
    metric = await reading(session)
    if metric is None:
        return JSONResponse([])
    now = metric.timestamp_unix
    if (start is not None and now < start) or (end is not None and now > end):
        return JSONResponse([])
    return JSONResponse([metric.wire()])
