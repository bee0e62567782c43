"""The link to one kernel: its container, its ZMQ client and the readers.

Starts and stops the kernel through the `Backend`, connects and waits until it
answers (`kernel_connection`), reads iopub, shell and stdin, paces a flood of
output (`LoopShare`, `OutputRate`), and watches for messages ZMQ refused for
their size. Where what it reads goes, and how a cell's end is told from what a
kernel could forge, is `message_routes`' business.

Every send on a socket the link also reads goes through a `KernelMessageSender`
given that socket's reader: a send can take the signal of a message that
arrived meanwhile, so the sender wakes the reader after it.

One shell request at a time: the link never sends the kernel a request while
an earlier one is unanswered. ipykernel 7 before 7.4 can strand a request
that arrives while it is sending a reply on the same socket
(ipython/ipykernel#1529, #1554): the request then sits unread until something
else wakes the kernel (here, a timeout's SIGINT a minute later). The
execution queue sends a cell after the previous one has ended, an end probe
goes out after the reply it checks, and the readiness probes wait for each
reply before sending the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import zmq.asyncio
from jupyter_client.session import Session

from kernelgw.runtime.backends.base import Backend, KernelHandle, KernelSpec, KernelState
from kernelgw.runtime.execution import ARTIFACTS_EXPRESSION, ARTIFACTS_KEY, END_KEY, EndedCell, QueuedExecution
from kernelgw.runtime.kernel_connection import (
    DEEP_SEND_QUEUE,
    KernelClient,
    kernel_client,
    wait_ready,
    wait_resubscribed,
)
from kernelgw.runtime.kernel_messages import (
    InvalidKernelMessage,
    KernelMessageReader,
    KernelMessageSender,
    coalesce_streams,
)
from kernelgw.runtime.loop_share import LoopShare
from kernelgw.runtime.message_routes import LinkListener, MessageRoutes
from kernelgw.runtime.output_backlog import OutputBacklog
from kernelgw.runtime.output_kinds import UNBOUNDED_OUTPUT
from kernelgw.runtime.output_rate import (
    FLOOD_BYTES_PER_S,
    FLOOD_MESSAGES_PER_S,
    FLOOD_OUTPUT_BURST_S,
    OutputRate,
)
from kernelgw.runtime.refused import watch_refused
from kernelgw.runtime.session_config import SessionConfig
from kernelgw.tasks import cancel_and_wait

log = logging.getLogger(__name__)

FLOOD_SHARE = 0.25
"""At most this share of the event loop goes to one session's iopub while it
floods and other sessions have output too (`LoopShare`); at this share the
gateway still reads about 80 MB/s of stream text for one session."""
FLOOD_BURST_S = 0.025
"""Loop time a session's iopub may take at once before `FLOOD_SHARE` applies:
a cell's ordinary output (a 1 MB print, a chart) is never held back."""

IOPUB_WAITS_FEATURE = "kernelgw: iopub waits for its reader"
"""What our kernels' launcher adds to kernel_info's ``supported_features``
(``kernelgw_kernel.backpressure.FEATURE``): their output waits while unread."""


class ListenerMissing(RuntimeError):
    """The link was started before anything listens to what it reads."""


