"""The execution queue: the kernel runs one cell at a time, in the order sent.

A FIFO served by one worker task. For each cell the worker sends the request,
waits for the reply and the kernel's idle (watching the container, so a dead
kernel is noticed), enforces the timeout (interrupt, then restart if the kernel
does not come back) and ends it with exactly one ``done`` built from the
gateway's facts: status, execution count and the end of a cell are never taken
on the kernel's word alone.

Acknowledged means stored: a cell is recorded when it starts (``running``) and
``done`` is published only after the end of the cell is committed. While that
commit is awaited, events of other cells (``queued``) are held back, so the
``done`` keeps the ``seq`` its stored copy names. A store that fails does not
hold the session: ``done`` goes out with a reason saying it was not stored.

Recovery by replay (`kernelgw.runtime.lineage`): the queue keeps the lineage
of the kernel (the cells that ran ``ok`` in it) and runs replays in its worker,
ahead of every queued cell, one cell after the other, stopping at the first
that does not end ``ok``. With ``auto_replay`` the worker itself restarts a
kernel that died under a cell (out of memory) and replays, as it does after
the restart that follows a timeout the kernel ignored; a replayed cell never
starts another recovery.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from kernelgw import events as ev
from kernelgw.errors import BadRequest
from kernelgw.events import ReplayTrigger
from kernelgw.runtime.backends.base import KernelState
from kernelgw.runtime.cell_output import CellOutput
from kernelgw.runtime.execution import (
    ARTIFACTS_EXPRESSION,
    ClientRequest,
    EndedCell,
    QueuedExecution,
    checkpoint_due,
    parse_artifacts,
)
from kernelgw.runtime.fanout import EventFanout, Published
from kernelgw.runtime.iopub import cut_text
from kernelgw.runtime.kernel_link import KernelLink
from kernelgw.runtime.lineage import (
    Lineage,
    LineageCell,
    ReplayedCellOutcome,
    ReplayJob,
    ReplayReport,
)
from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.output_backlog import OutputBacklog
from kernelgw.runtime.recorder import CHUNK_BYTES
from kernelgw.runtime.session_config import SessionConfig
from kernelgw.runtime.session_state import SessionStatus
from kernelgw.tasks import cancel_and_wait

log = logging.getLogger(__name__)

REASON_MAX_CHARS = 2000
IOPUB_QUIET_S = 1.0
"""After the execute_reply, iopub silent this long without an idle for the
request means the idle was lost: finish anyway instead of hanging."""
RECENT_IDS = 10000
"""How many execution ids a session remembers to refuse reuse."""
NOT_STORED = "the history storage failed, so this execution's record was not stored"
ANNOUNCE_FAILED = "gateway error: announcing the end of this execution failed, so its record may not match"
ABORTED = "aborted: an earlier cell from the same Jupyter client failed and asked to stop on error"


def stores_history(rec: QueuedExecution) -> bool:
    """Whether the kernel counts the cell (/v1 cells always; a Jupyter client's
    unless it asked for ``store_history: false``)."""
    if rec.client is None:
        return True
    content = rec.client.message.get("content") or {}
    return content.get("store_history", True) is not False and not content.get("silent")


class SessionHooks(Protocol):
    """What the queue asks of the session around it."""

    def touch(self) -> None: ...

    def kernel_event(self, kind: str, detail: str) -> None:
        """The kernel died or was restarted (for the audit log)."""
        ...

    def execution_started(self, rec: QueuedExecution) -> None:
        """Record a cell as running (queued for the store; never waits)."""
        ...

    def execution_progress(self, rec: QueuedExecution) -> None:
        """Store a running cell's events so far (queued; never waits)."""
        ...

    async def record_execution(self, rec: QueuedExecution, done: Published | None = None) -> bool:
        """Store an ended execution (``done``: its end, not yet published);
        False when the store could not commit it."""
        ...

    async def restart_after_timeout(self) -> str | None:
        """Replace a kernel that ignored an interrupt; returns why it failed, if it did."""
        ...

    async def keep_files(self) -> None:
        """The session has files now: keep them past its kernel (logs, never raises)."""
        ...

    async def restart_after_death(self) -> str | None:
        """Replace a kernel that died under a cell (``auto_replay``); returns why it failed, if it did."""
        ...


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
        self.metrics = metrics
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
        self._replays: collections.deque[ReplayJob] = collections.deque()
        """Replays to run before any queued cell (`replay`)."""
        self._holds = 0
        """While above 0 the worker takes no queued cell (a restart that replays is under way)."""
        self._wake = asyncio.Event()
        """Set when there may be work for the worker."""
        self.lineage = Lineage()
        """The cells that built the running kernel's state (`kernelgw.runtime.lineage`)."""
        self._worker: asyncio.Task[None] | None = None
        self._recent_ids: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._between_cells = asyncio.Event()
        """Set while the worker holds no execution (what `close` waits for)."""
        self._between_cells.set()
        self._held: list[tuple[ev.Event, QueuedExecution | None]] | None = None
        """Events published while a ``done`` waits for its commit; sent after it."""
        link.attach(self)
        link.backlog = self.backlog

    @property
    def config(self) -> SessionConfig:
        return self._config

    @config.setter
    def config(self, config: SessionConfig) -> None:
        self._config = config
        self._output.config = config

    def start(self) -> None:
        self._worker = asyncio.create_task(self._work(), name=f"session-{self.session_id}")

    def publish(self, event: ev.Event, rec: QueuedExecution | None = None) -> None:
        if self._held is not None:
            self._held.append((event, rec))
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
        self._output.handle(execution, msg)

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
            self._finish(rec, "dead", reason)
            await self._store_then_announce(rec)

    def hold(self) -> None:
        """Take no queued cell until `release` (a restart that replays holds the
        cells sent meanwhile, so they run after the replay, in the rebuilt state)."""
        self._holds += 1

    def release(self) -> None:
        self._holds -= 1
        self._wake.set()

    def replay(self, cells: Sequence[LineageCell], trigger: ReplayTrigger) -> ReplayJob:
        """Run ``cells`` again, before any queued cell; await ``job.report``."""
        if self._status.state == "closed":
            raise BadRequest("The session is being deleted.")
        job = ReplayJob(list(cells), trigger)
        self._replays.append(job)
        self._wake.set()
        return job

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
    ) -> list[QueuedExecution]:
        """Let the running execution publish its done event (ended with ``reason``),
        stop the worker, and end what is still queued (``queued_reason``). Returns
        the executions left to record."""
        self._queued_reason = queued_reason  # also for a cell the worker takes up meanwhile
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
            self._finish(rec, "dead", queued_reason)
            self._announce(rec)
            unrecorded.append(rec)
        while self._replays:
            job = self._replays.popleft()
            if not job.report.done():
                job.report.set_result(self._report(job, [], "the session was deleted before the replay ran"))
        return unrecorded

    # ------------------------------------------------------------- the worker
    async def _work(self) -> None:
        while True:
            item = await self._next()
            if isinstance(item, ReplayJob):
                await self._replay(item)
            else:
                await self._run(item)

    async def _next(self) -> QueuedExecution | ReplayJob:
        """The next replay, else the next queued cell (unless cells are held)."""
        while True:
            if self._replays:
                return self._replays.popleft()
            if self._cells and not self._holds and self._status.state != "paused":
                return self._cells.popleft()
            self._wake.clear()
            await self._wake.wait()

    async def _run(self, rec: QueuedExecution) -> ev.Done:
        """Run one cell to its published ``done``."""
        self.current = rec
        self._between_cells.clear()
        try:
            self._hooks.execution_started(rec)
            await self._execute(rec)
        except asyncio.CancelledError:
            self._finish(rec, "dead", rec.abort_reason or "the session was deleted")
            self._announce(rec)
            raise
        except Exception as exc:  # never let one execution kill the worker
            log.exception("execution %s failed inside the gateway", rec.execution_id)
            self._finish(rec, "dead", f"gateway error: {exc}")
        finally:
            self.current = None
            self._hooks.touch()
        self._ending = rec
        try:
            await self._store_then_announce(rec)
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

    async def _replay(self, job: ReplayJob) -> None:
        """Run a lineage again, cell by cell, until one does not end ``ok``."""
        total = len(job.cells)
        outcomes: list[ReplayedCellOutcome] = []
        self.publish(ev.Replay(phase="started", trigger=job.trigger, cells=total))
        try:
            for index, cell in enumerate(job.cells):
                rec = QueuedExecution(
                    execution_id=uuid.uuid4().hex,
                    code=cell.code,
                    timeout=cell.timeout or self._config.max_exec_timeout_s,
                    replay_of=cell.execution_id,
                )
                self.publish(ev.Queued(execution_id=rec.execution_id, code=rec.code, position=0), rec)
                self.publish(
                    ev.Replay(
                        execution_id=rec.execution_id,
                        phase="cell",
                        trigger=job.trigger,
                        cells=total,
                        index=index,
                        replay_of=cell.execution_id,
                    ),
                    rec,
                )
                done = await self._run(rec)
                outcomes.append(self._outcome(index, cell, rec, done))
                if done.status != "ok":
                    break
        finally:
            # also when the session is deleted meanwhile (the worker is cancelled)
            report = self._report(job, outcomes, "not run: an earlier cell of the replay did not end ok")
            if not job.report.done():
                job.report.set_result(report)
            self.publish(
                ev.Replay(
                    phase="finished",
                    trigger=job.trigger,
                    cells=total,
                    replayed=report.replayed,
                    duration_ms=report.duration_ms,
                )
            )
        log.info(
            "session %s: replayed %d of %d cells (%s) in %.0f ms",
            self.session_id,
            report.replayed,
            total,
            job.trigger,
            report.duration_ms,
        )

    @staticmethod
    def _outcome(index: int, cell: LineageCell, rec: QueuedExecution, done: ev.Done) -> ReplayedCellOutcome:
        error = rec.last_error
        return ReplayedCellOutcome(
            index=index,
            replay_of=cell.execution_id,
            status=done.status,
            execution_id=rec.execution_id,
            duration_ms=done.duration_ms,
            ename=error.ename if error is not None else None,
            evalue=error.evalue if error is not None else None,
            reason=done.reason,
        )

    @staticmethod
    def _report(job: ReplayJob, outcomes: list[ReplayedCellOutcome], skipped: str) -> ReplayReport:
        """The report of a replay that ran ``outcomes``; the cells after them are skipped."""
        rest = [
            ReplayedCellOutcome(index=i, replay_of=cell.execution_id, status="skipped", reason=skipped)
            for i, cell in enumerate(job.cells)
            if i >= len(outcomes)
        ]
        duration = round((time.monotonic() - job.started) * 1000, 3)
        return ReplayReport(trigger=job.trigger, cells=[*outcomes, *rest], duration_ms=duration)

    async def _store_then_announce(self, rec: QueuedExecution) -> None:
        """Commit the end of the cell, then publish its ``done`` (acknowledged means
        stored). A fault of the gateway's own on the way is logged and answered in
        the ``done`` (`_announce_despite`): it must not end the worker, or every
        later cell of the session would wait forever."""
        try:
            await self._store_then_announce_unguarded(rec)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("announcing the end of execution %s failed", rec.execution_id)
            self._announce_despite(rec, exc)

    async def _store_then_announce_unguarded(self, rec: QueuedExecution) -> None:
        if rec.ending is None:  # every path through _execute ends the cell; be sure anyway
            self._finish(rec, "dead", "gateway error: the execution ended without a status")
        assert rec.ending is not None
        seq = self._fanout.seq + 1  # nothing reaches the fan-out until the done does
        preview = rec.ending.model_copy(update={"seq": seq})
        prepared = Published(seq, preview, preview.model_dump_json())
        self._held = []
        try:
            stored = await self._hooks.record_execution(rec, prepared)
        except asyncio.CancelledError:
            self._announce(rec)
            raise
        except Exception:
            log.exception("recording execution %s failed", rec.execution_id)
            stored = False
        # the done stored is the done sent, byte for byte
        self._announce(rec, None if stored else NOT_STORED, prepared if stored else None)

    async def _execute(self, rec: QueuedExecution) -> None:
        rec.started = time.monotonic()
        status = self._status
        if status.state == "closed":
            self._finish(rec, "dead", self._queued_reason)
            return
        if status.state == "dead" or not self._link.connected:
            self._finish(rec, "dead", status.dead_reason or "the kernel is not running; restart the session")
            return
        if rec.client is not None and rec.client.should_abort():
            self._finish(rec, "error", ABORTED)
            return
        await self._link.resync_if_stale()
        status.state = "busy"
        rec.kernel_id = self._link.handle.kernel_id if self._link.handle is not None else None
        backlog = self.backlog
        backlog.begin(rec.execution_id)
        rec.chunk_committed = functools.partial(backlog.committed, rec.execution_id)
        try:
            if not self._link.send(rec):
                self._finish(rec, "dead", status.dead_reason or "the kernel is not running; restart the session")
                return
            outcome = await self._wait(rec, rec.timeout)
            if outcome == "timeout":
                await self._on_timeout(rec)
            elif isinstance(outcome, KernelState):
                await self._on_death(rec, outcome)
            elif rec.abort_reason is not None:
                self._finish(rec, "dead", rec.abort_reason, state_lost=True)
            else:
                await self._collect_artifacts(rec)
                self._finish_from_reply(rec)
        finally:
            backlog.end()
            self._link.forget(rec)
            if status.state == "busy":
                status.state = "idle"

    async def _wait(self, rec: QueuedExecution, timeout: float) -> Literal["finished", "timeout"] | KernelState:
        """Wait for reply + idle, polling the container so a dead kernel is noticed."""
        deadline = time.monotonic() + timeout
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
            if (
                rec.reply is not None
                and (rec.reply_verified or rec.end_replied)
                and time.monotonic() - self._link.last_iopub > IOPUB_QUIET_S
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
            count = self._count(rec)
            self._finish(
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
            reason += "; the kernel was restarted" + self._replay_next(cells, "timeout")
        else:
            reason += "; the kernel was restarted and all variables are lost"
        self._finish(rec, "timeout", reason, state_lost=True)

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
                reason += "; the kernel was restarted" + self._replay_next(cells, "kernel_died")
                self._finish(rec, "dead", reason, state_lost=True)
                return
            reason += f"; restarting it failed ({failure})"
        self._finish(rec, "dead", reason + "; restart the session to continue", state_lost=True)

    def _recovers(self, rec: QueuedExecution) -> bool:
        """Whether losing the kernel under ``rec`` starts an automatic replay: with
        ``auto_replay``, unless ``rec`` is itself replayed (no loops) or the
        gateway is replacing the kernel anyway (a restart, a deletion)."""
        return self._config.auto_replay and rec.replay_of is None and rec.abort_reason is None

    def _replay_next(self, cells: Sequence[LineageCell], trigger: ReplayTrigger) -> str:
        """Queue the replay of ``cells`` ahead of everything; the words for the ``done``."""
        if self._status.state == "closed":
            return " and all variables are lost"
        if not cells:
            return " (auto_replay: no earlier cell to replay)"
        self.replay(cells, trigger)
        n = len(cells)
        return f"; auto_replay runs the {n} cell{'' if n == 1 else 's'} that built its state again, next"

    async def _collect_artifacts(self, rec: QueuedExecution) -> None:
        """Read the workspace changes the kernel reported for this cell.

        On success they came with the reply. The kernel skips user_expressions when
        a cell fails, so then one silent request asks again (files written before
        the exception still count)."""
        reply = rec.reply or {}
        if reply.get("status") != "ok":
            # the end probe asked already (`KernelLink`); else ask now
            reply = rec.probe_reply or await self._link.silent_request("", {"artifacts": ARTIFACTS_EXPRESSION}) or {}
        rec.artifacts = parse_artifacts(reply)

    # ------------------------------------------------------------- done
    def _count(self, rec: QueuedExecution) -> int | None:
        """The cell's execution count, by the gateway's own counting: one per cell
        the kernel ran with ``store_history`` (as IPython counts), whatever number
        the kernel's reply claims."""
        reply = rec.reply or {}
        if rec.counted:
            return self._status.execution_count
        if rec.silent or reply.get("status") not in ("ok", "error") or not stores_history(rec):
            return None
        rec.counted = True
        claimed = reply.get("execution_count")
        if self._status.count_unknown and isinstance(claimed, int) and claimed > self._status.execution_count:
            self._status.execution_count = claimed - 1
        self._status.count_unknown = False
        self._status.execution_count += 1
        if claimed != self._status.execution_count:
            log.debug(
                "session %s: the kernel numbered %s as %r; the gateway counts %d",
                self.session_id,
                rec.execution_id,
                claimed,
                self._status.execution_count,
            )
        return self._status.execution_count

    def _finish_from_reply(self, rec: QueuedExecution) -> None:
        reply = rec.reply or {}
        count = self._count(rec)
        status = reply.get("status")
        if status == "ok":
            lost = "the kernel's end-of-cell status message was lost; output may be incomplete"
            self._finish(rec, "ok", lost if rec.idle_lost else None, execution_count=count)
        elif rec.interrupted and (reply.get("ename") == "KeyboardInterrupt" or status == "abort"):
            # IRkernel, among others, answers an interrupted cell with a bare "abort"
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
        if rec.done.done() or rec.ending is not None:
            return
        if rec.anomalies:
            what = "; ".join(rec.anomalies)
            note = (
                f"the kernel sent messages a kernel does not send on its own ({what}): this cell's code may "
                "have forged them; the gateway waited for the cell's real end"
            )
            reason = f"{reason}; {note}" if reason else note
            self._hooks.kernel_event("kernel_anomaly", f"execution {rec.execution_id}: {what}")
        started = rec.started or time.monotonic()
        rec.ending = ev.Done(
            execution_id=rec.execution_id,
            status=status,
            execution_count=execution_count,
            duration_ms=round((time.monotonic() - started) * 1000, 3),
            reason=reason,
            state_lost=state_lost,
            artifacts=rec.artifacts,
        )

    def _announce_despite(self, rec: QueuedExecution, exc: Exception) -> None:
        """End ``rec`` after `_announce` (or what came before it) raised: its ``done``
        goes out with a reason naming the fault, unless it went out already; the
        events held meanwhile are sent (`_announce` sent them if it got so far);
        a Jupyter client is told."""
        held, self._held = self._held or [], None
        if not rec.done.done():
            if rec.ending is None:
                self._finish(rec, "dead", None)
            assert rec.ending is not None
            note = f"{ANNOUNCE_FAILED} ({type(exc).__name__}: {exc})"
            done = rec.ending.model_copy(
                update={"reason": f"{rec.ending.reason}; {note}" if rec.ending.reason else note}
            )
            try:
                pub = self._fanout.publish(done)
                rec.published.append(pub)
                assert isinstance(pub.event, ev.Done)
                done = pub.event
            except Exception:
                log.exception("publishing the done of execution %s failed", rec.execution_id)
            rec.done.set_result(done)  # REST and the Jupyter client are answered whatever happened
        for event, owner in held:
            try:
                self.publish(event, owner)
            except Exception:
                log.exception("publishing an event held for execution %s failed", rec.execution_id)
        if rec.client is not None:
            try:
                rec.client.ended(rec)
            except Exception:
                log.exception("answering the Jupyter client of execution %s failed", rec.execution_id)

    def _announce(self, rec: QueuedExecution, note: str | None = None, prepared: Published | None = None) -> None:
        """Publish the ``done`` `_finish` built (``note`` appended to its reason;
        ``prepared``: it numbered and serialised already), resolve the execution,
        then send the events held meanwhile."""
        held, self._held = self._held or [], None
        done = rec.ending
        try:
            if done is not None and not rec.done.done():
                if note is not None:
                    done = done.model_copy(update={"reason": f"{done.reason}; {note}" if done.reason else note})
                pub = self._fanout.publish(done, prepared if note is None else None)
                rec.published.append(pub)
                assert isinstance(pub.event, ev.Done)
                rec.done.set_result(pub.event)
                if self.metrics is not None and not rec.silent:
                    death = rec.death or self._status.dead_reason or ""
                    oom = done.status == "dead" and death.startswith("out-of-memory")
                    try:
                        self.metrics.execution_done(pub.event, rec.output_bytes, oom_killed=oom)
                    except Exception:
                        log.exception("counting execution %s in the metrics failed", rec.execution_id)
        finally:
            # whatever failed above (`_announce_despite` ends the cell then)
            for event, owner in held:
                self.publish(event, owner)
        if rec.client is not None:
            try:
                rec.client.ended(rec)
            except Exception:
                log.exception("answering the Jupyter client of execution %s failed", rec.execution_id)
