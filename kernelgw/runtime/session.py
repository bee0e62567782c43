"""One kernel session: a kernel client, its execution queue, and event fan-out.

The kernel runs one cell at a time, so each session has a FIFO queue served by a
single worker task. Everything the kernel says on iopub is mapped to events,
numbered with a per-session ``seq``, serialised once, kept in a bounded replay
buffer and handed to every subscriber's bounded queue. A subscriber that falls
too far behind is dropped (it can resume from its last ``seq``); it never slows
the kernel or the other subscribers.

Only messages whose parent is a request this session sent are accepted: the
kernel holds the HMAC key, so a valid signature proves nothing about honesty.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import queue
import signal
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import zmq
import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from zmq.utils.monitor import parse_monitor_message

from kernelgw import events as ev
from kernelgw.errors import BadRequest, KernelStartFailed
from kernelgw.runtime.backends.base import Backend, KernelHandle, KernelSpec, KernelState
from kernelgw.runtime.iopub import cut_text, payload_size, to_event, trim_error
from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.recorder import Recorder

log = logging.getLogger(__name__)

SessionState = Literal["starting", "idle", "busy", "dead", "closed"]
_OUTPUT_EVENTS = (ev.Stream, ev.Display, ev.UpdateDisplay, ev.Result, ev.ClearOutput)
_BUNDLE_EVENTS = (ev.Display, ev.UpdateDisplay, ev.Result)
BundleEvent = ev.Display | ev.UpdateDisplay | ev.Result
RECEIVE_HWM = 100_000
"""Messages ZMQ may queue on our side of a kernel's sockets. The default (1000,
plus the kernel's 1000 send HWM) let a burst of small flushed prints overflow
while the event loop was busy elsewhere: PUB/SUB then drops silently, output
was lost and, when the dropped message was ``status: idle``, the execution
never finished."""
ERROR_MAX_BYTES = 64 * 1024
"""An error event is trimmed to about this (message and traceback), whatever the
output cap: a 40 MB exception message says nothing a model can use."""
REASON_MAX_CHARS = 2000
RETRY_GRACE_S = 0.5
"""After a disconnect, how long to wait for ZMQ's own reconnect attempt before
concluding it refused an oversized message (and will not retry)."""
IOPUB_QUIET_S = 1.0
"""After the execute_reply, iopub silent this long without an idle for the
request means the idle was lost: finish anyway instead of hanging."""
ARTIFACTS_EXPRESSION = "__import__('kernelgw_kernel').artifacts()"
"""Evaluated by the kernel after a cell (a user_expression: no extra round trip).
``kernelgw_kernel`` ships in the image; its text/plain is a JSON list of artifacts."""


@dataclass(frozen=True)
class Published:
    """An event as sent: its number, the model, and its JSON text (made once)."""

    seq: int
    event: ev.Event
    json: str


@dataclass
class QueuedExecution:
    """One execution as the session tracks it (the SDK's result object is kernelgw.execution.Execution)."""

    execution_id: str
    code: str
    timeout: float
    published: list[Published] = field(default_factory=list)
    done: asyncio.Future[ev.Done] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    msg_id: str | None = None
    started: float = 0.0
    output_bytes: int = 0
    truncated: bool = False
    interrupted: bool = False
    reply: dict[str, Any] | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    idle_seen: bool = False
    abort_reason: str | None = None
    artifacts: list[ev.Artifact] = field(default_factory=list)
    silent: bool = False
    """A gateway-internal request: its iopub messages are not published."""
    idle_lost: bool = False
    recorded: bool = False


class Subscription:
    """A bounded queue of JSON texts for one WebSocket client.

    Bounded by count and by bytes: a client that does not keep up is dropped
    (``overflowed``) instead of letting the gateway's memory grow.
    """

    def __init__(self, maxsize: int, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        self.overflowed = False
        self.closed = False

    def offer(self, text: str) -> None:
        if self.closed:
            return
        if self.queue.qsize() >= self.maxsize or self.queued_bytes + len(text) > self.max_bytes:
            self.overflowed = True
            self.close()
            return
        self.queued_bytes += len(text)
        self.queue.put_nowait(text)

    async def get(self) -> str | None:
        """The next text, or None once the subscription is closed."""
        if self.closed and self.overflowed:
            return None  # dropped: what is still queued is not worth sending
        text = await self.queue.get()
        if text is not None:
            self.queued_bytes -= len(text)
        return text

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.queue.put_nowait(None)


@dataclass
class SessionConfig:
    exec_timeout_s: float
    max_exec_timeout_s: float
    interrupt_grace_s: float
    kernel_start_timeout_s: float
    max_output_bytes: int
    replay_buffer: int
    subscriber_queue: int
    state_poll_s: float
    subscriber_max_bytes: int = 64 * 1024 * 1024
    replay_buffer_bytes: int = 4 * 1024 * 1024
    max_image_bytes: int = 8 * 1024 * 1024
    max_message_bytes: int = 64 * 1024 * 1024


class KernelSession:
    def __init__(
        self,
        session_id: str,
        spec: KernelSpec,
        backend: Backend,
        config: SessionConfig,
        recorder: Recorder | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.id = session_id
        self.owner: str | None = None
        """The id of the API key the session belongs to (None without authentication)."""
        self.recorder = recorder
        self.metrics = metrics
        self.spec = spec
        self.backend = backend
        self.config = config
        self.state: SessionState = "starting"
        self.created_at = datetime.now(UTC)
        self.last_activity = time.monotonic()
        self.last_activity_at = self.created_at
        self.execution_count = 0
        self.dead_reason: str | None = None
        self.kernel_info: dict[str, Any] = {}
        self._handle: KernelHandle | None = None
        self._kc: AsyncKernelClient | None = None
        self._readers: list[asyncio.Task[None]] = []
        self._queue: asyncio.Queue[QueuedExecution] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._current: QueuedExecution | None = None
        self._by_msg_id: dict[str, QueuedExecution] = {}
        self._recent_ids: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._seq = 0
        # (seq, json) only: the event models are not kept for replay, and the
        # buffer is bounded by count and by bytes (large outputs age out fast).
        self._replay: collections.deque[tuple[int, str]] = collections.deque()
        self._replay_bytes = 0
        self._last_iopub = time.monotonic()
        self._subscribers: set[Subscription] = set()
        self._lifecycle = asyncio.Lock()
        self._iopub_stale = False
        """ZMQ dropped the iopub connection (an oversized message): resubscribe
        before the next execution, or its output would go nowhere."""
        self._iopub_probes: dict[str, asyncio.Event] = {}
        self._disconnect_pending = False
        """A socket disconnected and it is not yet known whether ZMQ will retry:
        the running execution must not be finished as "idle lost" meanwhile."""

    @property
    def handle(self) -> KernelHandle | None:
        """The running kernel's container, or None while (re)starting or closed."""
        return self._handle

    # ------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        async with self._lifecycle:
            await self._start_kernel()
        self._worker = asyncio.create_task(self._work(), name=f"session-{self.id}")

    async def _start_kernel(self) -> None:
        self.state = "starting"
        self._handle = await self.backend.start(self.spec)
        try:
            # Socket options must be set before connect: use a context whose defaults
            # raise the receive HWM for the sockets jupyter_client creates.
            context = zmq.asyncio.Context.instance()
            context.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
            # A frame over the cap makes ZMQ drop the connection instead of
            # allocating it: what a kernel sends cannot grow our memory unbounded.
            context.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
            kc = AsyncKernelClient(context=context)
            kc.load_connection_info(self._handle.connection)
            kc.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=True)
            self._kc = kc
            self.kernel_info = await self._wait_ready(kc)
            await self.backend.seal(self._handle)
        except BaseException:
            await self._stop_kernel()
            raise
        self._readers = [
            asyncio.create_task(self._read_iopub(self._kc), name=f"iopub-{self.id}"),
            asyncio.create_task(self._read_shell(self._kc), name=f"shell-{self.id}"),
            asyncio.create_task(
                self._watch_oversized("iopub", self._kc.iopub_channel.socket), name=f"iopub-monitor-{self.id}"
            ),
            asyncio.create_task(
                self._watch_oversized("shell", self._kc.shell_channel.socket), name=f"shell-monitor-{self.id}"
            ),
        ]
        self.state = "idle"
        self.dead_reason = None

    async def _wait_ready(self, kc: AsyncKernelClient) -> dict[str, Any]:
        """Repeat kernel_info until a shell reply and an iopub message both arrive,
        so the first execution cannot lose output to a not-yet-joined SUB socket."""
        assert self._handle is not None
        deadline = time.monotonic() + self.config.kernel_start_timeout_s
        info: dict[str, Any] | None = None
        iopub_seen = False
        while time.monotonic() < deadline:
            msg_id = kc.kernel_info()
            end = time.monotonic() + 0.5
            while info is None and time.monotonic() < end:
                try:
                    reply = await kc.get_shell_msg(timeout=max(0.01, end - time.monotonic()))
                except queue.Empty:
                    break
                if reply["parent_header"].get("msg_id") == msg_id:
                    info = reply["content"]
            while not iopub_seen:
                try:
                    await kc.get_iopub_msg(timeout=0.2 if info is not None else 0.01)
                    iopub_seen = True
                except queue.Empty:
                    break
            if info is not None and iopub_seen:
                # Leftover handshake messages need no draining: the readers drop
                # anything whose parent is not a pending execution.
                return info
            state = await self.backend.state(self._handle)
            if not state.alive:
                raise KernelStartFailed(f"The kernel container stopped while starting: {state.describe()}")
        raise KernelStartFailed(
            f"The kernel did not answer within {self.config.kernel_start_timeout_s:.0f}s of starting."
        )

    async def _stop_kernel(self) -> None:
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            try:
                await task
            except BaseException:
                pass
        self._readers = []
        if self._kc is not None:
            for channel in (self._kc.iopub_channel, self._kc.shell_channel):
                with contextlib.suppress(Exception):
                    channel.socket.disable_monitor()
            self._kc.stop_channels()
            self._kc = None
        if self._handle is not None:
            handle, self._handle = self._handle, None
            await self.backend.stop(handle)

    async def restart(self, reason: str = "the session was restarted") -> None:
        """A fresh kernel in place of the old one; all variables are lost."""
        async with self._lifecycle:
            if self.state == "closed":
                return
            current = self._current
            if current is not None and not current.finished.is_set():
                current.abort_reason = reason
                current.finished.set()
            await self._stop_kernel()
            self._lifecycle_event("kernel_restarted", reason)
            if self.metrics is not None:
                self.metrics.restarts.labels("requested").inc()
            try:
                await self._start_kernel()
            except BaseException as exc:
                self.state = "dead"
                self.dead_reason = f"restart failed: {exc}"
                raise
            self.execution_count = 0

    async def close(self) -> None:
        async with self._lifecycle:
            if self.state == "closed":
                return
            self.state = "closed"
            running = self._current
            if self._current is not None and not self._current.finished.is_set():
                self._current.abort_reason = "the session was deleted"
                self._current.finished.set()
            if self._worker is not None:
                # let the running execution publish its done event, then stop
                try:
                    async with asyncio.timeout(2):
                        await self._drain_current()
                except TimeoutError:
                    pass
                self._worker.cancel()
                try:
                    await self._worker
                except BaseException:
                    pass
            unrecorded = [running] if running is not None else []
            while not self._queue.empty():
                rec = self._queue.get_nowait()
                self._finish(rec, "dead", "the session was deleted before this execution ran")
                unrecorded.append(rec)
            await self._stop_kernel()
            for sub in list(self._subscribers):
                sub.close()
            self._subscribers.clear()
        # History keeps every execution, including those the deletion ended.
        for rec in unrecorded:
            await self._record_execution(rec)

    def _lifecycle_event(self, kind: str, detail: str) -> None:
        """Tell the recorder (the audit log) that the kernel died or was restarted."""
        hook = getattr(self.recorder, "session_event", None)
        if hook is None:
            return
        try:
            hook(self, kind, detail)
        except Exception:
            log.exception("recording %s for session %s failed", kind, self.id)

    async def _record_execution(self, rec: QueuedExecution) -> None:
        if self.recorder is None or rec.recorded or not rec.done.done():
            return
        rec.recorded = True
        try:
            await self.recorder.execution_finished(self, rec)
        except Exception:
            log.exception("recording execution %s failed", rec.execution_id)

    async def _drain_current(self) -> None:
        while self._current is not None:
            await asyncio.sleep(0.01)

    # ------------------------------------------------------------- pub/sub
    def _publish(self, event: ev.Event, rec: QueuedExecution | None = None) -> Published:
        self._seq += 1
        event = event.model_copy(update={"seq": self._seq})
        pub = Published(self._seq, event, event.model_dump_json())
        self._replay.append((pub.seq, pub.json))
        self._replay_bytes += len(pub.json)
        while self._replay and (
            len(self._replay) > self.config.replay_buffer or self._replay_bytes > self.config.replay_buffer_bytes
        ):
            self._replay_bytes -= len(self._replay.popleft()[1])
        if rec is not None:
            rec.published.append(pub)
        for sub in list(self._subscribers):
            sub.offer(pub.json)
            if sub.closed:
                self._subscribers.discard(sub)
        return pub

    def subscribe(self, last_seq: int | None = None) -> Subscription:
        """A live subscription; with ``last_seq``, first the events after it.

        Replay and registration happen without an await in between, so no event
        is missed or delivered twice.
        """
        sub = Subscription(self.config.subscriber_queue, self.config.subscriber_max_bytes)
        if last_seq is not None and last_seq < self._seq:
            oldest = self._replay[0][0] if self._replay else self._seq + 1
            if oldest > last_seq + 1:
                gap = ev.Gap(first_missing=last_seq + 1, last_missing=oldest - 1)
                sub.offer(gap.model_dump_json())
            for seq, text in self._replay:
                if seq > last_seq:
                    sub.offer(text)
        if self.state == "closed":
            sub.close()
        else:
            self._subscribers.add(sub)
        self.touch()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)
        sub.close()
        self.touch()

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    @property
    def last_seq(self) -> int:
        return self._seq

    def touch(self) -> None:
        self.last_activity = time.monotonic()
        self.last_activity_at = datetime.now(UTC)

    # ------------------------------------------------------------- executing
    @property
    def queue_length(self) -> int:
        return self._queue.qsize() + (1 if self._current is not None else 0)

    def submit(self, code: str, execution_id: str | None = None, timeout: float | None = None) -> QueuedExecution:
        """Queue a cell; returns at once. Await ``execution.done`` for the end."""
        if self.state == "closed":
            raise BadRequest("The session is being deleted.")
        if timeout is None:
            timeout = self.config.exec_timeout_s
        if not 0 < timeout <= self.config.max_exec_timeout_s:
            raise BadRequest(f"timeout must be greater than 0 and at most {self.config.max_exec_timeout_s:g} seconds")
        execution_id = execution_id or uuid.uuid4().hex
        if execution_id in self._recent_ids:
            raise BadRequest(f"execution_id {execution_id!r} was already used in this session")
        self._recent_ids[execution_id] = None
        while len(self._recent_ids) > 10000:
            self._recent_ids.popitem(last=False)
        rec = QueuedExecution(execution_id=execution_id, code=code, timeout=timeout)
        self._publish(ev.Queued(execution_id=execution_id, code=code, position=self.queue_length), rec)
        self._queue.put_nowait(rec)
        self.touch()
        return rec

    async def interrupt(self) -> bool:
        """SIGINT to the kernel if a cell is running; True if one was."""
        rec = self._current
        if rec is None or self._handle is None or rec.finished.is_set():
            return False
        rec.interrupted = True
        await self.backend.signal(self._handle, signal.SIGINT)
        return True

    async def _work(self) -> None:
        while True:
            rec = await self._queue.get()
            self._current = rec
            try:
                await self._execute(rec)
            except asyncio.CancelledError:
                self._finish(rec, "dead", rec.abort_reason or "the session was deleted")
                raise
            except Exception as exc:  # never let one execution kill the worker
                log.exception("execution %s failed inside the gateway", rec.execution_id)
                self._finish(rec, "dead", f"gateway error: {exc}")
            finally:
                self._current = None
                self.touch()
            await self._record_execution(rec)

    async def _execute(self, rec: QueuedExecution) -> None:
        rec.started = time.monotonic()
        if self.state == "closed":
            self._finish(rec, "dead", "the session was deleted before this execution ran")
            return
        if self.state == "dead" or self._kc is None:
            self._finish(rec, "dead", self.dead_reason or "the kernel is not running; restart the session")
            return
        if self._iopub_stale:
            await self._resync_iopub(self._kc)
        self.state = "busy"
        rec.msg_id = self._kc.execute(
            rec.code,
            silent=False,
            store_history=True,
            allow_stdin=False,
            stop_on_error=False,
            user_expressions={"artifacts": ARTIFACTS_EXPRESSION},
        )
        self._by_msg_id[rec.msg_id] = rec
        try:
            outcome = await self._wait(rec, rec.timeout)
            if outcome == "timeout":
                await self._on_timeout(rec)
            elif isinstance(outcome, KernelState):
                self._on_death(rec, outcome)
            elif rec.abort_reason is not None:
                self._finish(rec, "dead", rec.abort_reason, state_lost=True)
            else:
                await self._collect_artifacts(rec)
                self._finish_from_reply(rec)
        finally:
            self._by_msg_id.pop(rec.msg_id, None)
            if self.state == "busy":
                self.state = "idle"

    async def _wait(self, rec: QueuedExecution, timeout: float) -> Literal["finished", "timeout"] | KernelState:
        """Wait for reply + idle, polling the container so a dead kernel is noticed."""
        assert self._handle is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            try:
                # asyncio.timeout rather than wait_for, which on 3.11 can swallow a
                # cancellation racing with completion (CPython gh-86296)
                async with asyncio.timeout(min(remaining, self.config.state_poll_s)):
                    await rec.finished.wait()
                return "finished"
            except TimeoutError:
                pass
            if (
                rec.reply is not None
                and time.monotonic() - self._last_iopub > IOPUB_QUIET_S
                and not self._disconnect_pending
            ):
                # the reply is in and iopub has gone quiet without our idle: it was
                # dropped somewhere; everything before it has been read
                log.warning("session %s: no idle status for %s; finishing on the reply", self.id, rec.execution_id)
                rec.idle_lost = True
                return "finished"
            handle = self._handle
            if handle is None:
                return "finished" if rec.abort_reason else KernelState(status="missing")
            state = await self.backend.state(handle)
            if not state.alive:
                return state

    async def _on_timeout(self, rec: QueuedExecution) -> None:
        assert self._handle is not None
        await self.backend.signal(self._handle, signal.SIGINT)
        outcome = await self._wait(rec, self.config.interrupt_grace_s)
        if outcome == "finished" and rec.abort_reason is None:
            self._finish(
                rec,
                "timeout",
                f"the execution exceeded its timeout of {rec.timeout:g}s and was interrupted; "
                "variables defined before are kept",
            )
            return
        if isinstance(outcome, KernelState):
            self._on_death(rec, outcome)
            return
        reason = (
            f"the execution exceeded its timeout of {rec.timeout:g}s and did not stop within "
            f"{self.config.interrupt_grace_s:g}s of an interrupt"
        )
        # Restart before reporting, so a client that reads `done` finds the session usable.
        failure = await self._restart_in_worker()
        if failure is None:
            reason += "; the kernel was restarted and all variables are lost"
        else:
            reason += f"; restarting the kernel failed ({failure}), so the session is dead"
        self._finish(rec, "timeout", reason, state_lost=True)

    def _on_death(self, rec: QueuedExecution, state: KernelState) -> None:
        self.state = "dead"
        self.dead_reason = state.describe()
        self._lifecycle_event("kernel_died", self.dead_reason)
        self._finish(rec, "dead", self.dead_reason + "; restart the session to continue", state_lost=True)

    async def _restart_in_worker(self) -> str | None:
        """Replace a kernel that ignored an interrupt; returns why it failed, if it did."""
        async with self._lifecycle:
            if self.state == "closed":
                return None
            await self._stop_kernel()
            self._lifecycle_event("kernel_restarted", "the kernel ignored an interrupt after a timeout")
            if self.metrics is not None:
                self.metrics.restarts.labels("timeout").inc()
            try:
                await self._start_kernel()
            except Exception as exc:
                self.state = "dead"
                self.dead_reason = f"restarting the kernel after a timeout failed: {exc}"
                return str(exc)
            self.execution_count = 0
            return None

    async def _collect_artifacts(self, rec: QueuedExecution) -> None:
        """Read the workspace changes the kernel reported for this cell.

        On success they came with the reply. The kernel skips user_expressions when
        a cell fails, so then one silent request asks again (files written before
        the exception still count)."""
        reply = rec.reply or {}
        if reply.get("status") != "ok":
            reply = await self._silent_request("", {"artifacts": ARTIFACTS_EXPRESSION}) or {}
        rec.artifacts = parse_artifacts(reply)

    async def _resync_iopub(self, kc: AsyncKernelClient, timeout: float = 10.0) -> None:
        """Ask kernel_info until its iopub status arrives: the SUB socket has
        reconnected and subscribed again (the readiness nudge, after a drop)."""
        deadline = time.monotonic() + timeout
        seen = asyncio.Event()
        ids: list[str] = []
        try:
            while time.monotonic() < deadline:
                msg_id = kc.kernel_info()
                ids.append(msg_id)
                self._iopub_probes[msg_id] = seen
                try:
                    async with asyncio.timeout(0.2):
                        await seen.wait()
                    self._iopub_stale = False
                    return
                except TimeoutError:
                    continue
            log.warning("session %s: iopub did not come back within %gs", self.id, timeout)
        finally:
            for msg_id in ids:
                self._iopub_probes.pop(msg_id, None)

    async def _silent_request(
        self, code: str, user_expressions: dict[str, str] | None = None, timeout: float = 5.0
    ) -> dict[str, Any] | None:
        """Run gateway-internal code: no history, no published events, no
        pre_run_cell hooks. Returns the execute_reply content, None on timeout."""
        if self._kc is None:
            return None
        probe = QueuedExecution(execution_id="internal", code=code, timeout=timeout, silent=True)
        probe.msg_id = self._kc.execute(
            code, silent=True, store_history=False, allow_stdin=False, user_expressions=user_expressions or {}
        )
        probe.idle_seen = True  # silent requests publish nothing we wait for
        self._by_msg_id[probe.msg_id] = probe
        try:
            async with asyncio.timeout(timeout):
                await probe.finished.wait()
            return probe.reply or {}
        except TimeoutError:
            return None
        finally:
            self._by_msg_id.pop(probe.msg_id, None)

    async def adopt(self, config: SessionConfig, recorder: Recorder | None, env: dict[str, str]) -> None:
        """Take over a warm kernel from the pool as a new session.

        Per-session environment variables reach the kernel's ``os.environ`` with a
        silent request (no restart; nothing is bound in the user namespace)."""
        self.config = config
        self.recorder = recorder
        self.created_at = datetime.now(UTC)
        self.touch()
        if env:
            reply = await self._silent_request(f"__import__('os').environ.update({json.dumps(env)})")
            if not reply or reply.get("status") != "ok":
                raise KernelStartFailed("Could not set the session's environment variables in the kernel.")
            self.spec = dataclasses.replace(self.spec, env=dict(env))

    def _finish_from_reply(self, rec: QueuedExecution) -> None:
        reply = rec.reply or {}
        count = reply.get("execution_count")
        if isinstance(count, int):
            self.execution_count = count
        status = reply.get("status")
        if status == "ok":
            lost = "the kernel's end-of-cell status message was lost; output may be incomplete"
            self._finish(rec, "ok", lost if rec.idle_lost else None, execution_count=count)
        elif rec.interrupted and reply.get("ename") == "KeyboardInterrupt":
            self._finish(rec, "interrupted", "interrupted on request; variables are kept", execution_count=count)
        else:
            reason = f"{reply.get('ename', 'Error')}: {reply.get('evalue', '')}" if status == "error" else None
            if reason is not None:
                reason = cut_text(reason, REASON_MAX_CHARS)
            self._finish(rec, "error", reason or f"the kernel replied {status!r}", execution_count=count)

    def _finish(
        self,
        rec: QueuedExecution,
        status: ev.DoneStatus,
        reason: str | None,
        *,
        execution_count: int | None = None,
        state_lost: bool = False,
    ) -> None:
        if rec.done.done():
            return
        started = rec.started or time.monotonic()
        done = ev.Done(
            execution_id=rec.execution_id,
            status=status,
            execution_count=execution_count,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
            reason=reason,
            state_lost=state_lost,
            artifacts=rec.artifacts,
        )
        pub = self._publish(done, rec)
        assert isinstance(pub.event, ev.Done)
        rec.done.set_result(pub.event)
        if self.metrics is not None and not rec.silent:
            oom = status == "dead" and (self.dead_reason or "").startswith("out-of-memory")
            self.metrics.execution_done(pub.event, rec.output_bytes, oom_killed=oom)

    # ------------------------------------------------------------- readers
    async def _read_iopub(self, kc: AsyncKernelClient) -> None:
        while True:
            msg = await self._next(kc.get_iopub_msg, "iopub")
            self._last_iopub = time.monotonic()
            parent = (msg.get("parent_header") or {}).get("msg_id")
            probe = self._iopub_probes.get(parent) if parent else None
            if probe is not None:
                probe.set()
                continue
            rec = self._by_msg_id.get(parent) if parent else None
            if rec is None or rec.silent or rec.finished.is_set():
                continue  # not a request we sent, an internal one, or already over
            event = to_event(msg, rec.execution_id)
            if event is None:
                continue
            if isinstance(event, ev.Status):
                if event.state == "idle":
                    rec.idle_seen = True
                    self._check_finished(rec)
                # forward busy only; idle is implied by done
                if event.state == "busy":
                    self._publish(event, rec)
                continue
            if isinstance(event, ev.Error):
                # never dropped (the error is what a model needs), but trimmed
                event = trim_error(event, ERROR_MAX_BYTES)
                rec.output_bytes += payload_size(event)
            elif isinstance(event, _OUTPUT_EVENTS):
                if rec.truncated:
                    continue
                if isinstance(event, _BUNDLE_EVENTS):
                    event = self._cap_images(event, rec)
                rec.output_bytes += payload_size(event)
                if rec.output_bytes > self.config.max_output_bytes:
                    rec.truncated = True
                    self._truncated(
                        rec,
                        self.config.max_output_bytes,
                        f"output exceeded {self.config.max_output_bytes} bytes; the rest of "
                        "this execution's output was dropped (the code kept running)",
                    )
                    continue
            self._publish(event, rec)

    def _cap_images(self, event: BundleEvent, rec: QueuedExecution) -> BundleEvent:
        """Replace images over ``max_image_bytes`` with a note (and say so)."""
        limit = self.config.max_image_bytes
        big = {
            mime: len(value)
            for mime, value in event.data.items()
            if mime.startswith("image/") and isinstance(value, str) and len(value) > limit
        }
        if not big:
            return event
        data = {k: v for k, v in event.data.items() if k not in big}
        note = "; ".join(f"{mime} of {size} bytes" for mime, size in big.items())
        data["text/plain"] = f"[{note} removed: larger than the gateway's image limit of {limit} bytes]"
        self._truncated(rec, limit, f"an image ({note}) exceeded the limit of {limit} bytes and was replaced by a note")
        return event.model_copy(update={"data": data})

    def _truncated(self, rec: QueuedExecution, limit: int, message: str) -> None:
        self._publish(ev.Truncated(execution_id=rec.execution_id, limit_bytes=limit, message=message), rec)

    async def _watch_oversized(self, channel: str, sock: zmq.asyncio.Socket) -> None:
        """A frame over ``max_message_bytes`` makes ZMQ drop the connection as a
        protocol error, and then it does not reconnect by itself (after an
        ordinary disconnect, a kernel restarting or dying, it schedules a retry
        at once). So: a disconnect with no retry behind it means a message was
        refused; reconnect, tell the running execution that output was lost,
        and resubscribe iopub before the next one."""
        endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
        try:
            while True:
                if parse_monitor_message(await monitor.recv_multipart())["event"] != zmq.EVENT_DISCONNECTED:
                    continue
                rec = self._current
                self._disconnect_pending = True
                try:
                    async with asyncio.timeout(RETRY_GRACE_S):
                        while (
                            parse_monitor_message(await monitor.recv_multipart())["event"] != zmq.EVENT_CONNECT_RETRIED
                        ):
                            pass
                    continue  # ZMQ reconnects by itself: not a refused message
                except TimeoutError:
                    pass
                finally:
                    self._disconnect_pending = False
                log.warning("session %s: the kernel sent a %s message over the size limit; dropped", self.id, channel)
                with contextlib.suppress(zmq.ZMQError):
                    sock.disconnect(endpoint)
                sock.connect(endpoint)
                if channel == "iopub":
                    self._iopub_stale = True
                if rec is None or rec.silent or rec.finished.is_set():
                    continue
                if channel == "shell" and rec.reply is None:
                    # the refused message was this execution's reply (the shell
                    # carries nothing else while it runs): end it when idle comes
                    rec.reply = {
                        "status": "error",
                        "ename": "ReplyTooLarge",
                        "evalue": f"the kernel's reply was larger than {self.config.max_message_bytes} bytes",
                    }
                    self._check_finished(rec)
                self._truncated(
                    rec,
                    self.config.max_message_bytes,
                    f"the kernel sent a message larger than {self.config.max_message_bytes} bytes; "
                    "it was dropped, and output until the connection recovered may be missing "
                    "(the code kept running)",
                )
        finally:
            monitor.close(linger=0)

    async def _read_shell(self, kc: AsyncKernelClient) -> None:
        while True:
            msg = await self._next(kc.get_shell_msg, "shell")
            parent = (msg.get("parent_header") or {}).get("msg_id")
            rec = self._by_msg_id.get(parent) if parent else None
            if rec is None or msg["header"]["msg_type"] != "execute_reply":
                continue
            rec.reply = msg.get("content") or {}
            self._check_finished(rec)

    async def _next(self, get: Any, channel: str) -> dict[str, Any]:
        """The next well-formed, correctly signed message. A malformed or forged one
        (bad signature, broken JSON) is dropped: the kernel cannot stop a reader."""
        while True:
            try:
                msg = await get()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("session %s: dropped an invalid %s message (%s)", self.id, channel, exc)
                continue
            if isinstance(msg, dict) and isinstance(msg.get("header"), dict) and "msg_type" in msg["header"]:
                return msg  # type: ignore[no-any-return]
            log.warning("session %s: dropped a malformed %s message", self.id, channel)

    def _check_finished(self, rec: QueuedExecution) -> None:
        if rec.reply is not None and rec.idle_seen:
            rec.finished.set()

    # ------------------------------------------------------------- info
    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "image": self.spec.image,
            "runtime": self.spec.runtime,
            "memory_mb": self.spec.memory_mb,
            "cpus": self.spec.cpus,
            "created_at": self.created_at,
            "last_activity": self.last_activity_at,
            "execution_count": self.execution_count,
            "queue_length": self.queue_length,
            "subscribers": self.subscriber_count,
            "last_seq": self._seq,
            "dead_reason": self.dead_reason,
            "owner": self.owner,
        }


def parse_artifacts(reply: dict[str, Any]) -> list[ev.Artifact]:
    """Artifacts from an execute_reply's user_expressions; [] when absent or malformed
    (an image without the kernel helper, or user code that replaced it)."""
    result = (reply.get("user_expressions") or {}).get("artifacts") or {}
    if result.get("status") != "ok":
        return []
    text = (result.get("data") or {}).get("text/plain", "")
    try:
        items = json.loads(text)
        return [ev.Artifact.model_validate(item) for item in items][:1000]
    except (ValueError, TypeError):
        return []
