"""Jupyter Server's sessions API, ``/api/sessions``: a notebook (or console)
path bound to a kernel, as clients that talk to a Jupyter server directly use
it (JupyterLab's ``SessionManager`` in @jupyterlab/services, and so VS Code's
"Existing Jupyter Server" connection, which starts every notebook's kernel
with ``POST /api/sessions``).

A Jupyter session here is only that binding; the kernel is a kernelgw session
(same limits, owner, history). Its id is its own (PATCH may move it to another
kernel), and it lives as long as its kernel: deleting either ends both. The
bindings are kept in memory: after a gateway restart the kernels are back
(`/api/kernels`), their session bindings are not, and a client makes them anew
(JupyterLab and VS Code do on reconnect, by path).
"""

from __future__ import annotations

import uuid
import weakref
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from kernelgw.errors import SessionNotFound
from kernelgw.keys import Principal
from kernelgw.runtime.manager import SessionOptions
from kernelgw.runtime.session import KernelSession
from kernelgw.server.availability import check_available
from kernelgw.server.jupyter import kernels
from kernelgw.server.jupyter.errors import JupyterHTTPError, JupyterRoute
from kernelgw.server.jupyter.models import json_body
from kernelgw.server.state import GatewayState, gateway_state

router = APIRouter(route_class=JupyterRoute, tags=["jupyter"], dependencies=[Depends(kernels.authenticate)])

MAX_SESSIONS_PER_KERNEL = 64


class KernelRef(BaseModel):
    """The session's kernel: an existing one by ``id``, or a new one of spec ``name``."""

    model_config = ConfigDict(extra="ignore")  # JupyterLab may send the whole kernel model

    id: str | None = Field(None, max_length=64)
    name: str | None = Field(None, max_length=200)


class SessionBody(BaseModel):
    """``POST`` and ``PATCH /api/sessions``: what JupyterLab's SessionManager sends."""

    model_config = ConfigDict(extra="ignore")  # as Jupyter Server (e.g. the deprecated "notebook")

    path: str | None = Field(None, max_length=4096)
    name: str | None = Field(None, max_length=4096)
    type: str | None = Field(None, max_length=64)
    kernel: KernelRef | None = None


_session_body = json_body(SessionBody)


@dataclass
class Binding:
    id: str
    path: str
    name: str
    type: str
    kernel: KernelSession


_bindings: weakref.WeakKeyDictionary[KernelSession, dict[str, Binding]] = weakref.WeakKeyDictionary()
"""Each kernel's sessions (they go with it)."""


def _of(kernel: KernelSession) -> dict[str, Binding]:
    return _bindings.setdefault(kernel, {})


def _visible(state: GatewayState, principal: Principal) -> list[Binding]:
    return [b for k in state.manager.list(principal) if k.state != "closed" for b in _bindings.get(k, {}).values()]


def _find(state: GatewayState, principal: Principal, session_id: str) -> Binding:
    for binding in _visible(state, principal):
        if binding.id == session_id:
            return binding
    raise JupyterHTTPError(404, f"Session not found: {session_id}")


def model(binding: Binding, state: GatewayState) -> dict[str, Any]:
    """The session model of Jupyter Server's REST API."""
    return {
        "id": binding.id,
        "path": binding.path,
        "name": binding.name,
        "type": binding.type,
        "kernel": kernels.model(binding.kernel, state.settings),
        "notebook": {"path": binding.path, "name": binding.name},  # deprecated; older clients read it
    }


def _bind(binding: Binding, kernel: KernelSession) -> None:
    if len(_of(kernel)) >= MAX_SESSIONS_PER_KERNEL:
        raise JupyterHTTPError(409, f"The kernel already has {MAX_SESSIONS_PER_KERNEL} sessions.")
    _of(binding.kernel).pop(binding.id, None)
    binding.kernel = kernel
    _of(kernel)[binding.id] = binding


