"""The WebSocket: live events out, execute/interrupt in, resume by ``last_seq``.

Close codes: 4401 no valid key or token; 4403 a page from another origin or
an unknown host name (``kernelgw.server.hosts``, before this route);
4404 no such session (or another key's); 4008 the client fell too far behind
(reconnect with ``last_seq`` to resume); 1001 the session was deleted; 1009 a
frame over the size limit (the server closes); 1012 the gateway is restarting
(after its running cells' events, ``done`` included: reconnect with ``last_seq``).

Authentication: ``Authorization: Bearer <key>`` on the handshake, or, for
browsers, ``?token=`` from ``POST /v1/auth/token``. Failures are reported
after accepting, as close codes, since browsers never see a refused
handshake's status.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import TypeAdapter, ValidationError

from kernelgw import events as ev
from kernelgw.errors import KernelGWError, Unauthorized
from kernelgw.keys import Principal
from kernelgw.models import WsExecute, WsMessage
from kernelgw.runtime.session import KernelSession, Subscription
from kernelgw.server.admission import admit
from kernelgw.server.authenticator import Authenticator
from kernelgw.server.drain import Drain
from kernelgw.server.state import gateway_state
from kernelgw.tasks import TurnTaker, cancel_and_wait

router = APIRouter()
_message = TypeAdapter(WsMessage)

CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_TOO_SLOW = 4008
CLOSE_GOING_AWAY = 1001
CLOSE_SERVICE_RESTART = 1012


@router.websocket("/v1/sessions/{session_id}/ws")
async def session_ws(
    websocket: WebSocket, session_id: str, last_seq: int | None = None, token: str | None = None
) -> None:
    state = gateway_state(websocket)
    try:
        principal = await state.auth.from_key_or_token(websocket.headers.get("authorization"), token)
    except Unauthorized as exc:
        await websocket.accept()
        await websocket.close(code=CLOSE_UNAUTHORIZED, reason=exc.message[:120])
        return
    try:
        session: KernelSession = state.manager.get(session_id, principal)
    except KernelGWError as exc:
        await websocket.accept()
        await websocket.close(code=CLOSE_NOT_FOUND, reason=exc.message[:120])
        return
    await websocket.accept()
    sub = session.subscribe(last_seq)
    sender = asyncio.create_task(_send_events(websocket, sub))
    receiver = asyncio.create_task(_receive_commands(websocket, session, sub, principal))
    tasks = {sender, receiver}
    # a drain ends the subscription: the sender sends what it holds, then returns
    closer = asyncio.create_task(_end_at_drain(state.drain, sub))
    watcher = None
    if principal.key_id is not None:
        watcher = asyncio.create_task(_watch_key(state.auth, principal.key_id))
        tasks.add(watcher)
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        session.unsubscribe(sub)
        await cancel_and_wait(*tasks, closer)
        if watcher is not None and watcher.done() and not watcher.cancelled():
            code, reason = CLOSE_UNAUTHORIZED, "the API key was revoked"
        elif sub.overflowed:
            code, reason = CLOSE_TOO_SLOW, "client too slow; reconnect with last_seq to resume"
        elif state.drain.closing:
            code, reason = CLOSE_SERVICE_RESTART, "the gateway is restarting; reconnect with last_seq to resume"
        else:
            code, reason = CLOSE_GOING_AWAY, "session closed"
        with contextlib.suppress(Exception):
            await websocket.close(code=code, reason=reason)


async def _end_at_drain(drain: Drain, sub: Subscription) -> None:
    await drain.wait_closing()
    sub.close()


async def _watch_key(auth: Authenticator, key_id: str) -> None:
    """Return (closing the socket) once the key is revoked: an open WebSocket
    must not outlive the key that opened it."""
    interval = max(auth.settings.auth_cache_s, 1.0)
    while True:
        await asyncio.sleep(interval)
        if not await auth.key_active(key_id):
            return


async def _send_events(websocket: WebSocket, sub: Subscription) -> None:
    turns = TurnTaker()
    while True:
        text = await sub.get()
        if text is None:
            return
        await websocket.send_text(text)
        await turns.step()


async def _receive_commands(
    websocket: WebSocket, session: KernelSession, sub: Subscription, principal: Principal
) -> None:
    settings = gateway_state(websocket).settings
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
        if len(raw.encode("utf-8", "surrogatepass")) > settings.ws_max_message_bytes:
            _reply(sub, f"message larger than the limit of {settings.ws_max_message_bytes} bytes")
            continue
        try:
            msg = _message.validate_json(raw)
        except ValidationError as exc:
            _reply(sub, _describe(exc))
            continue
        try:
            if isinstance(msg, WsExecute):
                await admit(gateway_state(websocket), principal, msg.code, session.spec.kernel)
                session.submit(msg.code, execution_id=msg.execution_id, timeout=msg.timeout, replayable=msg.replay)
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
        return 'message is not valid JSON; send {"type": "execute", "code": "..."} or {"type": "interrupt"}'
    loc = ".".join(str(x) for x in first.get("loc", ()))
    return (
        f"invalid message ({loc or 'message'}: {first.get('msg')}); expected "
        '{"type": "execute", "code": "...", "execution_id"?: str, "timeout"?: number} '
        'or {"type": "interrupt"}'
    )
