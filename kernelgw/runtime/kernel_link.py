"""The link to one kernel: its container, its ZMQ client and the readers.

Starts and stops the kernel through the `Backend`, waits until it answers on
shell *and* iopub (the readiness nudge), reads both channels, and watches for
messages ZMQ refused for their size. Messages are routed by their parent's
msg_id to the request this link sent: the kernel holds the HMAC key, so a
valid signature proves nothing about honesty, and anything else is dropped.
What an execution's messages mean is the `LinkListener`'s business.

The kernel's word does not end a cell. It holds its HMAC key, so user code can
send an ``execute_reply`` and a ``status: idle`` of its own for the running
request. Two checks that cost no extra message tell the real end:

* the request carries a nonce as a user_expression, which the kernel evaluates
  after the cell's code: a reply without it did not answer the request;
* jupyter_client numbers a session's messages as it makes them, across its
  sockets (`message_order`): the real idle is made after the real reply, an
  idle sent from the cell's code before it.

So a cell ends on the reply with its nonce and an idle made after it. IPython
skips user_expressions when a cell fails, so a reply without the nonce (a
failed cell's, or a forgery) gets an end probe: a silent request sent behind
it (the one that reads a failed cell's artifacts anyway), whose reply and idle
come after everything the cell really sent. Anything else (another reply, a
second idle, output for an ended cell) is an anomaly the listener records.
Code that reads the request's nonce and numbers its forgeries right can still
fool this; the cell's timeout and the container's state stay the gateway's.

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
import collections
import contextlib
import logging
import queue
import signal
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol, cast

import zmq
import zmq.asyncio
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.connect import KernelConnectionInfo

from kernelgw.errors import KernelStartFailed
from kernelgw.runtime.backends.base import Backend, KernelHandle, KernelSpec, KernelState
from kernelgw.runtime.execution import (
    ARTIFACTS_EXPRESSION,
    ARTIFACTS_KEY,
    END_KEY,
    MAX_SEEN_ORDERS,
    EndedCell,
    QueuedExecution,
    answers,
    message_order,
)
from kernelgw.runtime.kernel_messages import (
    InvalidKernelMessage,
    KernelMessageReader,
    KernelMessageSender,
    coalesce_streams,
)
from kernelgw.runtime.loop_share import LoopShare
from kernelgw.runtime.output_backlog import OutputBacklog
from kernelgw.runtime.output_rate import OutputRate
from kernelgw.runtime.refused import watch_refused
from kernelgw.runtime.session_config import SessionConfig
from kernelgw.tasks import cancel_and_wait

log = logging.getLogger(__name__)

ENDED_REMEMBERED = 64
"""Ended cells whose late messages are still recognised (and reported)."""
LATE_OUTPUT = frozenset({"stream", "display_data", "update_display_data", "execute_result", "error"})
"""Messages that must not come for a cell after its end (a status may: an idle
the gateway stopped waiting for)."""

CAPPED_OUTPUT = frozenset({"stream", "display_data", "update_display_data", "execute_result", "clear_output"})
"""Messages a cell past its output cap drops unread (`CellOutput`); errors are kept."""
FLOOD_SHARE = 0.25
"""At most this share of the event loop goes to one session's iopub while it
floods and other sessions have output too (`LoopShare`); at this share the
gateway still reads about 80 MB/s of stream text for one session."""
FLOOD_BURST_S = 0.025
"""Loop time a session's iopub may take at once before `FLOOD_SHARE` applies:
a cell's ordinary output (a 1 MB print, a chart) is never held back."""

