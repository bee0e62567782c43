"""Output a cell sends after its end: kept, stored, then sent as ``late``.

A cell's code holds its kernel's key and can read its request's nonce, so it can
forge the reply and idle that end it (`kernelgw.runtime.message_routes`): the
gateway then ends the cell early. Whatever the kernel sends for the cell after
the gateway decided its end (before its ``done`` went out or long after) is
late, whatever the timing, and never dropped: within the cell's output cap
(the same cap, counted on from the cell's own output), it is appended to the
cell's stored record (an ``error`` turns the recorded status to ``error``), and
once that is committed it is sent to subscribers wrapped in a ``late`` event,
after the cell's ``done`` (acknowledged means durable). Output with no parent,
or a parent the gateway never sent, belongs to no cell and is not kept.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from kernelgw import events as ev
from kernelgw.runtime.cell_end import CellEnds
from kernelgw.runtime.cell_output import ERROR_MAX_BYTES, cap_images
from kernelgw.runtime.execution import EndedCell
from kernelgw.runtime.fanout import EventFanout, Published
from kernelgw.runtime.iopub import payload_size, to_event, trim_error
from kernelgw.runtime.session_config import SessionConfig
from kernelgw.tasks import cancel_and_wait

log = logging.getLogger(__name__)

LateEvent = ev.Stream | ev.Display | ev.UpdateDisplay | ev.Result | ev.Error | ev.Truncated
DONE_WAIT_S = 600.0
"""Late output waits this long at most for its cell's ``done`` (which every path
through the queue publishes); then it is stored and sent anyway."""
MAX_PENDING = 10_000
"""Late events waiting for their commit, at most (each within its cell's cap)."""


def late_events(cell: EndedCell, msg: dict[str, Any], config: SessionConfig) -> list[LateEvent]:
    """What of one late iopub message is kept: counted against the cell's output
    cap like its own output (past it, one ``truncated`` says so and the rest is
    dropped). The first late error is kept whatever the cap, trimmed (it says
    how the cell really ended, and turns its status to ``error``); later ones
    count like the rest. Pure but for ``cell``'s counters."""
    event = to_event(msg, cell.execution_id)
    if not isinstance(event, LateEvent):
        return []  # a status, a clear_output (it would hide what came before), the unknown
    if isinstance(event, ev.Error):
        event = trim_error(event, ERROR_MAX_BYTES)
        first, cell.late_error = not cell.late_error, True
        if first:
            cell.output_bytes += payload_size(event)
            return [event]
    if cell.truncated:
        return []
    kept: list[LateEvent] = []
    if isinstance(event, (ev.Display, ev.UpdateDisplay, ev.Result)):
        event, note = cap_images(event, config.max_image_bytes)
        if note is not None:
            kept.append(ev.Truncated(execution_id=cell.execution_id, limit_bytes=config.max_image_bytes, message=note))
    room = config.max_output_bytes - cell.output_bytes
    cell.output_bytes += payload_size(event)
    if cell.output_bytes <= config.max_output_bytes:
        return [*kept, event]
    cell.truncated = True
    if isinstance(event, ev.Stream) and room > 0:
        kept.append(event.model_copy(update={"text": event.text[:room]}))
    kept.append(
        ev.Truncated(
            execution_id=cell.execution_id,
            limit_bytes=config.max_output_bytes,
            message=f"output exceeded {config.max_output_bytes} bytes; the rest of this execution's "
            "output, sent after its end, was dropped",
        )
    )
    return kept


class LateHooks(Protocol):
    async def record_late(self, cell: EndedCell, events: Sequence[Published]) -> bool: ...


class LateOutput:
    """Keeps a session's late output: one task stores it and then sends it, in
    the order it came (`late_events` bounds it)."""

    def __init__(self, config: SessionConfig, ends: CellEnds, fanout: EventFanout, hooks: LateHooks) -> None:
        self.config = config
        self._ends = ends
        self._fanout = fanout
        self._hooks = hooks
        self._pending: collections.deque[tuple[EndedCell, LateEvent]] = collections.deque()
        self._task: asyncio.Task[None] | None = None

    def accept(self, cell: EndedCell, msg: dict[str, Any]) -> None:
        """One late iopub message of ``cell`` (the kernel link's reader; never waits)."""
        for event in late_events(cell, msg, self.config):
            if len(self._pending) >= MAX_PENDING:
                log.warning("execution %s: late output dropped, %d events wait already", cell.execution_id, MAX_PENDING)
                return
            self._pending.append((cell, event))
        if self._pending and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._keep(), name=f"late-output-{cell.execution_id}")

    async def drained(self) -> None:
        """Return once the late output accepted so far is stored and sent (or failed)."""
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    async def close(self, grace_s: float) -> None:
        """The session is over: what waits is stored and sent within ``grace_s``,
        then no more."""
        if self._task is not None:
            try:
                async with asyncio.timeout(grace_s):
                    await asyncio.wait({self._task})
            except TimeoutError:
                log.warning("late output still waiting after %gs was not stored", grace_s)
            await cancel_and_wait(self._task)
        self._pending.clear()

    async def _keep(self) -> None:
        while self._pending:
            cell = self._pending[0][0]
            try:
                # after its done (stored, then sent): the record it appends to exists
                async with asyncio.timeout(DONE_WAIT_S):
                    await asyncio.wait({cell.done})
            except TimeoutError:
                log.error("execution %s: its done never came; storing its late output anyway", cell.execution_id)
            events: list[LateEvent] = []
            while self._pending and self._pending[0][0] is cell:
                events.append(self._pending.popleft()[1])
            try:
                await self._store_then_send(cell, events)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("keeping the late output of execution %s failed", cell.execution_id)

    async def _store_then_send(self, cell: EndedCell, events: list[LateEvent]) -> None:
        async with self._ends.numbering() as seq:
            prepared = []
            for n, event in enumerate(events):
                late = ev.Late(seq=seq + n, execution_id=cell.execution_id, event=event)
                prepared.append(Published(seq + n, late, late.model_dump_json()))
            if not await self._hooks.record_late(cell, prepared):
                log.error("execution %s: %d late events were not stored", cell.execution_id, len(events))
            for pub in prepared:
                assert pub.event is not None
                self._fanout.publish(pub.event, pub)
