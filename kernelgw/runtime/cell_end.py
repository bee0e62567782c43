"""The end of a cell: its ``done``, built from the gateway's facts, stored, then announced.

Status, execution count and the end of a cell are never taken on the kernel's
word alone. Acknowledged means stored: ``done`` is published only after the
end of the cell is committed. While that commit is awaited, events of other
cells (``queued``) are held back, so the ``done`` keeps the ``seq`` its stored
copy names. A store that fails does not hold the session: ``done`` goes out
with a reason saying it was not stored. A fault of the gateway's own while
announcing is named in the ``done``; it never ends the queue's worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from kernelgw import events as ev
from kernelgw.runtime.execution import ARTIFACTS_EXPRESSION, EndedCell, QueuedExecution, parse_artifacts
from kernelgw.runtime.fanout import EventFanout, Published
from kernelgw.runtime.iopub import cut_text
from kernelgw.runtime.kernel_link import KernelLink
from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.session_state import SessionStatus

log = logging.getLogger(__name__)

REASON_MAX_CHARS = 2000
NOT_STORED = "the history storage failed, so this execution's record was not stored"
ANNOUNCE_FAILED = "gateway error: announcing the end of this execution failed, so its record may not match"

Publish = Callable[[ev.Event, QueuedExecution | None], None]


def stores_history(rec: QueuedExecution) -> bool:
    """Whether the kernel counts the cell (/v1 cells always; a Jupyter client's
    unless it asked for ``store_history: false``)."""
    if rec.client is None:
        return True
    content = rec.client.message.get("content") or {}
    return content.get("store_history", True) is not False and not content.get("silent")


def error_after_reply(rec: QueuedExecution) -> bool:
    """The cell sent an error after its verified reply: an honest kernel replies once
    the cell is over (an error before the reply, such as a display formatter's,
    leaves an ``ok`` cell ``ok``), so the reply was forged."""
    return rec.reply_order is not None and rec.error_order is not None and rec.error_order > rec.reply_order


class EndHooks(Protocol):
    """What ending a cell asks of the session (a part of `SessionHooks`)."""

    def kernel_event(self, kind: str, detail: str) -> None:
        """The kernel died or was restarted (for the audit log)."""
        ...

    async def record_execution(self, rec: QueuedExecution, done: Published | None = None) -> bool:
        """Store an ended execution (``done``: its end, not yet published);
        False when the store could not commit it."""
        ...

    async def record_late(self, cell: EndedCell, events: Sequence[Published]) -> bool:
        """Append output that came after a cell's end to its stored record (and the
        status ``error`` when one of them is an error); False when not committed."""
        ...


class CellEnds:
    """Ends the execution queue's cells, one at a time (the queue's worker calls it)."""

    def __init__(
        self,
        session_id: str,
        link: KernelLink,
        fanout: EventFanout,
        status: SessionStatus,
        hooks: EndHooks,
        publish: Publish,
        metrics: Metrics | None = None,
    ) -> None:
        self.session_id = session_id
        self.metrics = metrics
        self._link = link
        self._fanout = fanout
        self._status = status
        self._hooks = hooks
        self._publish = publish
        """The queue's `ExecutionQueue.publish` (held events go out through it)."""
        self._held: list[tuple[ev.Event, QueuedExecution | None]] | None = None
        """Events published while a ``done`` waits for its commit; sent after it."""
        self._numbering = asyncio.Lock()
        """Held while events numbered ahead wait for their commit (a ``done``, late output)."""

    def hold(self, event: ev.Event, rec: QueuedExecution | None) -> bool:
        """Keep ``event`` for after the ``done`` whose commit is awaited, if one is;
        False when it may be published now."""
        if self._held is None:
            return False
        self._held.append((event, rec))
        return True

    async def collect_artifacts(self, rec: QueuedExecution) -> None:
        """Read the workspace changes the kernel reported for this cell.

        On success they came with the reply. The kernel skips user_expressions when
        a cell fails, so then one silent request asks again (files written before
        the exception still count)."""
        reply = rec.reply or {}
        if reply.get("status") != "ok":
            # the end probe asked already (`KernelLink`); else ask now
            reply = rec.probe_reply or await self._link.silent_request("", {"artifacts": ARTIFACTS_EXPRESSION}) or {}
        rec.artifacts = parse_artifacts(reply)

    def count(self, rec: QueuedExecution) -> int | None:
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

    def finish_from_reply(self, rec: QueuedExecution) -> None:
        reply = rec.reply or {}
        count = self.count(rec)
        status = reply.get("status")
        if status == "ok" and error_after_reply(rec):
            # the error came before the gateway decided the end, the forged reply
            # before it: as when it comes after the end (`late_output`), an error
            rec.anomaly("an error after the execute_reply")
            error = rec.last_error
            what = cut_text(f"{error.ename}: {error.evalue}", REASON_MAX_CHARS) if error is not None else "an error"
            self.finish(rec, "error", f"{what} (sent after the cell's reply)", execution_count=count)
        elif status == "ok":
            lost = "the kernel's end-of-cell status message was lost; output may be incomplete"
            self.finish(rec, "ok", lost if rec.idle_lost else None, execution_count=count)
        elif rec.interrupted and (reply.get("ename") == "KeyboardInterrupt" or status == "abort"):
            # IRkernel, among others, answers an interrupted cell with a bare "abort"
            self.finish(rec, "interrupted", "interrupted on request; variables are kept", execution_count=count)
        else:
            reason = f"{reply.get('ename', 'Error')}: {reply.get('evalue', '')}" if status == "error" else None
            if reason is not None:
                reason = cut_text(reason, REASON_MAX_CHARS)
            self.finish(rec, "error", reason or f"the kernel replied {status!r}", execution_count=count)

    def finish(
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

    async def store_then_announce(self, rec: QueuedExecution) -> None:
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

    @contextlib.asynccontextmanager
    async def numbering(self) -> AsyncIterator[int]:
        """Number events ahead of their commit (late output, `LateOutput`): yields
        the next ``seq``; what others publish meanwhile is held and sent after."""
        async with self._numbering:
            self._held = []
            try:
                yield self._fanout.seq + 1
            finally:
                held, self._held = self._held or [], None
                for event, owner in held:
                    self._publish(event, owner)

    async def _store_then_announce_unguarded(self, rec: QueuedExecution) -> None:
        async with self._numbering:
            await self._store_then_announce_locked(rec)

    async def _store_then_announce_locked(self, rec: QueuedExecution) -> None:
        if rec.ending is None:  # every path through the queue ends the cell; be sure anyway
            self.finish(rec, "dead", "gateway error: the execution ended without a status")
        assert rec.ending is not None
        seq = self._fanout.seq + 1  # nothing reaches the fan-out until the done does
        preview = rec.ending.model_copy(update={"seq": seq})
        prepared = Published(seq, preview, preview.model_dump_json())
        self._held = []
        try:
            stored = await self._hooks.record_execution(rec, prepared)
        except asyncio.CancelledError:
            self.announce(rec)
            raise
        except Exception:
            log.exception("recording execution %s failed", rec.execution_id)
            stored = False
        # the done stored is the done sent, byte for byte
        self.announce(rec, None if stored else NOT_STORED, prepared if stored else None)

    def _announce_despite(self, rec: QueuedExecution, exc: Exception) -> None:
        """End ``rec`` after `announce` (or what came before it) raised: its ``done``
        goes out with a reason naming the fault, unless it went out already; the
        events held meanwhile are sent (`announce` sent them if it got so far);
        a Jupyter client is told."""
        held, self._held = self._held or [], None
        if not rec.done.done():
            if rec.ending is None:
                self.finish(rec, "dead", None)
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
                self._publish(event, owner)
            except Exception:
                log.exception("publishing an event held for execution %s failed", rec.execution_id)
        if rec.client is not None:
            try:
                rec.client.ended(rec)
            except Exception:
                log.exception("answering the Jupyter client of execution %s failed", rec.execution_id)

    def announce(self, rec: QueuedExecution, note: str | None = None, prepared: Published | None = None) -> None:
        """Publish the ``done`` `finish` built (``note`` appended to its reason;
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
                self._publish(event, owner)
        if rec.client is not None:
            try:
                rec.client.ended(rec)
            except Exception:
                log.exception("answering the Jupyter client of execution %s failed", rec.execution_id)