class KernelLink:
    """The gateway's connection to one kernel (the module's docstring)."""

    def __init__(self, session_id: str, spec: KernelSpec, backend: Backend, config: SessionConfig) -> None:
        self.session_id = session_id
        self.spec = spec
        self.backend = backend
        self.config = config
        self.handle: KernelHandle | None = None
        self.kernel_info: dict[str, Any] = {}
        self.last_iopub = time.monotonic()
        self.output_share: LoopShare | None = None
        """The share of the event loop its kernel's output may take, while read
        (`_read_iopub`); a Jupyter connection forwarding that output is charged to it too."""
        self.output_rate: OutputRate | None = None
        """The pace of the running reader's output (`OutputRate`)."""
        self.on_paced: Callable[[float], None] | None = None
        """Told the seconds of each wait that paced the output (a metric)."""
        self.backlog: OutputBacklog | None = None
        """The running cell's output not yet committed by the store: past its bound
        the iopub reader waits (`_read_iopub`); set by the execution queue."""
        self.iopub_stale = False
        """ZMQ dropped the iopub connection (an oversized message): resubscribe
        before the next execution, or its output would go nowhere."""
        self.disconnect_pending = False
        """A socket disconnected and it is not yet known whether ZMQ will retry:
        the running execution must not be finished as "idle lost" meanwhile."""
        self._oom_seen: tuple[str, int] = ("", 0)
        """The container's out-of-memory kills when the last cell was sent: only
        more than these name a death during it out-of-memory (`Backend.state`)."""
        self._kc: KernelClient | None = None
        self._senders: dict[Literal["shell", "stdin"], KernelMessageSender] = {}
        """What the link sends on the shell and stdin, each waking its socket's reader."""
        self._readers: list[asyncio.Task[None]] = []
        self._message_readers: dict[str, KernelMessageReader] = {}
        """Each channel's reader, closed once its task is (`stop`)."""
        self._routes = MessageRoutes(self._send_end_probe)
        self._listener: LinkListener | None = None
        self.on_stop: Callable[[], Awaitable[None]] | None = None
        """Awaited before a kernel that ran is stopped or left (the session's
        children, whose kernels live in its container, end first)."""

    def attach(self, listener: LinkListener) -> None:
        self._listener = listener

    @property
    def connected(self) -> bool:
        return self._kc is not None

    # ------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Start a kernel container and connect; returns once it answered."""
        if self._listener is None:
            raise ListenerMissing("attach a listener before starting the kernel link")
        await self._connect(await self.backend.start(self.spec), seal=True)

    async def reattach(self, handle: KernelHandle, timeout: float) -> None:
        """Connect to a kernel that is already running (a previous gateway process
        started and sealed it): no start, no seal; it must answer kernel_info
        within ``timeout`` seconds, else its container is removed."""
        if self._listener is None:
            raise ListenerMissing("attach a listener before reattaching the kernel link")
        await self._connect(handle, seal=False, timeout=timeout, channel="control")

    async def _connect(
        self,
        handle: KernelHandle,
        *,
        seal: bool,
        timeout: float | None = None,
        channel: Literal["shell", "control"] = "shell",
    ) -> None:
        listener = self._listener
        assert listener is not None
        self.handle = handle
        try:
            kc = self._kc = kernel_client(handle, self.spec.kernel, self.config.max_message_bytes)
            readers = self._message_readers
            for name, socket in (
                ("iopub", kc.iopub_channel.socket),
                ("shell", kc.shell_channel.socket),
                ("stdin", kc.stdin_channel.socket),
            ):
                readers[name] = self._reader(socket, kc.session, name)
            self._senders = {
                "shell": KernelMessageSender(kc.shell_channel.socket, kc.session, readers["shell"]),
                "stdin": KernelMessageSender(kc.stdin_channel.socket, kc.session, readers["stdin"]),
            }
            self.kernel_info = await self._wait_ready(kc, handle, timeout, channel)
            if seal:
                await self.backend.seal(handle)
        except BaseException:
            await self.stop()
            raise
        self._readers = [
            asyncio.create_task(self._read_iopub(readers["iopub"], listener), name=f"iopub-{self.session_id}"),
            asyncio.create_task(self._read_shell(readers["shell"], listener), name=f"shell-{self.session_id}"),
            asyncio.create_task(self._read_stdin(readers["stdin"]), name=f"stdin-{self.session_id}"),
            asyncio.create_task(
                self._watch_oversized("iopub", kc.iopub_channel.socket, listener),
                name=f"iopub-monitor-{self.session_id}",
            ),
            asyncio.create_task(
                self._watch_oversized("shell", kc.shell_channel.socket, listener),
                name=f"shell-monitor-{self.session_id}",
            ),
        ]

    async def _wait_ready(
        self,
        kc: KernelClient,
        handle: KernelHandle,
        timeout: float | None = None,
        channel: Literal["shell", "control"] = "shell",
    ) -> dict[str, Any]:
        """The kernel's kernel_info once it answered on shell (or control) and iopub
        and our stdin socket joined it (`kernel_connection.wait_ready`), read with
        the link's own readers."""
        timeout = self.config.kernel_start_timeout_s if timeout is None else timeout
        shell = self._senders["shell"]
        return await wait_ready(kc, shell, self._message_readers, self.backend, handle, timeout, channel)

    async def stop(self, *, keep_container: bool = False) -> None:
        """Stop the readers, disconnect, and remove the container (``keep_container``:
        leave it running, and ``handle`` set, for the next gateway)."""
        if self.handle is not None and self.on_stop is not None:
            try:
                await self.on_stop()
            except Exception:
                log.exception("session %s: before stopping its kernel", self.session_id)
        if self._kc is not None:
            # Monitors first, while the watchers still hold the other end of each
            # monitor pipe: libzmq sends monitor events blocking, holding the lock
            # that disable_monitor takes, and a send to a closed PAIR end never
            # returns. A dead kernel emits a connect retry every 100 ms, so with
            # the watchers stopped first, deleting it could hang the event loop.
            for channel in (self._kc.iopub_channel, self._kc.shell_channel):
                with contextlib.suppress(Exception):
                    channel.socket.disable_monitor()
            if self._kc.stdin_joined is not None:
                self._kc.stdin_joined.close()
        await cancel_and_wait(*self._readers)
        self._readers = []
        for reader in self._message_readers.values():
            reader.close()
        self._message_readers.clear()
        self._routes.forget_ended()
        if self._kc is not None:
            self._senders = {}
            self._kc.stop_channels()
            self._kc = None
        if self.handle is not None and not keep_container:
            handle, self.handle = self.handle, None
            await self.backend.stop(handle)

    # ------------------------------------------------------------- requests
    def send(self, execution: QueuedExecution, user_expressions: dict[str, str] | None = None) -> bool:
        """Send ``execution`` to the kernel and route its messages to it; False
        when there is no kernel to send it to."""
        if (shell := self._senders.get("shell")) is None:
            return False
        if (handle := self.handle) is not None:
            # alive now: out-of-memory kills so far (a subprocess's) did not end it
            self._oom_seen = (handle.container_id, self.backend.oom_kills(handle))
        checks = {ARTIFACTS_KEY: ARTIFACTS_EXPRESSION, END_KEY: repr(execution.nonce)}
        if execution.client is not None:
            # a Jupyter client's own request: its header, so what the kernel
            # sends back matches what that client waits for; the gateway's
            # expressions are added (and taken out of the reply it is shown)
            message = execution.client.message
            content = dict(message.get("content") or {})
            expressions = content.get("user_expressions")
            expressions = dict(expressions) if isinstance(expressions, dict) else {}
            execution.injected = tuple(k for k in checks if k not in expressions)
            content["user_expressions"] = {**expressions, **{k: checks[k] for k in execution.injected}}
            shell.send({**message, "content": content})
            msg_id = str(message["header"]["msg_id"])
        elif execution.silent:
            msg_id = shell.execute(
                execution.code, silent=True, store_history=False, user_expressions=user_expressions or {}
            )
        else:
            msg_id = shell.execute(
                execution.code, silent=False, store_history=True, user_expressions=checks, stop_on_error=False
            )
        self._routes.expect(execution, msg_id)
        return True

    def send_message(self, channel: Literal["shell", "stdin"], msg: dict[str, Any]) -> bool:
        """A Jupyter client's message that the kernel answers on no socket of the
        link's, sent on the link's socket; False when there is no kernel. On stdin:
        the answer to the running cell's ``input_request``, which must come back
        on the socket the request went to. On the shell: a message without a reply
        (a comm message) on the socket cells go out on: ZMQ keeps one socket's
        messages in order, and the kernel's ROUTER takes turns between sockets,
        so a ``comm_msg`` sent on the client's own socket could reach the kernel
        after the cell sent next."""
        if (sender := self._senders.get(channel)) is None:
            return False
        sender.send(msg)
        return True

    def forget(self, execution: QueuedExecution) -> None:
        """Stop routing messages to ``execution`` (`MessageRoutes.forget`)."""
        self._routes.forget(execution)

    def follow(self, execution: QueuedExecution, msg_id: str) -> bool:
        """Route the messages of a request a previous gateway sent as ``msg_id``
        (and left running in the kernel) to ``execution``, and send an end probe
        behind it at once: the kernel answers the probe after that request, so
        the probe tells its end also when the request ended before this link
        listened (its reply and idle then lost). False when there is no kernel."""
        if "shell" not in self._senders:
            return False
        self._routes.expect(execution, msg_id)
        self._routes.probe_end(execution)
        if execution.end_probe is None:
            self._routes.forget(execution)
            return False
        return True

    def ended(self, msg_id: str) -> EndedCell | None:
        """What the link remembers of the ended cell sent as ``msg_id`` (`EndedCell`)."""
        return self._routes.ended(msg_id)

    def _send_end_probe(self) -> str | None:
        """An end probe (`MessageRoutes.probe_end`): a silent request that also reads
        a failed cell's artifacts; its msg_id, None when there is no kernel."""
        if (shell := self._senders.get("shell")) is None:
            return None
        return shell.execute(
            "", silent=True, store_history=False, user_expressions={ARTIFACTS_KEY: ARTIFACTS_EXPRESSION}
        )

    async def silent_request(
        self, code: str, user_expressions: dict[str, str] | None = None, timeout: float = 5.0
    ) -> dict[str, Any] | None:
        """Run gateway-internal code: no history, no published events, no
        pre_run_cell hooks. Returns the execute_reply content, None on timeout."""
        probe = QueuedExecution(execution_id="internal", code=code, timeout=timeout, silent=True)
        if not self.send(probe, user_expressions):
            return None
        probe.idle_seen = True  # silent requests publish nothing we wait for
        try:
            async with asyncio.timeout(timeout):
                await probe.finished.wait()
            return probe.reply or {}
        except TimeoutError:
            return None
        finally:
            self.forget(probe)

    async def interrupt(self) -> None:
        """SIGINT to the kernel (it must be running)."""
        handle = self.handle
        assert handle is not None
        await self.backend.signal(handle, signal.SIGINT)

    async def container_state(self) -> KernelState | None:
        """The container's state, or None while there is none (restarting, closed)."""
        handle = self.handle
        if handle is None:
            return None
        container, seen = self._oom_seen
        return await self.backend.state(handle, seen if container == handle.container_id else 0)

    async def resync_if_stale(self, timeout: float = 10.0) -> None:
        """After iopub was dropped, wait until it is back (`kernel_connection.wait_resubscribed`)."""
        if not self.iopub_stale or (shell := self._senders.get("shell")) is None:
            return
        if await wait_resubscribed(shell, self._routes, timeout):
            self.iopub_stale = False
        else:
            log.warning("session %s: iopub did not come back within %gs", self.session_id, timeout)

    # ------------------------------------------------------------- readers
    def _reader(self, socket: zmq.asyncio.Socket, session: Session, channel: str) -> KernelMessageReader:
        """A malformed or forged message (bad signature, broken JSON) is dropped:
        the kernel cannot stop a reader."""

        def dropped(exc: InvalidKernelMessage) -> None:
            log.warning("session %s: dropped an invalid %s message (%s)", self.session_id, channel, exc)

        skip = self._routes.content_unread if channel == "iopub" else None
        return KernelMessageReader(socket, session, dropped, skip_content=skip)

    async def _read_iopub(self, reader: KernelMessageReader, listener: LinkListener) -> None:
        budget = self.output_share = LoopShare(FLOOD_SHARE, FLOOD_BURST_S)
        rate = self.output_rate = OutputRate(FLOOD_BYTES_PER_S, FLOOD_MESSAGES_PER_S, FLOOD_OUTPUT_BURST_S)
        routes = self._routes
        try:
            while True:
                if (backlog := self.backlog) is not None and backlog.over:
                    await backlog.room()
                    self.last_iopub = time.monotonic()  # it was unread, not quiet
                batch = await reader.batch()
                routes.note_orders(batch)
                for msg in coalesce_streams(batch):
                    self.last_iopub = time.monotonic()
                    routes.on_iopub(msg, listener)
                # a flood's next slice waits its turn behind other sessions, and
                # once it has spent its share of the loop, until that refills
                await asyncio.sleep(budget.spent(time.thread_time() - reader.busy_since, time.perf_counter()))
                # and while others have output, at most its rate (its kernel waits too)
                outputs = sum(1 for msg in batch if msg["header"]["msg_type"] in UNBOUNDED_OUTPUT)
                await rate.pace(reader.last_bytes, outputs, self._paced, self._rate_waited)
        finally:
            budget.close()
            rate.close()
            if self.output_share is budget:
                self.output_share = None

    def _paced(self) -> bool:
        """Whether the iopub reader keeps to `OutputRate`. Only a kernel that waits
        for its reader is slowed by reading slower: from any other, unread output
        would pile up (ours or its ZMQ queue) and be dropped. Ours says so in its
        kernel_info; what a kernel says only decides how its own output is read.
        Not while an interrupt or a timeout waits behind the output: read it all now."""
        features = self.kernel_info.get("supported_features")
        waits = self.spec.kernel in DEEP_SEND_QUEUE and isinstance(features, list) and IOPUB_WAITS_FEATURE in features
        return waits and not ((backlog := self.backlog) is not None and backlog.unbounded is not None)

    def _rate_waited(self, seconds: float) -> None:
        if self.on_paced is not None:
            self.on_paced(seconds)
        self.last_iopub = time.monotonic()  # unread, not quiet

    async def _read_shell(self, reader: KernelMessageReader, listener: LinkListener) -> None:
        while True:
            for msg in await reader.batch():
                self._routes.on_shell(msg, listener)

    async def _read_stdin(self, reader: KernelMessageReader) -> None:
        while True:
            for msg in await reader.batch():
                self._routes.on_stdin(msg)

    async def _watch_oversized(
        self, channel: Literal["iopub", "shell"], sock: zmq.asyncio.Socket, listener: LinkListener
    ) -> None:
        """After a message over ``max_message_bytes`` was refused (`runtime.refused`):
        tell the execution that was running that output was lost, and resubscribe
        iopub before the next one."""
        at_disconnect: list[QueuedExecution | None] = [None]

        def disconnected() -> None:
            at_disconnect[0] = listener.current_execution()
            self.disconnect_pending = True

        def settled() -> None:
            self.disconnect_pending = False

        def refused() -> None:
            log.warning(
                "session %s: the kernel sent a %s message over the size limit; dropped", self.session_id, channel
            )
            if channel == "iopub":
                self.iopub_stale = True
            if (reader := self._message_readers.get(channel)) is not None:
                reader.wake()  # reconnecting may have taken a message's signal
            self._routes.on_refused(channel, at_disconnect[0], self.config.max_message_bytes, listener)

        await watch_refused(sock, refused, disconnected, settled)
