"""Sandbox traffic: which session a request reaches, and who it acts for.

E2B's SDKs send what goes into a sandbox to one base URL with three headers:
``E2b-Sandbox-Id`` (the sandbox: a kernelgw session id), ``E2b-Sandbox-Port``
(the service inside: 49999 the code interpreter, 49983 envd) and the sandbox's
access token, the ``envdAccessToken`` its create returned (``X-Access-Token``;
the code interpreter's context calls carry it as ``E2B-Traffic-Access-Token``
when create returned it as ``trafficAccessToken`` too). No API key comes with
them: the token is the credential, checked against the hash the session keeps
(`KernelSession.check_access`).

An unknown id, a missing token and a wrong one get the same answer, the 502
E2B's proxy gives for a sandbox that is gone (the SDK reads "was not found" as
not running): ids reveal nothing. A port nothing listens on gets E2B's answer
for that ("port is not open"), once the token is right. The session's owner
(the API key that created it) is the principal its work is admitted, counted
and audited for, as on ``/v1``.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from kernelgw.errors import KernelGWError, SessionNotFound
from kernelgw.keys import ANONYMOUS, Principal
from kernelgw.runtime.session import KernelSession
from kernelgw.server.availability import retry_after_s
from kernelgw.server.state import gateway_state

SANDBOX_ID_HEADER = "E2b-Sandbox-Id"
SANDBOX_PORT_HEADER = "E2b-Sandbox-Port"
ACCESS_TOKEN_HEADER = "X-Access-Token"
TRAFFIC_TOKEN_HEADER = "E2B-Traffic-Access-Token"

INTERPRETER_PORT = 49999
"""The code interpreter's port in an E2B sandbox (``/execute``, ``/contexts``)."""
ENVD_PORT = 49983
"""envd's port (``/health``, files, processes)."""
SERVICES = {INTERPRETER_PORT: "the code interpreter", ENVD_PORT: "envd"}

NOT_FOUND_MESSAGE = (
    "The sandbox was not found: no sandbox with this id takes this access token (it was killed, its "
    "timeout ran out, or the token is not the envdAccessToken its create returned)"
)
"""One answer for an unknown id and for a missing or wrong token."""
PORT_CLOSED_MESSAGE = "The sandbox is running but port is not open"


class SandboxError(Exception):
    """An answer in E2B's error shape, ``{"code", "message", ...}``."""

    def __init__(self, status: int, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.fields = fields

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        body = {**self.fields, "code": self.status, "message": self.message}
        return JSONResponse(body, status_code=self.status, headers=headers)


def not_found(sandbox_id: str) -> SandboxError:
    return SandboxError(HTTPStatus.BAD_GATEWAY, NOT_FOUND_MESSAGE, sandboxId=sandbox_id)


@dataclass(frozen=True)
class Sandbox:
    """A sandbox request whose token was right."""

    session: KernelSession
    principal: Principal
    """The session's owner: whose quotas and audit its work counts in."""
    port: int | None
    """``E2b-Sandbox-Port`` (None: absent or not a number)."""

    @property
    def id(self) -> str:
        return self.session.id


async def sandbox_for(request: Request, *ports: int) -> Sandbox:
    """The sandbox a request for the service on one of ``ports`` reaches, or the
    error that answers it: not found (id or token), then port not open."""
    sandbox = await _sandbox(request)
    if sandbox.port not in ports:
        if sandbox.port in SERVICES:  # that service runs, but has no such route
            raise SandboxError(
                HTTPStatus.NOT_FOUND,
                f"{SERVICES[sandbox.port]} (port {sandbox.port}) has no route {request.method} {request.url.path}",
            )
        raise SandboxError(HTTPStatus.BAD_GATEWAY, PORT_CLOSED_MESSAGE, sandboxId=sandbox.id, port=sandbox.port or 0)
    return sandbox


async def _sandbox(request: Request) -> Sandbox:
    headers = request.headers
    sandbox_id = headers.get(SANDBOX_ID_HEADER, "")
    tokens = [t for t in (headers.get(ACCESS_TOKEN_HEADER), headers.get(TRAFFIC_TOKEN_HEADER)) if t]
    state = gateway_state(request)
    try:
        session = state.manager.get(sandbox_id, ANONYMOUS)  # any key's: the token decides
    except SessionNotFound:
        raise not_found(sandbox_id) from None
    if not any(session.check_access(token) for token in tokens):
        raise not_found(sandbox_id)
    principal = ANONYMOUS
    if session.owner is not None:
        owner = await state.auth.key_principal(session.owner)
        if owner is None:
            raise SandboxError(
                HTTPStatus.UNAUTHORIZED,
                "The API key that created this sandbox was revoked: the sandbox takes no more work. "
                "Create a sandbox with an active key.",
            )
        principal = owner
    port_text = headers.get(SANDBOX_PORT_HEADER, "")
    return Sandbox(session, principal, int(port_text) if port_text.isdigit() else None)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "Invalid request: " + "; ".join(parts)


def to_response(exc: Exception) -> Response | None:
    """E2B's answer to ``exc``, or None when it is not an error of ours."""
    if isinstance(exc, SandboxError):
        return exc.response()
    if isinstance(exc, KernelGWError):
        retry_after = retry_after_s(exc)
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return SandboxError(exc.status_code, exc.message).response(headers)
    if isinstance(exc, RequestValidationError):
        return SandboxError(HTTPStatus.BAD_REQUEST, _validation_message(exc)).response()
    if isinstance(exc, HTTPException):
        return SandboxError(exc.status_code, str(exc.detail)).response(dict(exc.headers or {}))
    return None


class SandboxRoute(APIRoute):
    """An APIRoute whose errors come out in E2B's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                response = to_response(exc)
                if response is None:
                    raise
                return response

        return route
