"""Other live gateways' sessions in the Jupyter kernels listing (``GET /api/kernels``).

Their rows come from the shared store (`kernelgw.cluster.listing`): the kernel
model's ``execution_state`` is ``idle`` and ``connections`` 0 there; the
owner's ``GET /api/kernels/{id}`` (forwarded) has the live values.
"""

from __future__ import annotations

from typing import Any

from kernelgw.cluster.listing import RemoteSession
from kernelgw.keys import Principal
from kernelgw.server.jupyter import kernels
from kernelgw.server.state import GatewayState


def kernel_model(session: RemoteSession, state: GatewayState) -> dict[str, Any]:
    name = next(
        (
            spec
            for spec, image in kernels.specs(state.settings).items()
            if image == session.image and kernels.kernel_of(spec) == session.kernel
        ),
        session.image,
    )
    return {
        "id": session.id,
        "name": name,
        "last_activity": session.created_at.strftime(kernels.LAST_ACTIVITY_FORMAT),
        "execution_state": "idle",
        "connections": 0,
    }


async def remote_kernels(state: GatewayState, principal: Principal) -> list[dict[str, Any]]:
    if state.cluster is None:
        return []
    return [kernel_model(s, state) for s in await state.cluster.remote_sessions(principal)]
