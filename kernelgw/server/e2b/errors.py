"""E2B's error shape, ``{"code": <status>, "message": "..."}``, for the /e2b control plane.

The SDK turns the status into its exception (``e2b.api.handle_api_exception``):
401 `AuthenticationException`, 429 `RateLimitException`, 503
`ServiceBusyException`, 404 the not-found of the call, anything else a
`SandboxException` carrying ``message``. So kernelgw's errors keep their status
(a session limit is 429, an invalid request 400, a missing sandbox 404) and
their message; ``error_code`` carries kernelgw's own code for programs.

E2B's SDK also retries 429, 502, 503 and 504 by itself unless the answer says
``Should-Retry: false``: a refusal that a retry within the same call cannot
change (the session limit) says so, one that can (draining, a rate limit) gives
``Retry-After``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from kernelgw.errors import KernelGWError, SessionLimitReached, SessionNotFound, Unauthorized
from kernelgw.server.availability import retry_after_s
from kernelgw.server.face_routes import face_route

log = logging.getLogger(__name__)

UNAUTHORIZED_MESSAGE = (
    "A valid kernelgw API key is required: set E2B_API_KEY to a key of this gateway (the SDK sends it as X-API-KEY)."
)
"""One message for a missing, malformed, unknown or revoked key: which part was wrong is not revealed."""


class E2BError(Exception):
    """An answer the /e2b routes give themselves, in E2B's shape."""

    def __init__(
        self, status: int, message: str, *, error_code: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_code = error_code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return e2b_response(self.status, self.message, error_code=self.error_code, headers=self.headers)


def error_body(status: int, message: str, error_code: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": status, "message": message}
    if error_code is not None:
        body["error_code"] = error_code
    return body


def e2b_response(
    status: int, message: str, *, error_code: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, error_code), status_code=status, headers=headers)


def not_found(sandbox_id: str, detail: str | None = None) -> E2BError:
    """E2B's 404 for a sandbox: ``detail`` says why when it is known (it ended)."""
    return E2BError(404, detail or f"Sandbox {sandbox_id} not found", error_code="sandbox_not_found")


def validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "Invalid request: " + "; ".join(parts)


def error_headers(exc: KernelGWError) -> dict[str, str]:
    """``Retry-After`` where waiting helps, ``Should-Retry: false`` where an
    immediate retry by the SDK cannot (a limit, not a rate)."""
    headers: dict[str, str] = {}
    if isinstance(exc, SessionLimitReached):
        headers["Should-Retry"] = "false"
    if (retry_after := retry_after_s(exc)) is not None:
        headers["Retry-After"] = str(retry_after)
    return headers


def to_response(request: Request, exc: Exception) -> Response | None:
    """E2B's answer to ``exc``, or None when it is not an error of ours."""
    if isinstance(exc, E2BError):
        return exc.response()
    if isinstance(exc, Unauthorized):
        client = f"{request.client.host}:{request.client.port}" if request.client else None
        log.warning("unauthorized request", extra={"path": request.url.path, "client": client})
        return e2b_response(
            401, UNAUTHORIZED_MESSAGE, error_code=exc.code, headers={"WWW-Authenticate": 'Bearer realm="kernelgw"'}
        )
    if isinstance(exc, SessionNotFound):
        return not_found(exc.session_id).response()
    if isinstance(exc, KernelGWError):
        return e2b_response(exc.status_code, exc.message, error_code=exc.code, headers=error_headers(exc))
    if isinstance(exc, RequestValidationError):
        return e2b_response(400, validation_message(exc), error_code="bad_request")
    if isinstance(exc, HTTPException):
        return e2b_response(exc.status_code, str(exc.detail), headers=dict(exc.headers or {}))
    return None


E2BRoute = face_route(to_response, "E2BRoute")
"""An APIRoute whose errors come out in E2B's shape."""
