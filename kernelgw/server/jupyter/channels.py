"""The channels WebSocket, ``/api/kernels/{id}/channels``: a Jupyter client's
shell, iopub, stdin and control to the session's kernel.

Each connection gets its own ZMQ sockets to the kernel, as in Jupyter Server:
replies (shell, control, stdin's input requests) reach only the connection
whose request caused them, and every connection receives the kernel's iopub.
So no routing table is shared between clients, and a connection only ever
has sockets to its own session's kernel.

What a client sends is parsed and checked (`wire`: known channel and message
type, a well-formed header) and signed by the gateway with the kernel's key;
anything else is dropped and logged, as Jupyter Server does, and never ends
another client's connection. Code sent in an ``execute_request`` passes the
same admission as /v1 (code size, code policy, the key's rate): a refused one
gets an ``error`` and an ``execute_reply`` with status ``error``. What the
kernel sends is untrusted: the /v1 output caps apply (`caps`).

An ``execute_request`` (not silent) is a cell of the session's queue
(`cells`): the session's kernel link sends it when its turn comes, after any
/v1 cell ahead of it, and it is recorded, streamed to /v1 watchers and
exported like theirs. Its reply and final ``idle`` reach the client once its
record is stored. Comm messages go to the kernel at once on the socket the
cells go out on (``IN_ORDER_WITH_CELLS``: behind the cells sent before them,
though ahead of cells still waiting in the session's queue). Other requests
(completion, inspection, silent code) go straight to the kernel on the
connection's own sockets.

A restart (from either face, or after a timeout) replaces the kernel's
container: the connection notices the new kernel and reconnects to it; the
session's deletion closes the socket (1001).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import zmq
import zmq.asyncio
from fastapi import APIRouter, WebSocket
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import KernelConnectionInfo
from starlette.websockets import WebSocketDisconnect

from kernelgw.errors import KernelGWError, Unauthorized
from kernelgw.keys import Principal
from kernelgw.runtime.backends.base import KernelHandle
from kernelgw.runtime.kernel_connection import RECEIVE_HWM
from kernelgw.runtime.refused import watch_refused
from kernelgw.runtime.session import KernelSession
from kernelgw.server.admission import admit
from kernelgw.server.jupyter import caps, cells, kernels, missed, wire
from kernelgw.server.state import GatewayState, gateway_state
from kernelgw.tasks import TurnTaker, cancel_and_wait

IN_ORDER_WITH_CELLS = frozenset({"comm_open", "comm_msg", "comm_close"})
"""Shell messages without a reply, sent on the socket cells go out on, so the
kernel sees them in the order the client sent them with its cells (its replies
would come back to that socket, not ours: requests with replies keep our own)."""

log = logging.getLogger(__name__)
router = APIRouter()

CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_SERVICE_RESTART = 1012
NUDGE_TIMEOUT_S = 10.0
WATCH_INTERVAL_S = 0.1
_resumes: set[asyncio.Task[None]] = set()
"""Resumes started by channels requests (held until they end)."""


@router.websocket("/api/kernels/{kernel_id}/channels")
async def channels(websocket: WebSocket, kernel_id: str, session_id: str | None = None) -> None:
    """Refusals come after accepting, as close codes, as on /v1 (browsers never
    see a refused handshake's status): 4401 no valid key or token, 4403 a page
    from another origin, 4404 no such kernel (or another key's)."""
    state = gateway_state(websocket)
    try:
        principal = await kernels.authenticate(websocket)
    except Unauthorized as exc:
        await _refuse(websocket, CLOSE_UNAUTHORIZED, exc.message)
        return
    try:
        session = kernels.find(state, principal, kernel_id)
    except KernelGWError as exc:
        await _refuse(websocket, CLOSE_NOT_FOUND, exc.message)
        return
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    v1 = wire.V1_PROTOCOL in offered
    await websocket.accept(subprotocol=wire.V1_PROTOCOL if v1 else None)
    conn = ChannelsConnection(websocket, session, state, principal, v1=v1, client_session=session_id)
    await conn.run()


async def _refuse(websocket: WebSocket, code: int, reason: str) -> None:
    await websocket.accept()
    await websocket.close(code=code, reason=reason[:120])


class ChannelsConnection:
    def __init__(
        self,
        websocket: WebSocket,
        session: KernelSession,
        state: GatewayState,
        principal: Principal,
        *,
        v1: bool,
        client_session: str | None = None,
    ) -> None:
        self.websocket = websocket
        self.session = session
        self.state = state
        self.principal = principal
        self.v1 = v1
        self.client_session = client_session
        config = session.config
        self.caps = caps.OutputCaps(config.max_output_bytes, config.max_image_bytes)
        self._outbox: asyncio.Queue[str | bytes | None] = asyncio.Queue()
        self._cells = cells.ClientCells(self, client_session)
        self._rejoined = False
        self._outbox_bytes = 0
        self._max_outbox_bytes = state.settings.subscriber_max_bytes
        self._kc: AsyncKernelClient | None = None
        self._handle: KernelHandle | None = None
        self._readers: list[asyncio.Task[None]] = []
        self._ready = asyncio.Event()
        self._held_iopub: list[dict[str, Any]] = []
        """iopub messages read while the connection is being made (`_connect`)."""
        self._nudges: set[str] = set()
        self._nudged = asyncio.Event()
        self._nudge_replied = asyncio.Event()
        self._last_parent: dict[str, Any] = {}
        self._dead_sent = False
        self._resuming: asyncio.Task[None] | None = None
        self.close_code = CLOSE_GOING_AWAY
        self.close_reason = "kernel closed"

    # ------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        clients = kernels.connections(self.session)
        clients.add(self)
        sub = self.session.subscribe()  # a watcher keeps the session from being reaped; ends at delete
        tasks = {
            asyncio.create_task(self._send_loop(), name="jupyter-ws-send"),
            asyncio.create_task(self._receive_loop(), name="jupyter-ws-receive"),
            asyncio.create_task(self._watch_kernel(), name="jupyter-ws-kernel"),
            asyncio.create_task(self._watch_session(sub), name="jupyter-ws-session"),
            asyncio.create_task(self._watch_drain(), name="jupyter-ws-drain"),
        }
        if self.principal.key_id is not None:
            tasks.add(asyncio.create_task(self._watch_key(self.principal.key_id), name="jupyter-ws-key"))
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            clients.discard(self)
            cells.leave(self.session, self.client_session, self._cells)
            self.session.unsubscribe(sub)
            await cancel_and_wait(*tasks)
            await self._disconnect()
            with contextlib.suppress(Exception):
                await self.websocket.close(code=self.close_code, reason=self.close_reason)

    async def _connect(self, handle: KernelHandle) -> None:
        """Sockets of our own to the kernel behind ``handle``, then the nudge."""
        await self._disconnect()
        context = zmq.asyncio.Context.instance()
        context.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        context.setsockopt(zmq.MAXMSGSIZE, self.session.config.max_message_bytes)
        kc = AsyncKernelClient(context=context)
        kc.load_connection_info(cast(KernelConnectionInfo, handle.connection))
        kc.start_channels(shell=True, iopub=True, stdin=True, hb=False, control=True)
        self._kc, self._handle = kc, handle
        self._dead_sent = False
        self._readers = [
            asyncio.create_task(self._read("iopub", kc.get_iopub_msg)),
            asyncio.create_task(self._read("shell", kc.get_shell_msg)),
            asyncio.create_task(self._read("control", kc.get_control_msg)),
            asyncio.create_task(self._read("stdin", kc.get_stdin_msg)),
            asyncio.create_task(self._watch_oversized(kc.iopub_channel.socket)),
        ]
        await self._nudge(kc)
        if not self._rejoined:
            # our iopub socket has joined: what the client missed while away, then live
            self._rejoined = True
            left = cells.rejoin(self.session, self.client_session, self)
            if left is not None:
                self._cells = left.cells
                self.state.store.client_answered(self.session.id, left.answered)
            if self.client_session:
                # cells this process does not know of: ended or cut off before a restart
                await missed.replay_stored(self.state.store, self.session, self.client_session, self)
        # what our socket read meanwhile, after that (what the replay sent is skipped)
        held, self._held_iopub = self._held_iopub, []
        for msg in held:
            self._forward_iopub(msg)
        self._ready.set()

    async def _disconnect(self) -> None:
        self._ready.clear()
        self._held_iopub = []  # read on sockets about to close (a kernel restart reconnects)
        with contextlib.suppress(Exception):
            if self._kc is not None:
                self._kc.iopub_channel.socket.disable_monitor()
        await cancel_and_wait(*self._readers)
        self._readers = []
        if self._kc is not None:
            kc, self._kc = self._kc, None
            with contextlib.suppress(Exception):
                kc.stop_channels()

    async def _nudge(self, kc: AsyncKernelClient) -> None:
        """kernel_info on control until its ``status: idle`` comes back on iopub:
        our SUB socket has joined (no output of the client's first request is
        lost) and the kernel is done with it. One request at a time, the next only
        after the reply: ipykernel 7 can strand a request that arrives while it
        sends a reply (see the kernel link's docstring)."""
        self._nudged.clear()
        deadline = time.monotonic() + NUDGE_TIMEOUT_S
        while time.monotonic() < deadline:
            request = kc.session.msg("kernel_info_request")
            if len(self._nudges) >= 256:
                self._nudges.clear()
            self._nudges.add(request["header"]["msg_id"])
            self._nudge_replied.clear()
            kc.control_channel.send(request)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.01, min(1.0, deadline - time.monotonic()))):
                    await self._nudged.wait()
                    return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.01, deadline - time.monotonic())):
                    await self._nudge_replied.wait()
        log.warning("session %s: the kernel's iopub did not answer the channels nudge", self.session.id)

    # ------------------------------------------------------------ watchers
    async def _watch_kernel(self) -> None:
        """Follow the session's kernel: connect at first, reconnect after a restart."""
        while True:
            handle = self.session.handle
            if self.session.state == "closed":
                return
            if handle is not self._handle:
                # a restart began (no handle, or one still starting) or ended: nothing
                # may go to the old kernel, and the new one is joined once it answers
                if self._kc is not None:
                    await self._disconnect()
                    self.send_kernel("iopub", caps.gateway_message("status", {}, {"execution_state": "restarting"}))
                self._handle = None
                if handle is not None and self.session.state in ("idle", "busy"):
                    await self._connect(handle)
            if self.session.state == "dead" and not self._dead_sent:
                self._dead_sent = True
                self.send_kernel("iopub", caps.gateway_message("status", {}, {"execution_state": "dead"}))
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def _watch_session(self, sub: Any) -> None:
        while await sub.get() is not None:
            pass  # /v1 events are not this face's; the end of the stream is the session's

    async def _watch_drain(self) -> None:
        await self.state.drain.wait_closing()
        self.close_code, self.close_reason = CLOSE_SERVICE_RESTART, "the gateway is restarting"

    async def _watch_key(self, key_id: str) -> None:
        auth = self.state.auth
        interval = max(auth.settings.auth_cache_s, 1.0)
        while True:
            await asyncio.sleep(interval)
            if not await auth.key_active(key_id):
                self.close_code, self.close_reason = CLOSE_POLICY, "the API key was revoked"
                return

    async def _watch_oversized(self, sock: zmq.asyncio.Socket) -> None:
        """After a message over the size cap was refused and iopub reconnected
        (`runtime.refused`): tell the client output was lost."""

        def refused() -> None:
            limit = self.session.config.max_message_bytes
            self.send_kernel(
                "iopub",
                caps.truncation_note(
                    self._last_parent,
                    f"the kernel sent a message larger than {limit} bytes; it was dropped, and output "
                    "until the connection recovered may be missing (the code kept running)",
                ),
            )

        await watch_refused(sock, refused)

    # ------------------------------------------------------------ kernel -> client
    async def _read(self, channel: str, get: Callable[[], Awaitable[Any]]) -> None:
        while True:
            try:
                msg = await get()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("session %s: dropped an invalid %s message (%s)", self.session.id, channel, exc)
                continue
            busy = time.thread_time()
            self._take(channel, msg)
            if channel == "iopub" and (share := self.session.output_share) is not None:
                # a flood forwarded to this client is charged to its session's
                # share of the loop, as the session's own reading of it is
                # (`runtime.loop_share`): other sessions' cells are not starved
                if wait := share.spent(time.thread_time() - busy, time.perf_counter()):
                    await asyncio.sleep(wait)

    def _take(self, channel: str, msg: Any) -> None:
        if not (isinstance(msg, dict) and isinstance(msg.get("header"), dict) and "msg_type" in msg["header"]):
            return
        parent = msg.get("parent_header") or {}
        if not isinstance(parent, dict):
            return
        if parent.get("msg_id") in self._nudges:
            if channel == "control":
                self._nudge_replied.set()
            elif channel == "iopub" and (msg.get("content") or {}).get("execution_state") == "idle":
                self._nudged.set()
            return
        if channel != "iopub":
            self.send_kernel(channel, msg)
        elif not self._ready.is_set():
            # read while the connection is made: after what the client missed (`_connect`)
            self._held_iopub.append(msg)
        else:
            self._forward_iopub(msg)

    def _forward_iopub(self, msg: dict[str, Any]) -> None:
        parent = msg.get("parent_header") or {}
        if self._cells.already_sent(parent.get("msg_id"), msg):
            return  # sent when the client came back (`cells.rejoin`)
        if parent:
            self._last_parent = parent
        if msg["header"]["msg_type"] == "status":
            state = (msg.get("content") or {}).get("execution_state")
            if isinstance(state, str):
                kernels.status_seen(self.session, state)
            if state == "idle" and isinstance(parent.get("msg_id"), str) and self._cells.idle(parent["msg_id"], msg):
                return  # our cell's end is the gateway's to tell (`cells`)
        for out in self.caps.apply(msg):
            self.send_kernel("iopub", out)

    def _encode(self, channel: str, msg: dict[str, Any]) -> str | bytes | None:
        try:
            return wire.to_v1_frame(channel, msg) if self.v1 else wire.to_json_frame(channel, msg)
        except (TypeError, ValueError) as exc:
            log.warning("session %s: a %s message could not be encoded (%s)", self.session.id, channel, exc)
            return None

    def send_kernel(self, channel: str, msg: dict[str, Any]) -> None:
        frame = self._encode(channel, msg)
        if frame is None:
            return
        self._outbox_bytes += len(frame)
        if self._outbox_bytes > self._max_outbox_bytes:
            # the client does not keep up: end this connection, not the gateway's memory
            self.close_code, self.close_reason = CLOSE_POLICY, "client too slow"
            self._outbox.put_nowait(None)
            return
        self._outbox.put_nowait(frame)

    async def _send_loop(self) -> None:
        turns = TurnTaker()
        while True:
            frame = await self._outbox.get()
            if frame is None:
                return
            self._outbox_bytes -= len(frame)
            await self._send_frame(frame)
            await turns.step()

    async def _send_frame(self, frame: str | bytes) -> None:
        if isinstance(frame, str):
            await self.websocket.send_text(frame)
        else:
            await self.websocket.send_bytes(frame)

    # ------------------------------------------------------------ client -> kernel
    async def _receive_loop(self) -> None:
        limit = self.state.settings.ws_max_message_bytes
        while True:
            try:
                frame = await self.websocket.receive()
            except (WebSocketDisconnect, RuntimeError):
                return
            if frame["type"] == "websocket.disconnect":
                return
            text, data = frame.get("text"), frame.get("bytes")
            size = len(text) if text is not None else len(data or b"")
            if size > limit:
                log.warning("session %s: dropped a %d-byte channels message (limit %d)", self.session.id, size, limit)
                continue
            try:
                if text is not None:
                    msg = wire.parse_text(text)
                elif data is not None:
                    msg = wire.parse_v1(data) if self.v1 else wire.parse_legacy_binary(data)
                else:
                    continue
            except wire.WireError as exc:
                log.warning("session %s: dropped a channels message: %s", self.session.id, exc)
                continue
            await self._forward(msg)

    async def _forward(self, msg: wire.ClientMessage) -> None:
        cell = msg.msg_type == "execute_request" and not msg.content.get("silent")
        if msg.msg_type == "execute_request":
            code = msg.content.get("code")
            if not isinstance(code, str):
                log.warning("session %s: dropped an execute_request without code", self.session.id)
                return
            try:
                await admit(self.state, self.principal, code, self.session.spec.kernel)
            except KernelGWError as exc:
                self._refuse(msg, type(exc).__name__, exc.message)
                return
        if self.session.state == "paused" and (self._resuming is None or self._resuming.done()):
            # culled with idle_action=pause: the client's request brings the kernel back
            # (not cancelled with the connection: a resume runs to its end)
            self._resuming = asyncio.create_task(self._resume(), name="jupyter-ws-resume")
            _resumes.add(self._resuming)
            self._resuming.add_done_callback(_resumes.discard)
        deadline = time.monotonic() + self.state.settings.kernel_start_timeout_s
        while not (self._ready.is_set() and self._handle is self.session.handle):
            # (re)connecting: the message waits for the kernel it is meant for (a
            # cell also for our iopub socket, so none of its output is missed)
            if time.monotonic() > deadline or self.session.state == "closed":
                log.warning("session %s: no kernel to send a %s to; dropped", self.session.id, msg.msg_type)
                return
            await asyncio.sleep(WATCH_INTERVAL_S / 2)
        if cell:
            self._submit(msg)
            return
        if msg.msg_type == "input_reply" and self._cells.owns(self.session.current_execution):
            # our cell's input_request came through the session's own socket
            self.session.send_message("stdin", msg.to_zmq())
            return
        if msg.channel == "shell" and msg.msg_type in IN_ORDER_WITH_CELLS:
            # on the session's socket, before any cell the client sends after it
            # (a widget's new value, then the cell that reads it)
            if self.session.send_message("shell", msg.to_zmq()):
                self.session.touch()
            return
        kc = self._kc
        if kc is None:
            return
        channel = {"shell": kc.shell_channel, "control": kc.control_channel, "stdin": kc.stdin_channel}[msg.channel]
        try:
            channel.send(msg.to_zmq())
        except (TypeError, ValueError, zmq.ZMQError) as exc:
            log.warning("session %s: could not send a %s (%s)", self.session.id, msg.msg_type, exc)
            return
        self.session.touch()

    async def _resume(self) -> None:
        try:
            await self.session.resume()
        except KernelGWError as exc:
            log.warning("session %s: a channels request could not resume it: %s", self.session.id, exc.message)

    def _submit(self, msg: wire.ClientMessage) -> None:
        """Queue an execute_request as a cell of the session (`cells`)."""
        cell = self._cells.new(msg)
        try:
            cell.execution = self.session.submit(
                str(msg.content["code"]),
                cell.execution_id,
                self.session.config.max_exec_timeout_s,
                client=cell,
            )
        except KernelGWError as exc:
            self._cells.drop(cell)
            self._refuse(msg, type(exc).__name__, exc.message)

    def _refuse(self, msg: wire.ClientMessage, ename: str, evalue: str) -> None:
        """An execution the gateway refused: what a kernel's error would look like,
        to this client only."""
        parent = msg.header
        error = {"ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"]}
        self.send_kernel("iopub", caps.gateway_message("status", parent, {"execution_state": "busy"}))
        self.send_kernel("iopub", caps.gateway_message("error", parent, error))
        reply = {"status": "error", "execution_count": None, **error}
        self.send_kernel("shell", caps.gateway_message("execute_reply", parent, reply))
        self.send_kernel("iopub", caps.gateway_message("status", parent, {"execution_state": "idle"}))
