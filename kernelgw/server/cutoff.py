"""`AnswerAtClose`: every HTTP request is answered by the end of the drain.

uvicorn waits for open requests when it stops (then cancels them without an
answer), so one slow request (a stalled upload, a long restart) held the
process past ``shutdown_grace_s``. This middleware keeps each request in the
drain's ``open`` set; a request the drain cancels at its close is answered
503 ``gateway_restarting`` here, in its face's shape. WebSockets end by
themselves at the close (1012).
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernelgw.server.drain import CUT_OFF_CODE, CUT_OFF_RETRY_AFTER_S, OpenRequest
from kernelgw.server.state import find_gateway_state

CUT_OFF_MESSAGE = (
    "The gateway is restarting and its shutdown grace ran out before this request was answered: it was "
    "cut off and may or may not have taken effect. Check the session (GET /v1/sessions/{id}) before "
    "sending it again."
)


class AnswerAtClose:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = find_gateway_state(scope["app"]) if scope["type"] == "http" and "app" in scope else None
        task = asyncio.current_task()
        if state is None or task is None:
            await self.app(scope, receive, send)
            return
        request = OpenRequest(task)

        async def tracking_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                request.answering = True
            await send(message)

        open_requests = state.drain.open
        open_requests.add(request)
        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:
            if not request.cut_off or request.answering:
                raise
            task.uncancel()
            await _answer(scope, send)
        finally:
            open_requests.discard(request)


async def _answer(scope: Scope, send: Send) -> None:
    if scope["path"].startswith("/api/"):  # the Jupyter face's error shape
        body = orjson.dumps({"message": CUT_OFF_MESSAGE, "reason": HTTPStatus.SERVICE_UNAVAILABLE.phrase})
    else:
        body = orjson.dumps({"error": {"code": CUT_OFF_CODE, "message": CUT_OFF_MESSAGE}})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(CUT_OFF_RETRY_AFTER_S).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})
