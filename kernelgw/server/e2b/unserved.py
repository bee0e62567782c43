"""What E2B's API has and kernelgw's E2B face does not serve (yet), answered in
E2B's shape: a 501 that names it, so a client learns what is missing instead
of meeting a bare 404 of an unknown route; anything else under ``/e2b`` is a
404 in E2B's shape.

A sandbox's terminal (``sandbox.pty``) is answered by envd's process service
(`kernelgw.server.e2b.envd_process`) with ``unimplemented``. Logs,
templates' builds, volumes, secrets, teams: not kernelgw's (templates are a
setting, keys are ``kernelgw keys``).
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Request, Response

from kernelgw.server.e2b.auth import SANDBOX_ID_HEADER, authenticate, key_text
from kernelgw.server.e2b.errors import E2BRoute, e2b_response

router = APIRouter(route_class=E2BRoute, tags=["e2b"])
"""Included last by `kernelgw.server.e2b.control`'s router, under its ``/e2b``."""

_UNSERVED = (
    (re.compile(r"^/(v2/)?sandboxes/[^/]+/logs$"), "Sandbox logs are not available on kernelgw's E2B face"),
    (
        re.compile(r"^/(v\d+/)?templates(/.*)?$"),
        "Templates are not built through kernelgw's API: they map to kernelgw "
        "images and kernels in the gateway's e2b_templates setting",
    ),
    (re.compile(r"^/volumes(/.*)?$"), "Volumes are not available on kernelgw: a sandbox's files live in its workspace"),
    (re.compile(r"^/secrets(/.*)?$"), "Secrets are not available on kernelgw's E2B face"),
    (
        re.compile(r"^/(teams|api-keys|access-tokens|nodes|admin)(/.*)?$"),
        "kernelgw manages its API keys with `kernelgw keys`",
    ),
)


def unserved(path: str) -> str | None:
    """What an E2B route this face does not serve is, if ``path`` (under /e2b) is one."""
    for pattern, message in _UNSERVED:
        if pattern.match(path):
            return message
    return None


_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@router.api_route("/{path:path}", methods=_METHODS, include_in_schema=False)
async def no_route(path: str, request: Request) -> Response:
    """Anything else under /e2b, in E2B's shape: a control-plane feature this face
    does not serve is a 501 naming it (for a valid key), an unknown route a 404."""
    method, shown = request.method, f"/e2b/{path}"
    if request.headers.get(SANDBOX_ID_HEADER) is None or key_text(request.headers) is not None:
        await authenticate(request)  # the control plane answers nothing without a key
    message = unserved("/" + path)
    if message is not None:
        return e2b_response(501, f"{message} ({method} {shown}).", error_code="not_implemented")
    return e2b_response(404, f"kernelgw's E2B face has no route {method} {shown}.", error_code="no_route")
