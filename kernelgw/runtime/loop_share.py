"""How much of the event loop one session's output may take.

Every session's kernel messages are read and decoded on the gateway's one event
loop. A session that floods (a print loop, ten thousand displays) would take
as much of it as the kernel can produce, and every other session's `1+1` would
wait behind its slices. A token bucket of loop time bounds that: a session
may spend `LoopShare.burst_s` at once (a cell's ordinary output is never
held back), then `LoopShare.share` of the time on average. Its reader waits
while the bucket refills; the messages wait in ZMQ's queue meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoopShare:
    share: float
    """The long-run share of the loop, 0 < share <= 1."""
    burst_s: float
    """Loop time that may be spent at once (the bucket's depth)."""
    tokens: float = -1.0
    refilled: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1], not {self.share}")
        if self.tokens < 0:
            self.tokens = self.burst_s

    def spent(self, started: float, now: float) -> float:
        """The loop was taken from ``started`` to ``now`` (monotonic seconds):
        how long to wait before taking it again (0: no wait)."""
        if self.refilled is not None:
            self.tokens = min(self.burst_s, self.tokens + (now - self.refilled) * self.share)
        self.refilled = now
        self.tokens -= now - started
        return -self.tokens / self.share if self.tokens < 0 else 0.0
