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
and audited for, as on ``/v1``. Errors come in E2B's shape
(`kernelgw.server.e2b.errors`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from http import HTTPStatus

from fastapi import Request

from kernelgw.errors import SessionBusy, SessionNotFound
from kernelgw.keys import ANONYMOUS, Principal
from kernelgw.runtime.session import KernelSession
from kernelgw.server.e2b.auth import ACCESS_TOKEN_HEADERS, SANDBOX_ID_HEADER
from kernelgw.server.e2b.errors import E2BError
from kernelgw.server.e2b.models import RESERVED_PREFIX
from kernelgw.server.state import gateway_state

SANDBOX_PORT_HEADER = "E2b-Sandbox-Port"

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


TIMEOUT_KEY = RESERVED_PREFIX + "timeout"
"""In a sandbox's metadata: the timeout (seconds) it was created with, which an
auto-resume gives it again (`wake`)."""
RESUMED_LEASE_MIN_S = 300
"""E2B's least timeout after an auto-resume: five minutes."""


def not_found() -> E2BError:
    """E2B's proxy answer for a sandbox that is not there (its SDK reads "was not found")."""
    return E2BError(HTTPStatus.BAD_GATEWAY, NOT_FOUND_MESSAGE, error_code="sandbox_not_found")


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
            raise E2BError(
                HTTPStatus.NOT_FOUND,
                f"{SERVICES[sandbox.port]} (port {sandbox.port}) has no route {request.method} {request.url.path}",
                error_code="no_route",
            )
        raise E2BError(HTTPStatus.BAD_GATEWAY, PORT_CLOSED_MESSAGE, error_code="port_not_open")
    return sandbox


async def _sandbox(request: Request) -> Sandbox:
    headers = request.headers
    sandbox_id = headers.get(SANDBOX_ID_HEADER, "")
    tokens = [token for name in ACCESS_TOKEN_HEADERS if (token := headers.get(name))]
    state = gateway_state(request)
    try:
        session = state.manager.get(sandbox_id, ANONYMOUS)  # any key's: the token decides
    except SessionNotFound:
        raise not_found() from None
    if not any(session.check_access(token) for token in tokens):
        raise not_found()
    principal = ANONYMOUS
    if session.owner is not None:
        owner = await state.auth.key_principal(session.owner)
        if owner is None:
            raise E2BError(
                HTTPStatus.UNAUTHORIZED,
                "The API key that created this sandbox was revoked: the sandbox takes no more work. "
                "Create a sandbox with an active key.",
                error_code="unauthorized",
            )
        principal = owner
    port_text = headers.get(SANDBOX_PORT_HEADER, "")
    return Sandbox(session, principal, int(port_text) if port_text.isdigit() else None)


async def wake(request: Request, session: KernelSession) -> None:
    """E2B's auto-resume: a paused sandbox that work reaches (code, files) is
    resumed, with a fresh lease from now of the timeout it was created with, at
    least five minutes (E2B's rule). A health check does not wake it."""
    if not _paused(session):
        return
    state = gateway_state(request)
    await session.resume()  # None: another request resumed it first
    if _paused(session):
        raise E2BError(HTTPStatus.CONFLICT, f"Sandbox {session.id} could not be resumed; retry.")
    try:
        created_with = float(session.metadata.get(TIMEOUT_KEY, "0"))
    except ValueError:
        created_with = 0.0
    seconds = min(max(created_with, RESUMED_LEASE_MIN_S), state.settings.max_lease_s)
    with contextlib.suppress(SessionBusy):  # its lease ran out meanwhile and is being acted on
        await state.manager.set_lease(session, seconds)


def _paused(session: KernelSession) -> bool:
    return session.state == "paused"
