"""Connecting to a kernel's sockets, and waiting until it answers on them.

The ZMQ client is made with the receive queues and the message size cap the
gateway's reading relies on. A kernel has answered once a kernel_info request
got its reply *and* an iopub message came (the readiness nudge, as
jupyter_server's): before that, the first execution could lose output to a SUB
socket that had not joined yet. The same nudge brings iopub back after ZMQ
dropped it for an oversized message. It is ready once, besides, our stdin
socket has joined: stdin carries no reply to prove it, and a kernel's ROUTER
drops an ``input_request`` to a peer it does not know yet, leaving the cell
waiting for an answer forever (measured: 1 of 5 local ipykernels answered
kernel_info 42 ms before our stdin socket's handshake). Its first handshake is
watched with a socket monitor attached before the socket connects.

One request at a time: each kernel_info request goes out only after the reply
to the one before (see `kernel_link`'s docstring for why).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import Mapping
from typing import Any, Literal, cast

import zmq
import zmq.asyncio
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import KernelConnectionInfo

from kernelgw.errors import KernelStartFailed
from kernelgw.runtime.backends.base import Backend, KernelHandle
from kernelgw.runtime.kernel_messages import KernelMessageReader, KernelMessageSender
from kernelgw.runtime.message_routes import MessageRoutes

RECEIVE_HWM = 100_000
"""Messages ZMQ may queue on our side of a kernel's sockets. The default (1000,
plus the kernel's 1000 send HWM) let a burst of small flushed prints overflow
while the event loop was busy elsewhere: PUB/SUB then drops silently, output
was lost and, when the dropped message was ``status: idle``, the execution
never finished."""
IOPUB_RECEIVE_HWM = 64
"""Messages ZMQ queues on our side of the iopub socket of a kernel that sends with
a deep queue of its own (`DEEP_SEND_QUEUE`). Past it ZMQ stops reading the
socket, and what the kernel sends on waits in the kernel's send queue, in the
kernel's memory (counted against its container's limit), instead of ours: a
reader that waits (`OutputBacklog`, `LoopShare`) then holds back the kernel, not
the gateway's memory. The Python kernel sends stream text in slices of 256 KiB,
so this holds about 16 MiB of a flood at most; 64 is also `MAX_BATCH`, what one
read takes."""
DEEP_SEND_QUEUE = frozenset({"python3"})
"""Kernels whose image's launcher (``kernelgw_kernel.launcher``) never drops
iopub (a send waits past its queue) and slices its streams: their iopub is read
with `IOPUB_RECEIVE_HWM`. The others keep `RECEIVE_HWM`: IRkernel, Deno and JJava
send with ZMQ's 1000, which a small receive queue would turn into lost output,
and the compiled languages' kernels do not slice what their programs print.
(A Python image not built on the project's runs plain ipykernel, with 1000:
it then has 1,064 messages of slack instead of 101,000.)"""


class HandshakeWatch:
    """The first completed handshake of one socket, watched from before it connects
    (a monitor attached later can miss it). Closed after that first one: libzmq
    sends monitor events blocking, so a monitor nobody reads (a restarting
    kernel's reconnects) must not stay attached."""

    def __init__(self, socket: zmq.asyncio.Socket) -> None:
        self._socket = socket
        self._monitor: zmq.asyncio.Socket | None = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)

    async def wait(self, timeout: float) -> bool:
        """True once the socket has joined its peer; False after ``timeout`` seconds."""
        monitor = self._monitor
        if monitor is None:
            return True
        try:
            async with asyncio.timeout(timeout):
                await monitor.recv_multipart()  # the only event it reports
            return True
        except TimeoutError:
            return False
        finally:
            self.close()

    def close(self) -> None:
        monitor, self._monitor = self._monitor, None
        if monitor is not None:
            # disabled before its pipe's end closes (see `KernelLink.stop`)
            with contextlib.suppress(zmq.ZMQError):
                self._socket.disable_monitor()
            monitor.close(linger=0)


class KernelClient(AsyncKernelClient):
    """jupyter_client's asyncio client whose stdin socket is watched until it joins."""

    stdin_joined: HandshakeWatch | None = None

    def connect_stdin(self, identity: bytes | None = None) -> zmq.asyncio.Socket:
        # as jupyter_client's _create_connected_socket, with the watch before connect
        socket = self.context.socket(zmq.DEALER)
        socket.linger = 1000
        if identity:
            socket.identity = identity
        self.stdin_joined = HandshakeWatch(socket)
        socket.connect(self._make_url("stdin"))
        return socket


