"""Memory back to the system after large outputs.

A kernel's output passes through the gateway as ZMQ messages, decoded strings
and serialised events, each freed once sent and stored. glibc's malloc keeps
what was freed in its heaps for reuse: after five cells of 50 MB each the
gateway held 120-170 MB more than when idle, none of it live (tracemalloc
found 90 MB of Python objects in all, most of it imported modules), and
``malloc_trim(0)`` gave it back (286 -> 161 MB). So after a burst of output is
over the gateway trims once, in a thread: the event loop never waits on it.

Only glibc has ``malloc_trim``; elsewhere this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_AFTER_BYTES = 16 << 20
"""Kernel output read since the last trim that makes the next one worth it."""
CALM_BYTES = 1 << 20
"""A burst is over when less than this was read within one `POLL_S`."""
POLL_S = 1.0
SETTLE_POLLS = 3
"""Polls after a trim when it is done once more: the cell's history row is
written (and its copies freed) just after its output ends."""


class _Received:
    """Bytes read from all kernels' sockets: a counter, not a lock (one event loop)."""

    total = 0


received = _Received()


def note_received(size: int) -> None:
    received.total += size


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class AllocatorTrimmer:
    """Trims once after each burst of kernel output (`TRIM_AFTER_BYTES`, then calm)."""

    def __init__(self, trim: Callable[[int], int] | None = None, poll_s: float = POLL_S) -> None:
        self._trim = trim if trim is not None else _load_malloc_trim()
        self._poll_s = poll_s
        self._trimmed_at = self._seen = received.total
        self._settle_in = 0
        self.trims = 0

    async def run(self) -> None:
        if self._trim is None:
            return
        while True:
            await asyncio.sleep(self._poll_s)
            await self.check()

    async def check(self) -> bool:
        """One poll: trim if a burst worth it is over; True when it trimmed."""
        now = received.total
        burst_over = now - self._seen < CALM_BYTES
        self._seen = now
        settle = False
        if self._settle_in:
            self._settle_in -= 1
            settle = self._settle_in == 0
        if self._trim is None or not burst_over:
            return False
        if now - self._trimmed_at >= TRIM_AFTER_BYTES:
            self._settle_in = SETTLE_POLLS
        elif not settle:
            return False
        self._trimmed_at = now
        # ctypes lets go of the GIL for the call: the loop runs meanwhile
        await asyncio.to_thread(self._trim, 0)
        self.trims += 1
        log.debug("gave freed memory back to the system after %d MB of kernel output", now >> 20)
        return True
