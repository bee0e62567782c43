"""How much of the event loop one session's output may take.

Every session's kernel messages are read and decoded on the gateway's one event
loop. A session that floods (a print loop, ten thousand displays) would take
as much of it as the kernel can produce, and every other session's `1+1` would
wait behind its slices. A token bucket of loop time bounds that: a session
may spend `LoopShare.burst_s` at once (a cell's ordinary output is never
held back), then `LoopShare.share` of the time on average, while another
session's output has been read within `ACTIVE_S`. Alone, it takes the whole
loop (the share costs nothing when there is nobody to share with). Its reader
waits while the bucket refills; the messages wait in ZMQ's queue meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ACTIVE_S = 0.1
"""A session whose output was read this recently counts as one to share with."""
MAX_WAIT_S = 0.1
"""Longest one wait: a reader that waited long would make its kernel's iopub
look quiet (a lost idle is presumed after 1 s of it), and the share is a bound
on floods, which send again at once, not a penalty."""


class Readers:
    """When each session's output was last read (one event loop: no lock)."""

    def __init__(self) -> None:
        self.last_read: dict[int, float] = {}

    def others_active(self, me: int, now: float, within_s: float = ACTIVE_S) -> bool:
        return any(at >= now - within_s for key, at in self.last_read.items() if key != me)


READERS = Readers()
"""The gateway process's sessions."""


@dataclass(eq=False)
class LoopShare:
    share: float
    """The long-run share of the loop, 0 < share <= 1."""
    burst_s: float
    """Loop time that may be spent at once (the bucket's depth)."""
    readers: Readers = field(default=READERS)
    """The sessions to share with (the process's; a test gives its own)."""
    tokens: float = field(init=False)
    refilled: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1], not {self.share}")
        self.tokens = self.burst_s

    def spent(self, cost: float, now: float) -> float:
        """The session's output took ``cost`` seconds of the loop's CPU, up to
        ``now`` (monotonic seconds): how long to wait before taking it again
        (0: no wait; at most `MAX_WAIT_S`)."""
        if self.refilled is not None:
            self.tokens = min(self.burst_s, self.tokens + (now - self.refilled) * self.share)
        self.refilled = now
        self.tokens -= cost
        self.readers.last_read[id(self)] = now
        if self.tokens >= 0:
            return 0.0
        if not self.readers.others_active(id(self), now):
            self.tokens = 0.0  # nobody waited: no debt to pay once somebody does
            return 0.0
        return min(MAX_WAIT_S, -self.tokens / self.share)

    def close(self) -> None:
        """Its session's reader ended."""
        self.readers.last_read.pop(id(self), None)