def kernel_client(handle: KernelHandle, kernel: str, max_message_bytes: int) -> KernelClient:
    """A client of the kernel ``handle`` names (of kind ``kernel``), its channels
    started: shell, iopub, stdin (a Jupyter client's cell may call input()) and control."""
    # Socket options must be set before connect: use a context whose defaults
    # raise the receive HWM for the sockets jupyter_client creates.
    context = zmq.asyncio.Context.instance()
    context.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
    # A frame over the cap makes ZMQ drop the connection instead of
    # allocating it: what a kernel sends cannot grow our memory unbounded.
    context.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    kc = KernelClient(context=context)
    kc.load_connection_info(cast(KernelConnectionInfo, handle.connection))
    if kernel in DEEP_SEND_QUEUE:
        # made (and connected) before the others, with its own receive HWM
        context.setsockopt(zmq.RCVHWM, IOPUB_RECEIVE_HWM)
        try:
            kc.iopub_channel  # noqa: B018 (the property connects the socket)
        finally:
            context.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
    kc.start_channels(shell=True, iopub=True, stdin=True, hb=False, control=True)
    return kc


async def wait_ready(
    kc: KernelClient,
    shell: KernelMessageSender,
    readers: Mapping[str, KernelMessageReader],
    backend: Backend,
    handle: KernelHandle,
    timeout: float,
    channel: Literal["shell", "control"] = "shell",
) -> dict[str, Any]:
    """Repeat kernel_info until a reply and an iopub message both arrive, then wait
    for stdin to have joined; returns the reply's content. `KernelStartFailed`
    once the container stopped or ``timeout`` seconds passed.

    A reattached kernel is asked on ``control``: it may still be running the
    cell the previous gateway process was cut off from, and ipykernel answers
    control requests while the shell is busy.

    Shell and iopub are read with the link's own ``readers``, which go on
    reading them after: pyzmq's asyncio reading, once used on a socket, keeps
    handling every signal of it (about 20 us a message)."""
    deadline = time.monotonic() + timeout
    iopub, shell_reader = readers["iopub"], readers["shell"]
    info: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        # one request at a time, the next only after the reply (see the module's docstring)
        if channel == "shell":
            msg_id = shell.kernel_info()
        else:
            request = kc.session.msg("kernel_info_request")
            kc.control_channel.send(request)
            msg_id = request["header"]["msg_id"]
        replied = False
        while not replied and time.monotonic() < deadline:
            wait = max(0.01, min(0.5, deadline - time.monotonic()))
            try:
                if channel == "shell":
                    async with asyncio.timeout(wait):
                        replies = await shell_reader.batch()
                else:
                    replies = [await kc.get_control_msg(timeout=wait)]
            except (TimeoutError, queue.Empty):
                state = await backend.state(handle)
                if not state.alive:
                    raise KernelStartFailed(
                        f"The kernel container stopped while starting: {state.describe()}"
                    ) from None
                continue
            for reply in replies:
                if reply["parent_header"].get("msg_id") == msg_id:
                    info, replied = reply["content"], True
        if not replied:
            break
        try:
            # any iopub message proves the SUB socket has joined
            async with asyncio.timeout(0.2):
                await iopub.batch()
        except TimeoutError:
            continue
        # Leftover handshake messages need no draining: the readers drop
        # anything whose parent is not a pending execution.
        assert info is not None
        if kc.stdin_joined is not None and not await kc.stdin_joined.wait(max(0.0, deadline - time.monotonic())):
            raise KernelStartFailed(
                f"The kernel answered on shell and iopub, but its stdin socket did not connect within {timeout:g}s."
            )
        return info
    raise KernelStartFailed(f"The kernel did not answer within {timeout:g}s.")


async def wait_resubscribed(shell: KernelMessageSender, routes: MessageRoutes, timeout: float) -> bool:
    """After iopub was dropped, ask kernel_info until its iopub status arrives:
    the SUB socket has reconnected and subscribed again. The link's readers
    route the answers (`MessageRoutes.nudge`); False when none came in time."""
    deadline = time.monotonic() + timeout
    ids: list[str] = []
    try:
        while time.monotonic() < deadline:
            # one probe at a time, the next only after the reply (see the module's docstring)
            msg_id = shell.kernel_info()
            ids.append(msg_id)
            replied, seen = routes.nudge(msg_id)
            try:
                async with asyncio.timeout(max(0.01, deadline - time.monotonic())):
                    await replied.wait()
                async with asyncio.timeout(0.2):
                    await seen.wait()
                return True
            except TimeoutError:
                continue
        return False
    finally:
        for msg_id in ids:
            routes.unnudge(msg_id)
