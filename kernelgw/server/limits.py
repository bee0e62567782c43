"""Request body caps, as a pure ASGI middleware, before anything reads a body.

Starlette reads a body whole before validation (and FastAPI before it runs the
route's dependencies, authentication included); without a cap a client could
make the gateway buffer any amount. Two caps:

- a request without valid credentials (authentication on) may send at most
  ``UNAUTHENTICATED_BODY_BYTES``: a bigger one (by its ``Content-Length``, or
  once it has sent that much) is answered with the same 401 as any bad
  credential and its connection is closed, without reading further. The key
  is in a header, so it is checked here, before the body; no route of the
  gateway takes a body without a key;
- an authenticated one at most ``max_request_bytes`` (413). File uploads
  (``/v1``'s ``PUT .../files/...``, E2B's ``POST /e2b/files``) are streamed to
  the container and have their own limits (``max_upload_bytes`` per file, the
  workspace quota), so they are exempt from this one.

It runs outside `kernelgw.server.forward.Forwarder`, whose look at a create's
body and whose streaming to the owner gateway happen after these caps.
"""

from __future__ import annotations

import logging
import re

import orjson
from starlette.applications import Starlette
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernelgw.config import Settings
from kernelgw.errors import KernelGWError, Unauthorized
from kernelgw.server.state import GatewayState, find_gateway_state

log = logging.getLogger(__name__)

DEFAULT_LIMIT = 32 * 1024 * 1024
UNAUTHENTICATED_BODY_BYTES = 64 * 1024
"""What a request without valid credentials may send before it is refused: enough
for any body a public route could take, small enough that many stalled clients
cost the gateway nothing (uvicorn itself buffers at most 64 KiB per connection
while the app does not read)."""
_UPLOAD = re.compile(r"^/v1/sessions/[^/]+/files/.")
E2B_UPLOAD = "/e2b/files"
"""envd's uploads (one file or many, `kernelgw.server.e2b.envd_files`)."""


class _BodyTooLarge(BaseException):
    """A BaseException on purpose: FastAPI turns any Exception raised while it
    reads a body into a 400 "error parsing the body", which would hide the 413."""


class BodySizeLimit:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length, has_body = _declared_body(scope)
        if not has_body:
            await self.app(scope, receive, send)
            return
        state = find_gateway_state(scope["app"])
        try:
            authenticated = state is None or await _authenticated(state, scope)
        except KernelGWError as exc:  # the keys cannot be read (503): the body is not read either
            await _reject(scope, send, exc)
            return
        if authenticated:
            method, path = scope["method"], scope["path"]
            if (method == "PUT" and _UPLOAD.match(path)) or (method == "POST" and path == E2B_UPLOAD):
                await self.app(scope, receive, send)
                return
            limit = _limit(scope["app"])
            refusal: KernelGWError = PayloadTooLarge(limit)
        else:
            limit = UNAUTHENTICATED_BODY_BYTES
            refusal = Unauthorized()
        if length is not None and length > limit:
            await _reject(scope, send, refusal)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await _reject(scope, send, refusal)


class PayloadTooLarge(KernelGWError):
    """A body over ``max_request_bytes``."""

    status_code = 413
    code = "payload_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"The request body is larger than the gateway's limit of {limit} bytes.")


def _declared_body(scope: Scope) -> tuple[int | None, bool]:
    """(``Content-Length``, whether a body may follow): HTTP/1.1 has none
    without a length or chunking."""
    length: int | None = None
    chunked = False
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = 0
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked or bool(length)


async def _authenticated(state: GatewayState, scope: Scope) -> bool:
    """Whether the request carries credentials valid at some face (a key in
    ``Authorization``, as Bearer or Jupyter's ``token``, in ``?token=`` or in
    E2B's ``X-API-KEY``, a browser token, or E2B sandbox traffic's access
    token for the sandbox it names); True when authentication is off."""
    from kernelgw.server.e2b.auth import API_KEY_HEADER, sandbox_access
    from kernelgw.server.jupyter.kernels import credentials

    auth = state.auth
    conn = HTTPConnection(scope)
    if sandbox_access(state, conn.headers):
        return True
    key, token = credentials(conn)
    if key is None and token is None:
        key = conn.headers.get(API_KEY_HEADER)
    try:
        if token is not None:
            await auth.from_key_or_token(None, token)
        else:
            await auth.from_key(key)
    except Unauthorized:
        return False
    return True


def _limit(app: Starlette) -> int:
    state = find_gateway_state(app)
    if state is not None:
        return state.settings.max_request_bytes
    # Before the lifespan ran there is no gateway state. An app that is no gateway
    # (this middleware's unit test) may set ``app.state.settings`` itself.
    settings: Settings | None = getattr(app.state, "settings", None)
    return settings.max_request_bytes if settings is not None else DEFAULT_LIMIT


async def _reject(scope: Scope, send: Send, exc: KernelGWError) -> None:
    """``exc`` in the face's shape, the connection closed after it: the rest of
    the body is never read."""
    if scope["path"].startswith("/api/"):
        from kernelgw.server.jupyter.errors import reason

        body = orjson.dumps({"message": exc.message, "reason": reason(exc.status_code)})
    elif scope["path"].startswith("/e2b/"):
        from kernelgw.server.e2b.errors import UNAUTHORIZED_MESSAGE, error_body

        message = UNAUTHORIZED_MESSAGE if isinstance(exc, Unauthorized) else exc.message
        body = orjson.dumps(error_body(exc.status_code, message, exc.code))
    else:
        body = orjson.dumps({"error": {"code": exc.code, "message": exc.message}})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if isinstance(exc, Unauthorized):
        headers.append((b"www-authenticate", b'Bearer realm="kernelgw"'))
        client = scope.get("client")
        log.warning(
            "unauthorized request (its body was not read)",
            extra={"path": scope["path"], "client": f"{client[0]}:{client[1]}" if client else None},
        )
    elif exc.status_code == 503:
        headers.append((b"retry-after", b"5"))
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