FLOOD_BYTES_PER_S = 2 << 20
"""Output bytes per second one session's kernel may send while other sessions
have output too (`OutputRate`): about 20,000 lines of 100 characters a second,
more than anyone reads. A print loop of such lines takes about 6 us of the
kernel's CPU a line: at 4 MiB/s its kernel took 0.27 of a core and the
bystanders' p95 in bench_isolation was 1.24x their quiet one (goal 1.25x)."""
FLOOD_MESSAGES_PER_S = 100
"""Output messages per second, the same way: displays cost the kernel and the
gateway per message, whatever their size (IPython's ``display`` takes about a
millisecond of the kernel's CPU: a loop of them at 1,000 a second took 0.74 of
a core; at 200, 0.15 of a core, and the bystanders' p95 in bench_isolation was
1.28x their quiet one; at 100, 0.06 and 0.95x)."""
FLOOD_OUTPUT_BURST_S = 1.0
"""A second's worth of output at those rates may come at once (2 MiB or 100
messages): a cell's ordinary output is never held back."""
IOPUB_WAITS_FEATURE = "kernelgw: iopub waits for its reader"
"""What our kernels' launcher adds to kernel_info's ``supported_features``
(``kernelgw_kernel.backpressure.FEATURE``): their output waits while unread."""
MAX_RATE_WAIT_S = 0.25
"""Longest sleep of one output-rate wait before it looks again (another session
may have gone quiet, or an interrupt come)."""

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


class LinkListener(Protocol):
    """Who is told about an execution's messages (the execution queue)."""

    def current_execution(self) -> QueuedExecution | None:
        """The execution the kernel is running, if any."""
        ...

    def on_output(self, execution: QueuedExecution, msg: dict[str, Any]) -> None:
        """An iopub message of a running, published execution."""
        ...

    def on_message_refused(self, execution: QueuedExecution) -> None:
        """A message over the size limit was dropped while ``execution`` ran."""
        ...

    def on_anomaly(self, ended: EndedCell, what: str) -> None:
        """The kernel sent something for a cell after it had ended."""
        ...


class ListenerMissing(RuntimeError):
    """The link was started before anything listens to what it reads."""


