"""How much of a running cell's output the store has been handed and not committed.

A cell's output is stored in chunks (`kernelgw.runtime.recorder.CHUNK_BYTES`)
by the history writer, and its events stay in the gateway's memory until their
chunk commits. A kernel can print faster than the writer commits (a 50 MB line
arrives at about 100 MB/s), so the session's iopub reader waits
(`OutputBacklog.room`) while more than `BACKLOG_BYTES` of the running cell's
chunks are uncommitted; the wait also gives the writer the loop's turns.

What the reader leaves unread waits in ZMQ: in our receive queue up to its
HWM, then in the kernel's send queue. The Python kernel's iopub is read with a
small receive HWM (`kernel_connection.IOPUB_RECEIVE_HWM`), so the backlog waits in
the kernel: its iopub never drops, and past a small queue the cell's print or
display waits for the gateway (``kernelgw_kernel.backpressure``).

The wait never outlasts a writer that makes no progress: after `STALL_S`
without a commit (a store that cannot write holds rows back and retries) the
cell's output is no longer held back, as before the bound existed; nor an
interrupt or a timeout, whose answer comes behind the output (`unbound`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kernelgw.runtime.fanout import Published

log = logging.getLogger(__name__)

BACKLOG_BYTES = 4 << 20
"""Event JSON handed to the store and not yet committed past which the reader
waits: 16 chunks, eight of the writer's transactions (`COMMIT_BYTES`), so the
writer never runs dry while the reader waits, and the gateway holds little."""
STALL_S = 2.0
"""A wait with no commit for this long means the store is not writing (a fault
it retries every second): the rest of the cell's output is no longer held back."""


@dataclass
class OutputBacklog:
    """One session's uncommitted output chunks (one cell runs at a time)."""

    limit: int = BACKLOG_BYTES
    stall_s: float = STALL_S
    uncommitted: int = 0
    """Bytes of the chunks handed to the store and not committed."""
    peak: int = 0
    """The most ``uncommitted`` held while the running cell ran (for tests and measurements)."""
    waits: int = 0
    """How many times the reader waited for the running cell (measurements)."""
    waiting: bool = False
    """The reader is waiting: its kernel's iopub is not quiet, only unread."""
    _chunks: dict[int, int] = field(default_factory=dict)
    """Chunk bytes by the number of the chunk's first event."""
    unbounded: str | None = None
    """Why the running cell's output is no longer held back (the store stalled, an
    interrupt, a timeout), None while it is."""
    _execution: str | None = None
    _progress: asyncio.Event = field(default_factory=asyncio.Event)

    def begin(self, execution_id: str) -> None:
        """A new cell: nothing of the last one is counted (its chunks are its end's business)."""
        self._execution = execution_id
        self._chunks.clear()
        self.uncommitted = self.peak = self.waits = 0
        self.unbounded = None
        self._progress.set()

    def end(self) -> None:
        """The cell is over: a waiting reader goes on (its end row waits for the chunks)."""
        self._execution = None
        self._chunks.clear()
        self.uncommitted = 0
        self._progress.set()

    def unbound(self, why: str) -> None:
        """Stop holding the running cell's output back (an interrupt, a timeout, a stalled store)."""
        if self.unbounded is None and self._execution is not None:
            log.info("execution %s: its output is no longer held back for the store (%s)", self._execution, why)
            self.unbounded = why
        self._progress.set()

    def taken(self, execution_id: str, first: int, events: Sequence[Published]) -> None:
        """The store took ``events`` (numbered from ``first``) as a chunk of the running cell."""
        if execution_id != self._execution or not events:
            return
        size = sum(len(p.json) for p in events)
        self._chunks[first] = size
        self.uncommitted += size
        self.peak = max(self.peak, self.uncommitted)

    def committed(self, execution_id: str, first: int) -> None:
        """The chunk from event ``first`` is committed."""
        if execution_id != self._execution:
            return
        size = self._chunks.pop(first, 0)
        self.uncommitted -= size
        self._progress.set()

    @property
    def over(self) -> bool:
        return self.uncommitted > self.limit and self.unbounded is None and self._execution is not None

    async def room(self) -> None:
        """Return once the reader may read on: the backlog is under the limit, the
        cell is over or no longer bounded, or the store made no progress for `stall_s`."""
        if not self.over:
            return
        self.waits += 1
        self.waiting = True
        try:
            last = time.monotonic()
            while self.over:
                self._progress.clear()
                try:
                    async with asyncio.timeout(max(0.0, last + self.stall_s - time.monotonic())):
                        await self._progress.wait()
                    last = time.monotonic()
                except TimeoutError:
                    self.unbound(f"the store committed nothing for {self.stall_s:g}s")
        finally:
            self.waiting = False
