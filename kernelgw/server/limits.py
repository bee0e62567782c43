"""Request body cap for the JSON API, as a pure ASGI middleware.

Starlette reads a body whole before validation; without a cap a client could
make the gateway buffer any amount. File uploads are streamed to the container
and have their own limit (``max_upload_bytes``), so they are exempt here.
"""

from __future__ import annotations

import re

import orjson
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernelgw.config import Settings
from kernelgw.server.state import find_gateway_state

DEFAULT_LIMIT = 32 * 1024 * 1024
_UPLOAD = re.compile(r"^/v1/sessions/[^/]+/files/.")


class _BodyTooLarge(BaseException):
    """A BaseException on purpose: FastAPI turns any Exception raised while it
    reads a body into a 400 "error parsing the body", which would hide the 413."""


class BodySizeLimit:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"] == "PUT" and _UPLOAD.match(scope["path"])):
            await self.app(scope, receive, send)
            return
        limit = _limit(scope["app"])
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = 0
                if length > limit:
                    await _reject(send, limit)
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
                await _reject(send, limit)


def _limit(app: Starlette) -> int:
    state = find_gateway_state(app)
    if state is not None:
        return state.settings.max_request_bytes
    # Before the lifespan ran there is no gateway state. An app that is no gateway
    # (this middleware's unit test) may set ``app.state.settings`` itself.
    settings: Settings | None = getattr(app.state, "settings", None)
    return settings.max_request_bytes if settings is not None else DEFAULT_LIMIT


async def _reject(send: Send, limit: int) -> None:
    body = orjson.dumps(
        {
            "error": {
                "code": "payload_too_large",
                "message": f"The request body is larger than the gateway's limit of {limit} bytes.",
            }
        }
    )
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