class KernelLink:
    def __init__(self, session_id: str, spec: KernelSpec, backend: Backend, config: SessionConfig) -> None:
        self.session_id = session_id
        self.spec = spec
        self.backend = backend
        self.config = config
        self.handle: KernelHandle | None = None
        self.kernel_info: dict[str, Any] = {}
        self.last_iopub = time.monotonic()
        self.output_share: LoopShare | None = None
        self.output_rate: OutputRate | None = None
        """The pace of the running reader's output (`OutputRate`)."""
        self.on_paced: Callable[[float], None] | None = None
        """Told the seconds of each wait that paced the output (a metric)."""
        """The share of the event loop its kernel's output may take, while read
        (`_read_iopub`); a Jupyter connection forwarding that output is charged to it too."""
        self.backlog: OutputBacklog | None = None
        """The running cell's output not yet committed by the store: past its bound
        the iopub reader waits (`_read_iopub`); set by the execution queue."""
        self.iopub_stale = False
        """ZMQ dropped the iopub connection (an oversized message): resubscribe
        before the next execution, or its output would go nowhere."""
        self.disconnect_pending = False
        """A socket disconnected and it is not yet known whether ZMQ will retry:
        the running execution must not be finished as "idle lost" meanwhile."""
        self._kc: AsyncKernelClient | None = None
        self._shell: KernelMessageSender | None = None
        """Sends the gateway's own execute requests on the shell (`KernelMessageSender`)."""
        self._readers: list[asyncio.Task[None]] = []
        self._message_readers: dict[str, KernelMessageReader] = {}
        """Each channel's reader, closed once its task is (`stop`)."""
        self._pending: dict[str, QueuedExecution] = {}
        self._iopub_probes: dict[str, asyncio.Event] = {}
        self._shell_probes: dict[str, asyncio.Event] = {}
        self._end_probes: dict[str, QueuedExecution] = {}
        self._ended: collections.OrderedDict[str, EndedCell] = collections.OrderedDict()
        """Recently ended cells by msg_id: what arrives for them later is an anomaly."""
        self._listener: LinkListener | None = None

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
            # Socket options must be set before connect: use a context whose defaults
            # raise the receive HWM for the sockets jupyter_client creates.
            context = zmq.asyncio.Context.instance()
            context.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
            # A frame over the cap makes ZMQ drop the connection instead of
            # allocating it: what a kernel sends cannot grow our memory unbounded.
            context.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
            kc = AsyncKernelClient(context=context)
            kc.load_connection_info(cast(KernelConnectionInfo, handle.connection))
            if self.spec.kernel in DEEP_SEND_QUEUE:
                # made (and connected) before the others, with its own receive HWM
                context.setsockopt(zmq.RCVHWM, IOPUB_RECEIVE_HWM)
                try:
                    kc.iopub_channel  # noqa: B018 (the property connects the socket)
                finally:
                    context.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
            # stdin: a Jupyter client's cell may call input() (see `send_stdin`)
            kc.start_channels(shell=True, iopub=True, stdin=True, hb=False, control=True)
            self._kc = kc
            self._shell = KernelMessageSender(kc.shell_channel.socket, kc.session)
            self.kernel_info = await self._wait_ready(kc, handle, timeout, channel)
            if seal:
                await self.backend.seal(handle)
        except BaseException:
            await self.stop()
            raise
        self._readers = [
            asyncio.create_task(self._read_iopub(kc, listener), name=f"iopub-{self.session_id}"),
            asyncio.create_task(self._read_shell(kc), name=f"shell-{self.session_id}"),
            asyncio.create_task(self._read_stdin(kc), name=f"stdin-{self.session_id}"),
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
        kc: AsyncKernelClient,
        handle: KernelHandle,
        timeout: float | None = None,
        channel: Literal["shell", "control"] = "shell",
    ) -> dict[str, Any]:
        """Repeat kernel_info until a reply and an iopub message both arrive, so
        the first execution cannot lose output to a not-yet-joined SUB socket.

        A reattached kernel is asked on ``control``: it may still be running the
        cell the previous gateway process was cut off from, and ipykernel answers
        control requests while the shell is busy.

        Shell and iopub are read with the link's own readers (`_reader`), which go
        on reading them after: pyzmq's asyncio reading, once used on a socket,
        keeps handling every signal of it (about 20 us a message)."""
        timeout = self.config.kernel_start_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        iopub = self._reader(kc.iopub_channel.socket, kc, "iopub")
        shell = self._reader(kc.shell_channel.socket, kc, "shell")
        info: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            # one request at a time, the next only after the reply (see the module's docstring)
            if channel == "shell":
                msg_id = kc.kernel_info()
                self._look_again("shell")
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
                            replies = await shell.batch()
                    else:
                        replies = [await kc.get_control_msg(timeout=wait)]
                except (TimeoutError, queue.Empty):
                    state = await self.backend.state(handle)
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
            return info
        raise KernelStartFailed(f"The kernel did not answer within {timeout:g}s.")

    async def stop(self) -> None:
        """Stop the readers, disconnect, and remove the container."""
        if self._kc is not None:
            # Monitors first, while the watchers still hold the other end of each
            # monitor pipe: libzmq sends monitor events blocking, holding the lock
            # that disable_monitor takes, and a send to a closed PAIR end never
            # returns. A dead kernel emits a connect retry every 100 ms, so with
            # the watchers stopped first, deleting it could hang the event loop.
            for channel in (self._kc.iopub_channel, self._kc.shell_channel):
                with contextlib.suppress(Exception):
                    channel.socket.disable_monitor()
        await cancel_and_wait(*self._readers)
        self._readers = []
        for reader in self._message_readers.values():
            reader.close()
        self._message_readers.clear()
        self._end_probes.clear()
        self._ended.clear()
        if self._kc is not None:
            self._shell = None
            self._kc.stop_channels()
            self._kc = None
        if self.handle is not None:
            handle, self.handle = self.handle, None
            await self.backend.stop(handle)

    # ------------------------------------------------------------- requests
    def send(self, execution: QueuedExecution, user_expressions: dict[str, str] | None = None) -> bool:
        """Send ``execution`` to the kernel and route its messages to it; False
        when there is no kernel to send it to."""
        if self._kc is None:
            return False
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
            self._kc.shell_channel.send({**message, "content": content})
            msg_id = str(message["header"]["msg_id"])
        elif execution.silent:
            assert self._shell is not None
            msg_id = self._shell.execute(
                execution.code, silent=True, store_history=False, user_expressions=user_expressions or {}
            )
        else:
            assert self._shell is not None
            msg_id = self._shell.execute(
                execution.code, silent=False, store_history=True, user_expressions=checks, stop_on_error=False
            )
        execution.msg_id = msg_id
        self._pending[msg_id] = execution
        self._look_again("shell")
        return True

    def send_stdin(self, msg: dict[str, Any]) -> bool:
        """Answer the running cell's ``input_request`` (a Jupyter client's
        ``input_reply``): it must come back on the socket the request went to."""
        if self._kc is None:
            return False
        self._kc.stdin_channel.send(msg)
        self._look_again("stdin")
        return True

    def send_shell(self, msg: dict[str, Any]) -> bool:
        """A Jupyter client's shell message that has no reply (a comm message), on
        the socket cells go out on: ZMQ keeps one socket's messages in order, and
        the kernel's ROUTER takes turns between sockets, so a ``comm_msg`` sent on
        the client's own socket could reach the kernel after the cell sent next."""
        if self._kc is None:
            return False
        self._kc.shell_channel.send(msg)
        self._look_again("shell")
        return True

    def forget(self, execution: QueuedExecution) -> None:
        """Stop routing messages to ``execution``: what comes later is dropped
        (output or a reply is reported to the listener as an anomaly)."""
        if execution.msg_id is not None:
            self._pending.pop(execution.msg_id, None)
            if not execution.silent:
                self._ended[execution.msg_id] = EndedCell.of(execution)
                while len(self._ended) > ENDED_REMEMBERED:
                    self._ended.popitem(last=False)
        if execution.end_probe is not None:
            self._end_probes.pop(execution.end_probe, None)

    def _probe_end(self, execution: QueuedExecution) -> None:
        """Send the end probe for a reply that cannot prove itself (the module's
        docstring); once per cell."""
        if execution.silent or execution.end_probe is not None or self._shell is None:
            return
        probe = self._shell.execute(
            "", silent=True, store_history=False, user_expressions={ARTIFACTS_KEY: ARTIFACTS_EXPRESSION}
        )
        execution.end_probe = probe
        self._end_probes[probe] = execution
        self._look_again("shell")

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
        return await self.backend.state(handle)

    async def resync_if_stale(self, timeout: float = 10.0) -> None:
        """After iopub was dropped, ask kernel_info until its iopub status arrives:
        the SUB socket has reconnected and subscribed again (the readiness nudge)."""
        kc = self._kc
        if not self.iopub_stale or kc is None:
            return
        deadline = time.monotonic() + timeout
        ids: list[str] = []
        try:
            while time.monotonic() < deadline:
                # one probe at a time, the next only after the reply (see the module's docstring)
                msg_id = kc.kernel_info()
                self._look_again("shell")
                ids.append(msg_id)
                replied, seen = asyncio.Event(), asyncio.Event()
                self._shell_probes[msg_id] = replied
                self._iopub_probes[msg_id] = seen
                try:
                    async with asyncio.timeout(max(0.01, deadline - time.monotonic())):
                        await replied.wait()
                    async with asyncio.timeout(0.2):
                        await seen.wait()
                    self.iopub_stale = False
                    return
                except TimeoutError:
                    continue
            log.warning("session %s: iopub did not come back within %gs", self.session_id, timeout)
        finally:
            for msg_id in ids:
                self._iopub_probes.pop(msg_id, None)
                self._shell_probes.pop(msg_id, None)

    # ------------------------------------------------------------- readers
    def _reader(self, socket: zmq.asyncio.Socket, kc: AsyncKernelClient, channel: str) -> KernelMessageReader:
        """A malformed or forged message (bad signature, broken JSON) is dropped:
        the kernel cannot stop a reader."""

        def dropped(exc: InvalidKernelMessage) -> None:
            log.warning("session %s: dropped an invalid %s message (%s)", self.session_id, channel, exc)

        if (reader := self._message_readers.get(channel)) is not None:
            return reader  # made by `_wait_ready`
        skip = self._content_unread if channel == "iopub" else None
        reader = self._message_readers[channel] = KernelMessageReader(socket, kc.session, dropped, skip_content=skip)
        return reader

    def _look_again(self, channel: str) -> None:
        """A message went out on ``channel``'s socket: a send can take the signal of a
        message that arrived meanwhile, so its reader looks again (`KernelMessageReader`)."""
        if (reader := self._message_readers.get(channel)) is not None:
            reader.wake()

    def _content_unread(self, msg_type: str, parent: str | None) -> bool:
        """Output of a /v1 cell past its cap: dropped by `CellOutput` whatever it holds."""
        if msg_type not in CAPPED_OUTPUT or parent is None:
            return False
        execution = self._pending.get(parent)
        return execution is not None and execution.truncated and execution.client is None

    async def _read_iopub(self, kc: AsyncKernelClient, listener: LinkListener) -> None:
        reader = self._reader(kc.iopub_channel.socket, kc, "iopub")
        budget = self.output_share = LoopShare(FLOOD_SHARE, FLOOD_BURST_S)
        rate = self.output_rate = OutputRate(FLOOD_BYTES_PER_S, FLOOD_MESSAGES_PER_S, FLOOD_OUTPUT_BURST_S)
        try:
            while True:
                if (backlog := self.backlog) is not None and backlog.over:
                    await backlog.room()
                    self.last_iopub = time.monotonic()  # it was unread, not quiet
                batch = await reader.batch()
                self._note_orders(batch)
                for msg in coalesce_streams(batch):
                    self._on_iopub(msg, listener)
                # a flood's next slice waits its turn behind other sessions, and
                # once it has spent its share of the loop, until that refills
                await asyncio.sleep(budget.spent(time.thread_time() - reader.busy_since, time.perf_counter()))
                owed = rate.spent(reader.last_bytes, len(batch), time.perf_counter())
                while owed > 0 and self._paced() and not self._output_unbounded():
                    # and its kernel waits while the reader does (`OutputRate`)
                    await asyncio.sleep(wait := min(owed, MAX_RATE_WAIT_S))
                    rate.waited(wait)
                    if self.on_paced is not None:
                        self.on_paced(wait)
                    self.last_iopub = time.monotonic()  # unread, not quiet
                    owed = rate.owed(time.perf_counter())
        finally:
            budget.close()
            rate.close()
            if self.output_share is budget:
                self.output_share = None

    def _paced(self) -> bool:
        """Only a kernel that waits for its reader is slowed by reading slower:
        from any other, unread output would pile up (ours or its ZMQ queue) and
        be dropped. Ours says so in its kernel_info; what a kernel says only
        decides how its own output is read."""
        features = self.kernel_info.get("supported_features")
        return self.spec.kernel in DEEP_SEND_QUEUE and isinstance(features, list) and IOPUB_WAITS_FEATURE in features

    def _output_unbounded(self) -> bool:
        """An interrupt or a timeout is waiting behind the output: read it all now."""
        return (backlog := self.backlog) is not None and backlog.unbounded is not None

    def _note_orders(self, batch: list[dict[str, Any]]) -> None:
        """Where each message of a Jupyter client's cell sits (`QueuedExecution.seen_orders`);
        before coalescing, which keeps only the first message's header of a run."""
        for msg in batch:
            parent = msg["parent_header"].get("msg_id")
            execution = self._pending.get(parent) if parent else None
            if execution is None or (seen := execution.seen_orders) is None or len(seen) >= MAX_SEEN_ORDERS:
                continue
            if (order := message_order(msg)) is not None:
                seen.add(order)

    def _on_iopub(self, msg: dict[str, Any], listener: LinkListener) -> None:
        self.last_iopub = time.monotonic()
        parent = msg["parent_header"].get("msg_id")
        probe = self._iopub_probes.get(parent) if parent else None
        if probe is not None:
            probe.set()
            return
        if parent and (probed := self._end_probes.get(parent)) is not None:
            if msg["content"].get("execution_state") == "idle":
                probed.end_idle = True
                probed.check_finished()
            return
        execution = self._pending.get(parent) if parent else None
        if execution is None or execution.silent or execution.finished.is_set():
            # not a request we sent, an internal one, or one that is over
            ended = self._ended.get(parent) if parent else None
            if ended is not None and msg["msg_type"] in LATE_OUTPUT:
                listener.on_anomaly(ended, f"a {msg['msg_type']} message after the cell had ended")
            return
        listener.on_output(execution, msg)

    async def _read_shell(self, kc: AsyncKernelClient) -> None:
        reader = self._reader(kc.shell_channel.socket, kc, "shell")
        while True:
            for msg in await reader.batch():
                self._on_shell(msg)

    def _on_shell(self, msg: dict[str, Any]) -> None:
        parent = msg["parent_header"].get("msg_id")
        if parent and (probe := self._shell_probes.get(parent)) is not None:
            probe.set()
            return
        if parent and (probed := self._end_probes.get(parent)) is not None:
            if msg["msg_type"] == "execute_reply":
                probed.probe_reply = msg["content"]
                probed.end_replied = True
                probed.check_finished()
            return
        execution = self._pending.get(parent) if parent else None
        if msg["msg_type"] != "execute_reply":
            return
        if execution is None:
            ended = self._ended.get(parent) if parent else None
            if ended is not None and self._listener is not None:
                self._listener.on_anomaly(ended, "an execute_reply after the cell had ended")
            return
        self._on_reply(execution, msg)

    def _on_reply(self, execution: QueuedExecution, msg: dict[str, Any]) -> None:
        """An execute_reply for ``execution``: take it if it proves itself (its
        nonce), else keep it provisionally and let the end probe tell the end."""
        content = msg.get("content") or {}
        execution.replies += 1
        if execution.silent:
            execution.reply, execution.reply_msg = content, msg
            execution.check_finished()
            return
        if execution.reply_verified:
            execution.anomaly("an execute_reply after the request's own")
            return
        if answers(content, execution.nonce):
            if execution.replies > 1:
                execution.anomaly("an execute_reply that did not answer the request")
            execution.reply, execution.reply_msg = content, msg
            execution.reply_verified = True
            execution.reply_order = message_order(msg)
        else:
            if execution.replies > 1 or content.get("status") == "ok":
                # an ok reply always carries the nonce: this one did not answer the request
                execution.anomaly("an execute_reply that did not answer the request")
            execution.reply, execution.reply_msg = content, msg
            self._probe_end(execution)
        execution.check_finished()

    async def _read_stdin(self, kc: AsyncKernelClient) -> None:
        reader = self._reader(kc.stdin_channel.socket, kc, "stdin")
        while True:
            for msg in await reader.batch():
                parent = msg["parent_header"].get("msg_id")
                execution = self._pending.get(parent) if parent else None
                if execution is None or execution.client is None or msg["msg_type"] != "input_request":
                    continue  # /v1 cells never allow stdin; nothing else may ask
                execution.client.on_stdin(msg)

    async def _watch_oversized(self, channel: str, sock: zmq.asyncio.Socket, listener: LinkListener) -> None:
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
            self._look_again(channel)  # reconnecting may have taken a message's signal
            execution = at_disconnect[0]
            if execution is None or execution.silent or execution.finished.is_set():
                return
            if channel == "shell" and execution.reply is None:
                # the refused message was this execution's reply (the shell
                # carries nothing else while it runs): end it when idle comes
                execution.reply = {
                    "status": "error",
                    "ename": "ReplyTooLarge",
                    "evalue": f"the kernel's reply was larger than {self.config.max_message_bytes} bytes",
                }
                self._probe_end(execution)
                execution.check_finished()
            listener.on_message_refused(execution)

        await watch_refused(sock, refused, disconnected, settled)
