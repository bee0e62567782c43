"""``GET /v1/gateways``: the registry as an operator reads it (admin key).

Every gateway that shares the store, live or gone, with its address, its
last heartbeat and load; 404 on a gateway that is not one of a cluster.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, Request

from kernelgw.errors import KernelGWError
from kernelgw.server.auth import authenticate, require_admin
from kernelgw.server.state import gateway_state

router = APIRouter(tags=["gateway"], dependencies=[Depends(authenticate), Depends(require_admin)])


class NotInACluster(KernelGWError):
    status_code = 404
    code = "not_in_a_cluster"


@router.get("/v1/gateways")
async def list_gateways(request: Request) -> dict[str, Any]:
    """The gateways sharing this store: name, advertise URL, start, last heartbeat,
    clean stop, running sessions, free memory, and whether each is live."""
    cluster = gateway_state(request).cluster
    if cluster is None:
        raise NotInACluster(
            "This gateway is not one of a cluster: set KERNELGW_CLUSTER_SECRET (the same on every gateway "
            "sharing the store) to register it."
        )
    await cluster.registry.refresh()
    now = datetime.now(UTC)
    return {
        "self": cluster.name,
        "gone_after_s": cluster.registry.gone_after_s,
        "gateways": [
            {
                "name": g.name,
                "advertise_url": g.url,
                "live": cluster.registry.is_live(g),
                "started_at": g.started_at,
                "heartbeat_at": g.heartbeat_at,
                "heartbeat_age_s": round((now - g.heartbeat_at).total_seconds(), 3),
                "stopped_at": g.stopped_at,
                "sessions": g.sessions,
                "free_memory_mb": g.free_memory_mb,
            }
            for g in sorted(cluster.registry.live_and_gone(), key=lambda g: g.name)
        ],
    }
