"""Jupyter's kernels REST API on the gateway: ``/api``, ``/api/kernelspecs``,
``/api/kernels``, as Jupyter Server defines it and Kernel Gateway answers it.

Status codes follow Kernel Gateway: 201 with the model on start, 204 on delete
and interrupt, 200 with the model on restart; errors are ``{"message",
"reason"}`` (`errors.JupyterRoute`). The kernels are the gateway's sessions:
same limits, quotas, ownership (another key's kernel is a 404) and history.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from kernelgw import __version__
from kernelgw.keys import Principal
from kernelgw.runtime.manager import SessionOptions
from kernelgw.server.availability import check_available
from kernelgw.server.jupyter import kernels, sessions
from kernelgw.server.jupyter.errors import JupyterHTTPError, JupyterRoute
from kernelgw.server.jupyter.models import StartKernel, json_body
from kernelgw.server.jupyter.remote import remote_kernels
from kernelgw.server.state import gateway_state

RESOURCES = Path(__file__).parent / "resources"
_RESOURCE_BYTES = {name: (RESOURCES / name).read_bytes() for name in kernels.SPEC_RESOURCES}
"""13 kB, read at import rather than on the event loop."""
JUPYTER_SERVER_API = "2.14.0"
"""The Jupyter Server REST API this face follows (``GET /api``'s ``version``)."""

public = APIRouter(route_class=JupyterRoute, tags=["jupyter"])
router = APIRouter(route_class=JupyterRoute, tags=["jupyter"], dependencies=[Depends(kernels.authenticate)])


@public.get("/api")
async def api_version() -> dict[str, str]:
    """The API version (public, as in Jupyter Server)."""
    return {"version": JUPYTER_SERVER_API, "kernelgw": __version__}


# ---------------------------------------------------------------- kernelspecs
@router.get("/api/kernelspecs")
async def list_kernelspecs(request: Request) -> dict[str, Any]:
    settings = gateway_state(request).settings
    return {
        "default": settings.default_kernel,
        "kernelspecs": {
            name: kernels.spec_model(name, image, settings.image) for name, image in kernels.specs(settings).items()
        },
    }


@router.get("/api/kernelspecs/{name}")
async def get_kernelspec(name: str, request: Request) -> dict[str, Any]:
    settings = gateway_state(request).settings
    image = kernels.specs(settings).get(name)
    if image is None:
        raise JupyterHTTPError(404, f"Kernel spec {name!r} not found")
    return kernels.spec_model(name, image, settings.image)


@router.get("/kernelspecs/{name}/{resource}")
async def get_kernelspec_resource(name: str, resource: str, request: Request) -> Response:
    """A kernelspec's logo, where jupyter_server's gateway client asks for it
    (``/kernelspecs``, not under ``/api``, as in Jupyter Server)."""
    if name not in kernels.specs(gateway_state(request).settings):
        raise JupyterHTTPError(404, f"Kernel spec {name!r} not found")
    if resource not in kernels.SPEC_RESOURCES:
        raise JupyterHTTPError(404, f"Kernel spec {name!r} has no resource {resource!r}")
    media_type = "image/svg+xml" if resource.endswith(".svg") else "image/png"
    return Response(_RESOURCE_BYTES[resource], media_type=media_type, headers={"Cache-Control": "max-age=86400"})


# ---------------------------------------------------------------- kernels
@router.get("/api/kernels")
async def list_kernels(request: Request, principal: Principal = Depends(kernels.authenticate)) -> list[dict[str, Any]]:
    state = gateway_state(request)
    local = [kernels.model(s, state.settings) for s in state.manager.list(principal)]
    return local + await remote_kernels(state, principal)  # other live gateways' (kernelgw.cluster)


_start_body = json_body(StartKernel)


@router.post("/api/kernels", status_code=201)
async def start_kernel(
    request: Request,
    body: StartKernel | None = Depends(_start_body),
    principal: Principal = Depends(kernels.authenticate),
) -> JSONResponse:
    """Start a kernel (a new session); the body may be absent (Open WebUI sends none)."""
    state = gateway_state(request)
    body = body or StartKernel()
    name = body.name or state.settings.default_kernel
    image = kernels.specs(state.settings).get(name)
    if image is None:
        raise JupyterHTTPError(
            400, f"Kernel spec {name!r} not found; this gateway offers {sorted(kernels.specs(state.settings))}"
        )
    check_available(state)
    options = SessionOptions(image=image, env=body.env, kernel=kernels.kernel_of(name))
    session = await state.manager.create(options, principal)
    model = kernels.model(session, state.settings)
    return JSONResponse(model, status_code=201, headers={"Location": f"/api/kernels/{model['id']}"})


@router.get("/api/kernels/{kernel_id}")
async def get_kernel(
    kernel_id: str, request: Request, principal: Principal = Depends(kernels.authenticate)
) -> dict[str, Any]:
    state = gateway_state(request)
    return kernels.model(kernels.find(state, principal, kernel_id), state.settings)


@router.delete("/api/kernels/{kernel_id}", status_code=204)
async def delete_kernel(
    kernel_id: str, request: Request, principal: Principal = Depends(kernels.authenticate)
) -> Response:
    state = gateway_state(request)
    session = kernels.find(state, principal, kernel_id)
    await state.manager.delete(session.id)
    return Response(status_code=204)


@router.post("/api/kernels/{kernel_id}/interrupt", status_code=204)
async def interrupt_kernel(
    kernel_id: str, request: Request, principal: Principal = Depends(kernels.authenticate)
) -> Response:
    """SIGINT to the kernel, whatever it runs (a Jupyter client's cell or a /v1 one)."""
    state = gateway_state(request)
    session = kernels.find(state, principal, kernel_id)
    handle = session.handle
    if handle is None:
        raise JupyterHTTPError(409, "The kernel is not running (it is starting, restarting or gone).")
    # through the session when a cell runs, so its end says "interrupted"
    if not await session.interrupt():
        await state.backend.signal(handle, signal.SIGINT)
    session.touch()
    return Response(status_code=204)


@router.post("/api/kernels/{kernel_id}/restart")
async def restart_kernel(
    kernel_id: str, request: Request, principal: Principal = Depends(kernels.authenticate)
) -> dict[str, Any]:
    """A fresh kernel in the same session (a new container); all variables are lost."""
    state = gateway_state(request)
    session = kernels.find(state, principal, kernel_id)
    await session.restart()
    kernels.status_seen(session, "idle")
    return kernels.model(session, state.settings)


router.include_router(sessions.router)  # /api/sessions, on the same app as the kernels
