"""The execution queue: the kernel runs one cell at a time, in the order sent.

A FIFO served by one worker task. For each cell the worker sends the request,
waits for the reply and the kernel's idle (watching the container, so a dead
kernel is noticed), enforces the timeout (interrupt, then restart if the kernel
does not come back) and ends it with exactly one ``done`` built from the
gateway's facts (`kernelgw.runtime.cell_end`: a cell is recorded when it
starts, ``running``, and its ``done`` goes out once its end is stored).

Recovery by replay (`kernelgw.runtime.lineage`): the queue keeps the lineage
of the kernel (the cells that ran ``ok`` in it) and runs replays in its worker,
ahead of every queued cell (`kernelgw.runtime.replay_runner`). With
``auto_replay`` the worker itself restarts a kernel that died under a cell (out
of memory) and replays, as it does after the restart that follows a timeout the
kernel ignored; a replayed cell never starts another recovery.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any, Literal

from kernelgw import events as ev
from kernelgw.errors import BadRequest
from kernelgw.events import ReplayTrigger
from kernelgw.runtime import cell_env
from kernelgw.runtime.backends.base import KernelState
from kernelgw.runtime.cell_end import CellEnds
from kernelgw.runtime.cell_output import CellOutput
from kernelgw.runtime.execution import (
    ClientRequest,
    EndedCell,
    QueuedExecution,
    checkpoint_due,
    message_order,
    parse_artifacts,
)
from kernelgw.runtime.fanout import EventFanout
from kernelgw.runtime.kernel_link import KernelLink
from kernelgw.runtime.late_output import LateOutput
from kernelgw.runtime.lineage import Lineage, LineageCell, ReplayJob
from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.output_backlog import OutputBacklog
from kernelgw.runtime.recorder import CHUNK_BYTES, FollowedCell
from kernelgw.runtime.replay_runner import ReplayRunner
from kernelgw.runtime.session_config import SessionConfig
from kernelgw.runtime.session_hooks import SessionHooks
from kernelgw.runtime.session_state import SessionStatus
from kernelgw.tasks import cancel_and_wait

log = logging.getLogger(__name__)

IOPUB_QUIET_S = 5.0
"""After the execute_reply, iopub silent this long (counted from the later of
the reply and the last iopub message) without an idle for the request means
the idle was lost: finish anyway instead of hanging. Longer than a kernel's
iopub may lag behind its reply: ipykernel's iopub thread in a loaded
container, and the shim's fences (``FENCE_TIMEOUT_S``, 2 s), which hold a
Deno cell's idle, and so anything sent after it, until its output is out. At
1 s, counted from the last iopub message alone, a cell whose reply came after
a quiet second was ended at once and its output, still on its way, lost (seen
in CI: a Deno cell right after an interrupted one)."""
RECENT_IDS = 10000
"""How many execution ids a session remembers to refuse reuse."""
ABORTED = "aborted: an earlier cell from the same Jupyter client failed and asked to stop on error"
FOLLOW_MISSED = (
    "the gateway stopped while this cell ran and the kernel was kept; the cell ended while no gateway "
    "was connected, so its outcome and its output after the last stored event were not seen"
)


class ExecutionQueue:
    def __init__(
        self,
        session_id: str,
        link: KernelLink,
        fanout: EventFanout,
        status: SessionStatus,
        config: SessionConfig,
        hooks: SessionHooks,
        metrics: Metrics | None = None,
    ) -> None:
        self.session_id = session_id
        self.current: QueuedExecution | None = None
        self._ending: QueuedExecution | None = None
        """A cell that ended and whose ``done`` waits for its record (see `length`)."""
        self._link = link
        self._fanout = fanout
        self._status = status
        self._hooks = hooks
        self._queued_reason = "the session was deleted before this execution ran"
        """Why a cell that never ran ended (set by `stop`)."""
        self._output = CellOutput(config, self.publish)
        self.backlog = OutputBacklog()
        """The running cell's output chunks not yet committed: its iopub reader waits past a bound."""
        self._config = config
        self._cells: collections.deque[QueuedExecution] = collections.deque()
        self._holds = 0
        """While above 0 the worker takes no queued cell (a restart that replays is under way)."""
        self._wake = asyncio.Event()
        """Set when there may be work for the worker."""
        self._ends = CellEnds(session_id, link, fanout, status, hooks, self.publish, metrics)
        self._late = LateOutput(config, self._ends, fanout, hooks)
        """Output of ended cells: stored, then sent as ``late``."""
        self._replays = ReplayRunner(session_id, status, self._run, self.publish, self._wake)
        """Replays to run before any queued cell (`replay`)."""
        self.lineage = Lineage()
        """The cells that built the running kernel's state (`kernelgw.runtime.lineage`)."""
        self._worker: asyncio.Task[None] | None = None
        self._recent_ids: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._detaching = False
        """Set by `stop` for a gateway that keeps the kernel: a followed cell's record
        is left for the next gateway to complete."""
        self._between_cells = asyncio.Event()
        """Set while the worker holds no execution (what `close` waits for)."""
        self._between_cells.set()
        link.attach(self)
        link.backlog = self.backlog

    @property
    def metrics(self) -> Metrics | None:
        return self._ends.metrics

    @metrics.setter
    def metrics(self, metrics: Metrics | None) -> None:
        self._ends.metrics = metrics

    @property
    def config(self) -> SessionConfig:
        return self._config

    @config.setter
    def config(self, config: SessionConfig) -> None:
        self._config = config
        self._output.config = config
        self._late.config = config

    def start(self) -> None:
        self._worker = asyncio.create_task(self._work(), name=f"session-{self.session_id}")

    def publish(self, event: ev.Event, rec: QueuedExecution | None = None) -> None:
        if self._ends.hold(event, rec):
            return
        pub = self._fanout.publish(event)
        if rec is not None:
            rec.published.append(pub)
            if isinstance(pub.event, ev.Error):
                rec.last_error = pub.event
            rec.unstored_bytes += len(pub.json)
            if rec.unstored_bytes >= CHUNK_BYTES and rec.ending is None:
                self._store_progress(rec)  # the next chunk of its output, now: memory and writes stay small

    def _store_progress(self, rec: QueuedExecution) -> None:
        """Hand the store a running cell's events not yet stored (`Recorder.execution_progress`);
        a chunk it takes counts in the backlog until committed."""
        rec.checkpointed, rec.unstored_bytes = rec.event_count, 0
        before, first = rec.stored_events, rec.released + rec.stored_events
        self._hooks.execution_progress(rec)
        if rec.stored_events > before:
            self.backlog.taken(rec.execution_id, first, rec.published[before : rec.stored_events])

    # ------------------------------------------------------------- LinkListener
    def current_execution(self) -> QueuedExecution | None:
        return self.current

    def on_output(self, execution: QueuedExecution, msg: dict[str, Any]) -> None:
        if execution.followed is not None:
            self._followed_output(execution, execution.followed, msg)
            return
        self._output.handle(execution, msg)

    def _followed_output(self, rec: QueuedExecution, ended: EndedCell, msg: dict[str, Any]) -> None:
        """An iopub message of a followed cell (`follow`): its idle and error order
        tell its end; its output goes to its record after the interim end, as late
        output (stored, then sent as ``late``: its ``done`` went out already)."""
        msg_type = msg["msg_type"]
        if msg_type == "status":
            if (msg.get("content") or {}).get("execution_state") == "idle":
                rec.note_idle(msg)
            return
        if msg_type == "error":
            content = msg.get("content") or {}
            rec.followed_error = (str(content.get("ename", "Error")), str(content.get("evalue", "")))
            if (order := message_order(msg)) is not None:
                rec.error_order = max(order, rec.error_order or order)
        self._late.accept(ended, msg)

    def on_message_refused(self, execution: QueuedExecution) -> None:
        self._output.message_refused(execution)

    def on_anomaly(self, ended: EndedCell, what: str) -> None:
        execution = ended.execution()
        if execution is not None and execution.ending is None:
            execution.anomaly(what)
            return
        # too late for its record: the audit log says it (once per cell)
        if what not in ended.anomalies and len(ended.anomalies) < 10:
            ended.anomalies.append(what)
            self._hooks.kernel_event("kernel_anomaly", f"execution {ended.execution_id}: {what}")

    def on_late_output(self, ended: EndedCell, msg: dict[str, Any]) -> None:
        self._late.accept(ended, msg)

    # ------------------------------------------------------------- the queue
    @property
    def length(self) -> int:
        """Cells queued, running, or ended but with their ``done`` not yet out (a
        drain waits for that ``done``, and a pause for the cell to be over)."""
        busy = self.current is not None or self._ending is not None
        return len(self._cells) + (1 if busy else 0)

    def submit(
        self,
        code: str,
        execution_id: str | None = None,
        timeout: float | None = None,
        client: ClientRequest | None = None,
        *,
        replayable: bool = True,
    ) -> QueuedExecution:
        if self._status.state == "closed":
            raise BadRequest("The session is being deleted.")
        if timeout is None:
            timeout = self._config.exec_timeout_s
        if not 0 < timeout <= self._config.max_exec_timeout_s:
            raise BadRequest(f"timeout must be greater than 0 and at most {self._config.max_exec_timeout_s:g} seconds")
        execution_id = execution_id or uuid.uuid4().hex
        if execution_id in self._recent_ids:
            raise BadRequest(f"execution_id {execution_id!r} was already used in this session")
        self._recent_ids[execution_id] = None
        while len(self._recent_ids) > RECENT_IDS:
            self._recent_ids.popitem(last=False)
        rec = QueuedExecution(
            execution_id=execution_id,
            code=code,
            timeout=timeout,
            client=client,
            replayable=replayable,
            seen_orders=set() if client is not None else None,
        )
        queued = ev.Queued(execution_id=execution_id, code=code, position=self.length)
        self._cells.append(rec)
        # the worker is woken first, so an idle kernel has the cell before the
        # ``queued`` event is written to the subscribers' sockets (the event's
        # place in the sequence is set here all the same: nothing publishes between)
        self._wake.set()
        self.publish(queued, rec)
        return rec

    async def fail_queued(self, reason: str) -> None:
        """End every queued cell as dead with ``reason`` (stored, then announced):
        a paused session that cannot be resumed runs none of them."""
        while self._cells:
            rec = self._cells.popleft()
            self._ends.finish(rec, "dead", reason)
            await self._ends.store_then_announce(rec)

    def hold(self) -> None:
        """Take no queued cell until `release` (a restart that replays holds the
        cells sent meanwhile, so they run after the replay, in the rebuilt state)."""
        self._holds += 1

    def release(self) -> None:
        self._holds -= 1
        self._wake.set()

    def replay(self, cells: Sequence[LineageCell], trigger: ReplayTrigger) -> ReplayJob:
        """Run ``cells`` again, before any queued cell; await ``job.report``."""
        return self._replays.add(cells, trigger)

    async def interrupt(self) -> bool:
        rec = self.current
        if rec is None or self._link.handle is None or rec.finished.is_set():
            return False
        rec.interrupted = True
        self.backlog.unbound("interrupted")  # the reader catches up with what the kernel sent
        await self._link.interrupt()
        return True

    def abort_current(self, reason: str) -> QueuedExecution | None:
        """Stop waiting for the running execution (its kernel is going away);
        the worker then ends it with ``reason``. Returns it, if there was one."""
        rec = self.current
        if rec is not None:
            rec.abort(reason)
        return rec

    async def stop(
        self,
        drain_s: float = 2.0,
        reason: str = "the session was deleted",
        queued_reason: str = "the session was deleted before this execution ran",
        *,
        detaching: bool = False,
    ) -> list[QueuedExecution]:
        """Let the running execution publish its done event (ended with ``reason``),
        stop the worker, and end what is still queued (``queued_reason``). Returns
        the executions left to record. ``detaching``: the kernel is kept, and the
        running cell is left for the next gateway to follow (`followed_by_next`)."""
        self._queued_reason = queued_reason  # also for a cell the worker takes up meanwhile
        self._detaching = detaching
        if detaching and (current := self.current) is not None and followable(current) and current.followed is None:
            # the next gateway follows it: what comes until the link stops is its
            # output after the interim end (late output, not a forgery)
            current.followed = EndedCell.of(current)
            current.followed.followed = True
        running = self.abort_current(reason)
        if self._worker is not None:
            try:
                async with asyncio.timeout(drain_s):
                    await self._between_cells.wait()
            except TimeoutError:
                pass
            await cancel_and_wait(self._worker)
        unrecorded = [running] if running is not None else []
        while self._cells:
            rec = self._cells.popleft()
            self._ends.finish(rec, "dead", queued_reason)
            self._ends.announce(rec)
            unrecorded.append(rec)
        self._replays.cancel_all("the session was deleted before the replay ran")
        await self._late.close(drain_s)
        return unrecorded

    async def close_late(self, grace_s: float) -> None:
        """Store and send the late output accepted since `stop` (within ``grace_s``)."""
        await self._late.close(grace_s)

    def followed_by_next(self, rec: QueuedExecution | None) -> FollowedCell | None:
        """After `stop` with ``detaching`` and the link's stop: what the next gateway
        needs to follow ``rec`` (the cell that was running) to its end, or None
        when it is not to be followed (never sent, or its reply already in)."""
        if rec is None or rec.followed is None or rec.msg_id is None:
            return None
        ended = rec.followed
        return FollowedCell(
            execution_id=rec.execution_id,
            msg_id=rec.msg_id,
            nonce=rec.nonce,
            timeout_s=rec.timeout,
            sent_at=time.time() - (time.monotonic() - rec.started),
            output_bytes=ended.output_bytes,
            truncated=ended.truncated,
            late_parts=ended.late_parts,
        )

    def follow(self, cell: FollowedCell, interim: ev.Done) -> QueuedExecution:
        """Follow a cell a previous gateway sent and left running in the kept kernel,
        ahead of every queued cell (the kernel runs one at a time): its later output
        is appended to its record as late output, and once it ends (its reply and
        idle, or its timeout's remainder, or the kernel's death) its real end
        replaces the record's interim one (``interim``, its ``done`` sent already)."""
        rec = QueuedExecution(execution_id=cell.execution_id, code="", timeout=cell.timeout_s, nonce=cell.nonce)
        rec.msg_id = cell.msg_id
        rec.started = time.monotonic() - max(0.0, time.time() - cell.sent_at)
        rec.output_bytes, rec.truncated = cell.output_bytes, cell.truncated
        announced: asyncio.Future[ev.Done] = asyncio.get_running_loop().create_future()
        announced.set_result(interim)
        rec.followed = EndedCell(
            cell.execution_id,
            rec.anomalies,
            weakref.ref(rec),
            announced,
            cell.output_bytes,
            cell.truncated,
            late_parts=cell.late_parts,
            followed=True,
        )
        self._recent_ids[cell.execution_id] = None
        self._cells.appendleft(rec)
        self._wake.set()
        return rec

    # ------------------------------------------------------------- the worker
    async def _work(self) -> None:
        while True:
            item = await self._next()
            if isinstance(item, ReplayJob):
                await self._replays.run(item, self._config.max_exec_timeout_s)
            elif item.followed is not None:
                await self._run_followed(item)
            else:
                await self._run(item)

    async def _run_followed(self, rec: QueuedExecution) -> None:
        """Follow a cell a previous gateway left running (`follow`) to its end."""
        self.current = rec
        self._between_cells.clear()
        try:
            await self._follow(rec)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never let one execution kill the worker
            log.exception("following execution %s failed inside the gateway", rec.execution_id)
            self._ends.finish(rec, "dead", f"gateway error: {exc}")
        finally:
            self.current = None
            self._hooks.touch()
        self._ending = rec
        try:
            await self._end_followed(rec)
        finally:
            self._ending = None
            self._between_cells.set()

    async def _follow(self, rec: QueuedExecution) -> None:
        status = self._status
        if status.state in ("closed", "dead") or not self._link.connected or rec.msg_id is None:
            self._ends.finish(rec, "dead", status.dead_reason or "the kernel is not running")
            return
        status.state = "busy"
        rec.kernel_id = self._link.handle.kernel_id if self._link.handle is not None else None
        try:
            if not self._link.follow(rec, rec.msg_id):
                self._ends.finish(rec, "dead", status.dead_reason or "the kernel is not running")
                return
            # what remains of its timeout (a moment at least: the end probe tells
            # a cell that ended before this gateway listened)
            remaining = max(rec.timeout - (time.monotonic() - rec.started), self._config.state_poll_s)
            outcome = await self._wait(rec, remaining)
            if outcome == "timeout":
                await self._on_timeout(rec)
            elif isinstance(outcome, KernelState):
                await self._on_death(rec, outcome)
            elif rec.abort_reason is not None:
                self._ends.finish(rec, "dead", rec.abort_reason, state_lost=True)
            elif rec.reply is None and not rec.idle_seen:
                self._ends.finish(rec, "dead", FOLLOW_MISSED)
            else:
                if rec.reply is None:
                    # its reply went to the previous gateway's socket, gone: its end is
                    # the end probe's (answered after it), its outcome what its iopub said
                    rec.reply = followed_reply(rec)
                    rec.artifacts = parse_artifacts(rec.probe_reply or {})
                else:
                    await self._ends.collect_artifacts(rec)
                self._ends.finish_from_reply(rec)
        finally:
            self._link.forget(rec)
            if status.state == "busy":
                status.state = "idle"

    async def _end_followed(self, rec: QueuedExecution) -> None:
        """Store a followed cell's real end over its interim record, after its late
        output (none of it is published as ``done``: its ``done`` went out once)."""
        ended = rec.followed
        assert ended is not None
        if self._detaching and rec.abort_reason is not None:
            return  # the gateway stops again, keeping the kernel: the next one follows on
        if rec.ending is None:
            self._ends.finish(rec, "dead", "gateway error: the execution ended without a status")
        assert rec.ending is not None
        await self._late.drained()
        ended.followed = False  # from now on, output for it is late as for any ended cell
        await self._hooks.followed_ended(rec, rec.ending)
        if not rec.done.done():
            rec.done.set_result(rec.ending)
        # not in this gateway's lineage (its code is in its record, not here): the
        # next reattachment reads it from the store with the rest
        if rec.ending.artifacts:
            await self._hooks.keep_files()

    async def _next(self) -> QueuedExecution | ReplayJob:
        """The next replay, else the next queued cell (unless cells are held)."""
        while True:
            job = self._replays.take()
            if job is not None:
                return job
            if self._cells and not self._holds and self._status.state != "paused":
                return self._cells.popleft()
            self._wake.clear()
            await self._wake.wait()

    async def between_cells(self) -> None:
        """Return once the worker holds no execution (a cell's end is out)."""
        await self._between_cells.wait()

    async def _run(self, rec: QueuedExecution) -> ev.Done:
        """Run one cell to its published ``done``."""
        self.current = rec
        self._between_cells.clear()
        try:
            self._hooks.execution_started(rec)
            await self._execute(rec)
        except asyncio.CancelledError:
            self._ends.finish(rec, "dead", rec.abort_reason or "the session was deleted")
            self._ends.announce(rec)
            raise
        except Exception as exc:  # never let one execution kill the worker
            log.exception("execution %s failed inside the gateway", rec.execution_id)
            self._ends.finish(rec, "dead", f"gateway error: {exc}")
        finally:
            self.current = None
            self._hooks.touch()
        self._ending = rec
        try:
            await self._ends.store_then_announce(rec)
        finally:
            self._ending = None
            self._between_cells.set()
        done = rec.done.result()
        self.lineage.note(
            LineageCell(rec.execution_id, rec.code, rec.timeout),
            kernel_id=rec.kernel_id,
            status=done.status,
            replayable=rec.replayable,
        )
        if done.artifacts:
            # after its done went out, before the next cell: that cell's kernel
            # may die, and these files must outlive it
            await self._hooks.keep_files()
        return done

    async def _execute(self, rec: QueuedExecution) -> None:
        rec.started = time.monotonic()
        status = self._status
        if status.state == "closed":
            self._ends.finish(rec, "dead", self._queued_reason)
            return
        if status.state == "dead" or not self._link.connected:
            self._ends.finish(rec, "dead", status.dead_reason or "the kernel is not running; restart the session")
            return
        if rec.client is not None and rec.client.should_abort():
            self._ends.finish(rec, "error", ABORTED)
            return
        await self._link.resync_if_stale()
        status.state = "busy"
        rec.kernel_id = self._link.handle.kernel_id if self._link.handle is not None else None
        backlog = self.backlog
        backlog.begin(rec.execution_id)
        rec.chunk_committed = functools.partial(backlog.committed, rec.execution_id)
        try:
            if rec.env and not await self._set_env(rec):
                return
            if not self._link.send(rec):
                self._ends.finish(rec, "dead", status.dead_reason or "the kernel is not running; restart the session")
                return
            outcome = await self._wait(rec, rec.timeout)
            if outcome == "timeout":
                await self._on_timeout(rec)
            elif isinstance(outcome, KernelState):
                await self._on_death(rec, outcome)
            elif rec.abort_reason is not None:
                self._ends.finish(rec, "dead", rec.abort_reason, state_lost=True)
            else:
                await self._ends.collect_artifacts(rec)
                self._ends.finish_from_reply(rec)
        finally:
            backlog.end()
            self._link.forget(rec)
            if status.state == "busy":
                status.state = "idle"

    async def _set_env(self, rec: QueuedExecution) -> bool:
        """Set the cell's own environment variables in the kernel, right before it
        (`kernelgw.runtime.cell_env`); False when the kernel refused (the cell is
        ended then, not run). A kernel slow to answer gets the cell all the same:
        it runs what it is sent in order, so the variables are set before the cell."""
        reply = await self._link.silent_request(cell_env.setter_code(rec.env))
        if reply is None or reply.get("status") == "ok":
            return True
        why = f"{reply.get('ename')}: {reply.get('evalue')}"
        self._ends.finish(rec, "error", f"the cell's environment variables could not be set in the kernel ({why})")
        return False

    async def _wait(self, rec: QueuedExecution, timeout: float) -> Literal["finished", "timeout"] | KernelState:
        """Wait for reply + idle, polling the container so a dead kernel is noticed."""
        deadline = time.monotonic() + timeout
        replied_at: float | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            try:
                # asyncio.timeout rather than wait_for, which on 3.11 can swallow a
                # cancellation racing with completion (CPython gh-86296)
                async with asyncio.timeout(min(remaining, self._config.state_poll_s)):
                    await rec.finished.wait()
                return "finished"
            except TimeoutError:
                pass
            if checkpoint_due(rec):
                # what a gateway crash would keep of this cell: its output up to here
                self._store_progress(rec)
            replied = rec.reply is not None and (rec.reply_verified or rec.end_replied)
            if replied and replied_at is None:
                replied_at = time.monotonic()
            if (
                replied_at is not None
                and time.monotonic() - max(self._link.last_iopub, replied_at) > IOPUB_QUIET_S
                and not self._link.disconnect_pending
                and not self.backlog.waiting  # unread, not quiet
            ):
                # the reply is in and iopub has gone quiet without our idle: it was
                # dropped somewhere; everything before it has been read
                log.warning(
                    "session %s: no idle status for %s; finishing on the reply", self.session_id, rec.execution_id
                )
                rec.idle_lost = True
                return "finished"
            state = await self._link.container_state()
            if state is None:
                return "finished" if rec.abort_reason else KernelState(status="missing")
            if not state.alive:
                return state

    async def _on_timeout(self, rec: QueuedExecution) -> None:
        self.backlog.unbound("timed out")  # the interrupt's answer must not wait behind the store
        await self._link.interrupt()
        outcome = await self._wait(rec, self._config.interrupt_grace_s)
        if outcome == "finished" and rec.abort_reason is None:
            count = self._ends.count(rec)
            self._ends.finish(
                rec,
                "timeout",
                f"the execution exceeded its timeout of {rec.timeout:g}s and was interrupted; "
                "variables defined before are kept",
                execution_count=count,
            )
            return
        if isinstance(outcome, KernelState):
            await self._on_death(rec, outcome)
            return
        reason = (
            f"the execution exceeded its timeout of {rec.timeout:g}s and did not stop within "
            f"{self._config.interrupt_grace_s:g}s of an interrupt"
        )
        cells = self.lineage.cells
        # Restart before reporting, so a client that reads `done` finds the session usable.
        failure = await self._hooks.restart_after_timeout()
        if failure is not None:
            reason += f"; restarting the kernel failed ({failure}), so the session is dead"
        elif self._recovers(rec):
            reason += "; the kernel was restarted" + self._replays.after_loss(cells, "timeout")
        else:
            reason += "; the kernel was restarted and all variables are lost"
        self._ends.finish(rec, "timeout", reason, state_lost=True)

    async def _on_death(self, rec: QueuedExecution, state: KernelState) -> None:
        self._status.state = "dead"
        self._status.dead_reason = reason = state.describe()
        rec.death = reason
        self._hooks.kernel_event("kernel_died", reason)
        if self._recovers(rec):
            cells = self.lineage.cells
            # Restart before reporting, as after a timeout: the `done` says what comes next.
            failure = await self._hooks.restart_after_death()
            if failure is None:
                reason += "; the kernel was restarted" + self._replays.after_loss(cells, "kernel_died")
                self._ends.finish(rec, "dead", reason, state_lost=True)
                return
            reason += f"; restarting it failed ({failure})"
        self._ends.finish(rec, "dead", reason + "; restart the session to continue", state_lost=True)

    def _recovers(self, rec: QueuedExecution) -> bool:
        """Whether losing the kernel under ``rec`` starts an automatic replay: with
        ``auto_replay``, unless ``rec`` is itself replayed (no loops) or the
        gateway is replacing the kernel anyway (a restart, a deletion)."""
        return self._config.auto_replay and rec.replay_of is None and rec.abort_reason is None


def followable(rec: QueuedExecution) -> bool:
    """Whether a cell running when its gateway stops, keeping the kernel, can be
    followed by the next gateway: a cell the kernel was sent whose reply has not
    come (one whose reply came is over but for its idle)."""
    return rec.msg_id is not None and not rec.silent and rec.reply is None and rec.end_probe is None


def followed_reply(rec: QueuedExecution) -> dict[str, Any]:
    """The reply a followed cell's kernel sent to the previous gateway, as far as
    this one can tell: ``error`` when its iopub sent an error, else ``ok``; its
    execution count as the end probe's reply gives it (a silent request answers
    with the count of the last cell that counted: this one, if it did)."""
    count = (rec.probe_reply or {}).get("execution_count")
    if rec.followed_error is not None:
        ename, evalue = rec.followed_error
        return {"status": "error", "ename": ename, "evalue": evalue, "execution_count": count}
    return {"status": "ok", "execution_count": count}