async def _kernel_for(state: GatewayState, principal: Principal, ref: KernelRef | None) -> KernelSession:
    """The kernel ``ref`` names (404 if not this key's), or a new one."""
    if ref is not None and ref.id:
        try:
            return kernels.find(state, principal, ref.id)
        except SessionNotFound:
            raise JupyterHTTPError(404, f"Kernel does not exist: {ref.id}") from None
    name = (ref.name if ref is not None else None) or state.settings.default_kernel
    image = kernels.specs(state.settings).get(name)
    if image is None:
        raise JupyterHTTPError(
            400, f"Kernel spec {name!r} not found; this gateway offers {sorted(kernels.specs(state.settings))}"
        )
    check_available(state)
    options = SessionOptions(image=image, kernel=kernels.kernel_of(name))
    return await state.manager.create(options, principal)


@router.get("/api/sessions")
async def list_sessions(request: Request, principal: Principal = Depends(kernels.authenticate)) -> list[dict[str, Any]]:
    state = gateway_state(request)
    return [model(b, state) for b in _visible(state, principal)]


@router.post("/api/sessions", status_code=201)
async def create_session(
    request: Request,
    body: SessionBody | None = Depends(_session_body),
    principal: Principal = Depends(kernels.authenticate),
) -> JSONResponse:
    """Bind ``path`` to a kernel (a new one unless ``kernel.id`` names one). A path
    already bound is answered with its session, as Jupyter Server does."""
    state = gateway_state(request)
    body = body or SessionBody()
    if not body.path:
        raise JupyterHTTPError(400, "The session needs a path (the notebook's or console's).")
    existing = next((b for b in _visible(state, principal) if b.path == body.path), None)
    if existing is not None:
        binding = existing
    else:
        kernel = await _kernel_for(state, principal, body.kernel)
        binding = Binding(
            id=str(uuid.uuid4()),
            path=body.path,
            name=body.name or body.path.rsplit("/", 1)[-1],
            type=body.type or "notebook",
            kernel=kernel,
        )
        _bind(binding, kernel)
    out = model(binding, state)
    return JSONResponse(out, status_code=201, headers={"Location": f"/api/sessions/{binding.id}"})


@router.get("/api/sessions/{session_id}")
async def get_session(
    session_id: str, request: Request, principal: Principal = Depends(kernels.authenticate)
) -> dict[str, Any]:
    state = gateway_state(request)
    return model(_find(state, principal, session_id), state)


@router.patch("/api/sessions/{session_id}")
async def update_session(
    session_id: str,
    request: Request,
    body: SessionBody | None = Depends(_session_body),
    principal: Principal = Depends(kernels.authenticate),
) -> dict[str, Any]:
    """Rename or move the session, or give it another kernel (``kernel.id``: an
    existing one; ``kernel.name``: a new one). A kernel left without session is
    shut down, as Jupyter Server does."""
    state = gateway_state(request)
    binding = _find(state, principal, session_id)
    body = body or SessionBody()
    if body.path:
        binding.path = body.path
    if body.name:
        binding.name = body.name
    if body.type:
        binding.type = body.type
    ref = body.kernel
    old = binding.kernel
    if ref is not None and ref.id and kernels.kernel_id(old) != ref.id and old.id != ref.id:
        _bind(binding, await _kernel_for(state, principal, ref))
    elif ref is not None and not ref.id and ref.name and ref.name != kernels.spec_name(old, state.settings):
        _bind(binding, await _kernel_for(state, principal, ref))
    if binding.kernel is not old and not _bindings.get(old):
        await state.manager.delete(old.id)
    return model(binding, state)


@router.delete("/api/sessions/{session_id}", status_code=204)
async def delete_session(
    session_id: str, request: Request, principal: Principal = Depends(kernels.authenticate)
) -> Response:
    """End the session and shut its kernel down (Jupyter Server does the same)."""
    state = gateway_state(request)
    binding = _find(state, principal, session_id)
    _of(binding.kernel).pop(binding.id, None)
    if not _bindings.get(binding.kernel):
        await state.manager.delete(binding.kernel.id)
    return Response(status_code=204)
