"""The WebSocket: live events out, execute/interrupt in, resume by ``last_seq``.

Close codes: 4404 no such session; 4008 the client fell too far behind (reconnect
with ``last_seq`` to resume); 1001 the session was deleted.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import TypeAdapter, ValidationError

from kernelgw import events as ev
from kernelgw.api.models import WsExecute, WsMessage
from kernelgw.api.routes import check_code_size
from kernelgw.errors import KernelGWError
from kernelgw.session import KernelSession, Subscription

router = APIRouter()
_message = TypeAdapter(WsMessage)

CLOSE_NOT_FOUND = 4404
CLOSE_TOO_SLOW = 4008
CLOSE_GOING_AWAY = 1001


@router.websocket("/v1/sessions/{session_id}/ws")
async def session_ws(websocket: WebSocket, session_id: str, last_seq: int | None = None) -> None:
    manager = websocket.app.state.manager
    try:
        session: KernelSession = manager.get(session_id)
    except KernelGWError as exc:
        await websocket.accept()
        await websocket.close(code=CLOSE_NOT_FOUND, reason=exc.message[:120])
        return
    await websocket.accept()
    sub = session.subscribe(last_seq)
    sender = asyncio.create_task(_send_events(websocket, sub))
    receiver = asyncio.create_task(_receive_commands(websocket, session, sub))
    try:
        await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        session.unsubscribe(sub)
        for task in (sender, receiver):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if sub.overflowed:
            code, reason = CLOSE_TOO_SLOW, "client too slow; reconnect with last_seq to resume"
        else:
            code, reason = CLOSE_GOING_AWAY, "session closed"
        with contextlib.suppress(Exception):
            await websocket.close(code=code, reason=reason)


async def _send_events(websocket: WebSocket, sub: Subscription) -> None:
    while True:
        text = await sub.get()
        if text is None:
            return
        await websocket.send_text(text)


async def _receive_commands(websocket: WebSocket, session: KernelSession, sub: Subscription) -> None:
    settings = websocket.app.state.settings
    while True:
        try:
            raw = await websocket.receive_text()
        except WebSocketDisconnect:
            return
        except (KeyError, RuntimeError):
            # a binary frame (no "text" key) or a closed socket
            if websocket.client_state.name != "CONNECTED":
                return
            _reply(sub, "binary frames are not accepted; send JSON text")
            continue
        if len(raw.encode("utf-8", "surrogatepass")) > settings.max_code_bytes + 4096:
            _reply(sub, f"message larger than the limit of {settings.max_code_bytes} bytes of code")
            continue
        try:
            msg = _message.validate_json(raw)
        except ValidationError as exc:
            _reply(sub, _describe(exc))
            continue
        try:
            if isinstance(msg, WsExecute):
                check_code_size(settings.max_code_bytes, msg.code)
                session.submit(msg.code, execution_id=msg.execution_id, timeout=msg.timeout)
            else:
                await session.interrupt()
        except KernelGWError as exc:
            _reply(sub, exc.message, getattr(msg, "execution_id", None))


def _reply(sub: Subscription, message: str, execution_id: str | None = None) -> None:
    """A protocol error goes to this client only, outside the session's sequence."""
    sub.offer(ev.ProtocolError(message=message, execution_id=execution_id).model_dump_json())


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return "message is not valid JSON; send {\"type\": \"execute\", \"code\": \"...\"} or {\"type\": \"interrupt\"}"
    loc = ".".join(str(x) for x in first.get("loc", ()))
    return (
        f"invalid message ({loc or 'message'}: {first.get('msg')}); expected "
        "{\"type\": \"execute\", \"code\": \"...\", \"execution_id\"?: str, \"timeout\"?: number} "
        "or {\"type\": \"interrupt\"}"
    )
