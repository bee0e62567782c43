"""Kernels as Jupyter sees them: ids, the kernel model, kernelspecs, who may ask.

A Jupyter kernel *is* a kernelgw session. Its id is the session's id, in the
dashed UUID form jupyter_server routes (``\\w+-\\w+-\\w+-\\w+-\\w+``): new
sessions have such ids; a session with a 32-hex id is shown dashed and found
by either form.
"""

from __future__ import annotations

import re
import uuid
import weakref
from datetime import UTC, datetime
from typing import Any

from starlette.requests import HTTPConnection

from kernelgw.config import Settings
from kernelgw.errors import SessionNotFound
from kernelgw.kernels import DEFAULT_KERNEL, PROFILES, profile
from kernelgw.keys import Principal, parse_key
from kernelgw.runtime.session import KernelSession
from kernelgw.server.state import GatewayState, gateway_state

SPEC_RESOURCES = ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg")
"""Files every kernelspec offers (ipykernel's logos, in ``resources/``)."""
LAST_ACTIVITY_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
"""jupyter_server's gateway client parses exactly this (anything else is a 500 there)."""
_HEX_ID = re.compile(r"[0-9a-f]{32}")


# ---------------------------------------------------------------- who asks
def credentials(conn: HTTPConnection) -> tuple[str | None, str | None]:
    """(API key, browser token) from ``Authorization: token|Bearer X`` or ``?token=X``."""
    header = conn.headers.get("authorization")
    if header:
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() in ("token", "bearer") and value.strip():
            return value.strip(), None
        return "", None  # a header of another kind: no valid key
    token = conn.query_params.get("token")
    if token:
        # ?token= carries an API key (Jupyter's convention) or a browser token (/v1's)
        return (token, None) if parse_key(token) is not None else (None, token)
    return None, None


async def authenticate(conn: HTTPConnection) -> Principal:
    """The principal behind a Jupyter request (REST or WebSocket); `Unauthorized` if none."""
    auth = gateway_state(conn).auth
    key, token = credentials(conn)
    if token is not None:
        principal = await auth.from_key_or_token(None, token)
        conn.state.principal = principal
        return principal
    principal = await auth.from_key(key)
    conn.state.principal = principal
    return principal


# ---------------------------------------------------------------- ids
def kernel_id(session: KernelSession) -> str:
    return str(uuid.UUID(session.id)) if _HEX_ID.fullmatch(session.id) else session.id


def find(state: GatewayState, principal: Principal, kid: str) -> KernelSession:
    """The session behind kernel ``kid`` if ``principal`` may see it (else 404)."""
    try:
        return state.manager.get(kid, principal)
    except SessionNotFound:
        compact = kid.replace("-", "")
        if compact != kid and _HEX_ID.fullmatch(compact):
            return state.manager.get(compact, principal)
        raise


# ---------------------------------------------------------------- live clients
_connections: weakref.WeakKeyDictionary[KernelSession, set[object]] = weakref.WeakKeyDictionary()
"""Each session's open channels connections (counted for the kernel model's ``connections``)."""
_last_status: weakref.WeakKeyDictionary[KernelSession, str] = weakref.WeakKeyDictionary()


def connections(session: KernelSession) -> set[object]:
    return _connections.setdefault(session, set())


def status_seen(session: KernelSession, state: str) -> None:
    """The kernel's last iopub ``execution_state`` a channels client saw."""
    _last_status[session] = state


def execution_state(session: KernelSession) -> str:
    if session.state in ("closed", "dead"):
        return "dead"
    if session.state == "starting":
        return "starting"
    if session.state == "busy":
        return "busy"
    return _last_status.get(session, "idle")


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def model(session: KernelSession, settings: Settings) -> dict[str, Any]:
    """The kernel model of Jupyter Server's REST API."""
    return {
        "id": kernel_id(session),
        "name": spec_name(session, settings),
        "last_activity": _utc(session.last_activity_at).strftime(LAST_ACTIVITY_FORMAT),
        "execution_state": execution_state(session),
        "connections": len(_connections.get(session, ())),
    }


# ---------------------------------------------------------------- kernelspecs
def _slug(image: str) -> str:
    base = image.rsplit("/", 1)[-1]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-").lower() or "image"


def specs(settings: Settings) -> dict[str, str]:
    """Kernelspec name -> image: one per kernel the gateway offers (``python3``:
    the default image), and one more per allowed Python image."""
    names = {name: settings.kernel_image(name) for name in settings.kernels}
    for image in settings.allowed_images if DEFAULT_KERNEL in settings.kernels else ():
        if image != settings.image:
            name = f"python3-{_slug(image)}"
            while name in names:
                name += "_"
            names[name] = image
    return names


def kernel_of(spec_name: str) -> str:
    """The kernel (``kernelgw.kernels`` name) a kernelspec runs: extra images are Python's."""
    return spec_name if spec_name in PROFILES else DEFAULT_KERNEL


def spec_name(session: KernelSession, settings: Settings) -> str:
    """The kernelspec of the session's image (a /v1 session may run an image no spec names)."""
    for name, image in specs(settings).items():
        if image == session.spec.image and kernel_of(name) == session.spec.kernel:
            return name
    return session.spec.image


def spec_model(name: str, image: str, default_image: str) -> dict[str, Any]:
    kernel = profile(kernel_of(name))
    if not kernel.python:
        display = f"{kernel.display_name} (kernelgw sandbox)"
    elif image == default_image:
        display = "Python 3 (kernelgw sandbox)"
    else:
        display = f"Python 3 ({image}, kernelgw sandbox)"
    return {
        "name": name,
        "spec": {
            "argv": [],
            "display_name": display,
            "language": kernel.language,
            "interrupt_mode": "signal",
            "env": {},
            "metadata": {"kernelgw": {"image": image, "sandboxed": True}},
        },
        "resources": {file: f"/kernelspecs/{name}/{file}" for file in SPEC_RESOURCES},
    }
