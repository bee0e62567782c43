"""Jupyter's JSON error shape, ``{"message", "reason"}``, for the /api routes.

The /api routes use `JupyterRoute`, which turns the gateway's own errors, a
request that fails validation and HTTP errors into that shape (Jupyter Server
and Kernel Gateway answer so; their clients read ``message``), keeping the
status and headers the /v1 face would send.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from kernelgw.errors import KernelGWError, Unauthorized
from kernelgw.server.availability import retry_after_s
from kernelgw.server.face_routes import face_route

log = logging.getLogger(__name__)


class JupyterHTTPError(Exception):
    """An error the /api routes raise themselves (with Jupyter's reason)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def jupyter_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"message": message, "reason": reason(status)}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "Invalid request: " + "; ".join(parts)


def to_response(request: Request, exc: Exception) -> Response | None:
    """The Jupyter-shaped answer to ``exc``, or None when it is not an error of ours."""
    if isinstance(exc, JupyterHTTPError):
        return jupyter_error(exc.status, exc.message)
    if isinstance(exc, KernelGWError):
        headers: dict[str, str] = {}
        if (retry_after := retry_after_s(exc)) is not None:
            headers["Retry-After"] = str(retry_after)
        elif isinstance(exc, Unauthorized):
            headers["WWW-Authenticate"] = 'Bearer realm="kernelgw"'
            client = f"{request.client.host}:{request.client.port}" if request.client else None
            log.warning("unauthorized request", extra={"path": request.url.path, "client": client})
        return jupyter_error(exc.status_code, exc.message, headers)
    if isinstance(exc, RequestValidationError):
        return jupyter_error(400, _validation_message(exc))
    if isinstance(exc, HTTPException):
        return jupyter_error(exc.status_code, str(exc.detail), dict(exc.headers or {}))
    return None


JupyterRoute = face_route(to_response, "JupyterRoute")
"""An APIRoute whose errors come out in Jupyter's shape."""
