"""How much output one session's kernel may produce per second while others run.

`LoopShare` bounds what a flood costs the gateway's event loop. It does not
bound what it costs the machine: on a host of two cores, a print loop's
kernel takes a whole core, and its bystanders' `1+1` waited for the CPU even
when the gateway had them ready (their p95 doubled with the gateway bypassed
altogether). The kernel's own work is bounded only if it waits for its
reader: our Python kernel blocks once the gateway leaves its output unread
(``kernelgw_kernel.backpressure``: a small XPUB_NODROP queue, and print and
display wait for it), so reading slower is what slows it.

`OutputRate` is a token bucket of output bytes and messages: a session may take
`OutputRate.burst_s` worth at once (a 1 MB print, a chart or two are never held
back), then `bytes_per_s` and `messages_per_s` on average while another session
has had iopub messages within `SHARING_S`. Alone, it reads at full speed (nobody to
share the machine with). Its reader waits while the bucket refills; what it
leaves unread waits in the kernel, which waits too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kernelgw.runtime.loop_share import Readers

SHARING_S = 1.0
"""Another session whose output was read this recently is one to share with
(longer than `loop_share.ACTIVE_S`: the kernel's work outlasts a slice of the
loop). Longer would pace a flood more often with nobody left to protect: a
session's 10,000 displays take 100 s at the shared pace and under 10 s alone."""

FLOOD_BYTES_PER_S = 2 << 20
"""Output bytes per second one session's kernel may send while other sessions
have output too (`OutputRate`): about 20,000 lines of 100 characters a second,
more than anyone reads. A print loop of such lines takes about 6 us of the
kernel's CPU a line: at 4 MiB/s its kernel took 0.27 of a core and the
bystanders' p95 in bench_isolation was 1.24x their quiet one (goal 1.25x)."""
FLOOD_MESSAGES_PER_S = 100
"""Output messages per second, the same way: displays cost the kernel and the
gateway per message, whatever their size (IPython's ``display`` takes about a
millisecond of the kernel's CPU: a loop of them at 1,000 a second took 0.74 of
a core; at 200, 0.15 of a core, and the bystanders' p95 in bench_isolation was
1.28x their quiet one; at 100, 0.06 and 0.95x)."""
FLOOD_OUTPUT_BURST_S = 1.0
"""A second's worth of output at those rates may come at once (2 MiB or 100
messages): a cell's ordinary output is never held back."""
MAX_WAIT_S = 0.25
"""Longest sleep of one wait (`OutputRate.pace`) before it looks again (another
session may have gone quiet, or an interrupt come)."""

OUTPUTS = Readers()
"""The gateway process's sessions (when each one's output was last read)."""


@dataclass(eq=False)
class OutputRate:
    bytes_per_s: float
    messages_per_s: float
    burst_s: float
    """Seconds of output at the rates above that may be taken at once (the bucket's depth)."""
    readers: Readers = field(default=OUTPUTS)
    """The sessions to share with (the process's; a test gives its own)."""
    tokens: float = field(init=False)
    """Seconds of output allowed now; negative: owed."""
    refilled: float | None = field(default=None, init=False)
    waits: int = field(default=0, init=False)
    """Times the reader waited (measurements and tests)."""
    waited_s: float = field(default=0.0, init=False)
    """Seconds it waited in all."""

    def __post_init__(self) -> None:
        if self.bytes_per_s <= 0 or self.messages_per_s <= 0 or self.burst_s <= 0:
            raise ValueError("output rates and burst must be positive")
        self.tokens = self.burst_s

    def _refill(self, now: float) -> None:
        if self.refilled is not None:
            self.tokens = min(self.burst_s, self.tokens + (now - self.refilled))
        self.refilled = now

    def spent(self, size: int, messages: int, now: float) -> float:
        """The session's reader took ``size`` bytes holding ``messages`` output
        messages (`output_kinds.UNBOUNDED_OUTPUT`) at ``now`` (monotonic seconds): how long it
        should wait before reading more. Whatever it read, the session is one
        the others share with (a bystander's ``1+1`` is what pacing protects)."""
        self._refill(now)
        self.tokens -= max(size / self.bytes_per_s, messages / self.messages_per_s)
        self.readers.last_read[id(self)] = now
        return self.owed(now)

    def owed(self, now: float) -> float:
        """How long the reader should still wait (0: read on). Nothing is owed
        once nobody else has output: the debt is forgiven, not paid later."""
        self._refill(now)
        if self.tokens >= 0:
            return 0.0
        if not self.readers.others_active(id(self), now, SHARING_S):
            self.tokens = 0.0
            return 0.0
        return -self.tokens

    async def pace(
        self,
        size: int,
        messages: int,
        paced: Callable[[], bool],
        on_wait: Callable[[float], None],
        max_wait_s: float = MAX_WAIT_S,
    ) -> None:
        """The reader took ``size`` bytes with ``messages`` output messages (`spent`): wait
        what that owes, while ``paced()`` says the reader should, ``max_wait_s`` at
        most before asking again. ``on_wait`` is told each wait's seconds: the
        output was unread, not quiet, and its kernel waited too."""
        owed = self.spent(size, messages, time.perf_counter())
        while owed > 0 and paced():
            await asyncio.sleep(wait := min(owed, max_wait_s))
            self.waited(wait)
            on_wait(wait)
            owed = self.owed(time.perf_counter())

    def waited(self, seconds: float) -> None:
        self.waits += 1
        self.waited_s += seconds

    def close(self) -> None:
        """Its session's reader ended."""
        self.readers.last_read.pop(id(self), None)
