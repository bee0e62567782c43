"""Replay jobs: a lineage run again, cell by cell, in the execution queue's worker.

A replay runs ahead of every queued cell, one cell after the other, stopping at
the first that does not end ``ok``; its report names each cell's outcome
(`kernelgw.runtime.lineage`). A replayed cell never starts another recovery
(the queue checks ``replay_of``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence

from kernelgw import events as ev
from kernelgw.errors import BadRequest
from kernelgw.events import ReplayTrigger
from kernelgw.runtime.execution import QueuedExecution
from kernelgw.runtime.lineage import LineageCell, ReplayedCellOutcome, ReplayJob, ReplayReport
from kernelgw.runtime.session_state import SessionStatus

log = logging.getLogger(__name__)

Publish = Callable[[ev.Event, QueuedExecution | None], None]
RunCell = Callable[[QueuedExecution], Awaitable[ev.Done]]
"""The queue's own way of running one cell to its published ``done``."""


class ReplayRunner:
    """The replays a session's queue owes, and how its worker runs one."""

    def __init__(
        self, session_id: str, status: SessionStatus, run_cell: RunCell, publish: Publish, wake: asyncio.Event
    ) -> None:
        self.session_id = session_id
        self._status = status
        self._run_cell = run_cell
        self._publish = publish
        self._wake = wake
        """The queue's worker's: set when a replay is added."""
        self._jobs: collections.deque[ReplayJob] = collections.deque()

    def add(self, cells: Sequence[LineageCell], trigger: ReplayTrigger) -> ReplayJob:
        """Run ``cells`` again, before any queued cell; await ``job.report``."""
        if self._status.state == "closed":
            raise BadRequest("The session is being deleted.")
        job = ReplayJob(list(cells), trigger)
        self._jobs.append(job)
        self._wake.set()
        return job

    def take(self) -> ReplayJob | None:
        """The next replay to run, if one waits."""
        return self._jobs.popleft() if self._jobs else None

    def after_loss(self, cells: Sequence[LineageCell], trigger: ReplayTrigger) -> str:
        """Queue the replay of ``cells`` ahead of everything; the words for the ``done``."""
        if self._status.state == "closed":
            return " and all variables are lost"
        if not cells:
            return " (auto_replay: no earlier cell to replay)"
        self.add(cells, trigger)
        n = len(cells)
        return f"; auto_replay runs the {n} cell{'' if n == 1 else 's'} that built its state again, next"

    def cancel_all(self, reason: str) -> None:
        """Answer every replay still waiting: none of its cells ran (``reason``)."""
        while self._jobs:
            job = self._jobs.popleft()
            if not job.report.done():
                job.report.set_result(report(job, [], reason))

    async def run(self, job: ReplayJob, max_timeout_s: float) -> None:
        """Run a lineage again, cell by cell, until one does not end ``ok`` (a cell
        whose timeout is not known gets ``max_timeout_s``)."""
        total = len(job.cells)
        outcomes: list[ReplayedCellOutcome] = []
        self._publish(ev.Replay(phase="started", trigger=job.trigger, cells=total), None)
        try:
            for index, cell in enumerate(job.cells):
                rec = QueuedExecution(
                    execution_id=uuid.uuid4().hex,
                    code=cell.code,
                    timeout=cell.timeout or max_timeout_s,
                    replay_of=cell.execution_id,
                )
                self._publish(ev.Queued(execution_id=rec.execution_id, code=rec.code, position=0), rec)
                self._publish(
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
                done = await self._run_cell(rec)
                outcomes.append(outcome(index, cell, rec, done))
                if done.status != "ok":
                    break
        finally:
            # also when the session is deleted meanwhile (the worker is cancelled)
            result = report(job, outcomes, "not run: an earlier cell of the replay did not end ok")
            if not job.report.done():
                job.report.set_result(result)
            self._publish(
                ev.Replay(
                    phase="finished",
                    trigger=job.trigger,
                    cells=total,
                    replayed=result.replayed,
                    duration_ms=result.duration_ms,
                ),
                None,
            )
        log.info(
            "session %s: replayed %d of %d cells (%s) in %.0f ms",
            self.session_id,
            result.replayed,
            total,
            job.trigger,
            result.duration_ms,
        )


def outcome(index: int, cell: LineageCell, rec: QueuedExecution, done: ev.Done) -> ReplayedCellOutcome:
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


def report(job: ReplayJob, outcomes: list[ReplayedCellOutcome], skipped: str) -> ReplayReport:
    """The report of a replay that ran ``outcomes``; the cells after them are skipped."""
    rest = [
        ReplayedCellOutcome(index=i, replay_of=cell.execution_id, status="skipped", reason=skipped)
        for i, cell in enumerate(job.cells)
        if i >= len(outcomes)
    ]
    duration = round((time.monotonic() - job.started) * 1000, 3)
    return ReplayReport(trigger=job.trigger, cells=[*outcomes, *rest], duration_ms=duration)
