"""Warm kernels, started ahead of demand so creating a session is a hand-over.

One pool per profile (image, memory, CPUs). A pooled kernel is a fully started
session that has never run user code: its own container, connection directory
and HMAC key, limits applied. It is handed to exactly one session and never
returns to the pool; a replacement starts in the background, one at a time, so
refilling never competes hard with running sessions for the machine. Misses
raise the pool's target (up to ``max_size``); after ``shrink_after_s`` without
demand the target falls back to ``size`` and the extra kernels are stopped.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.session import KernelSession
from kernelgw.tasks import BackgroundTasks, cancel_and_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolProfile:
    image: str
    memory_mb: int
    cpus: float
    runtime: str = "runc"


class WarmPool:
    def __init__(
        self,
        profile: PoolProfile,
        start_kernel: Callable[[], Awaitable[KernelSession]],
        *,
        size: int,
        max_size: int,
        shrink_after_s: float,
        metrics: Metrics | None = None,
    ) -> None:
        self.profile = profile
        self._start_kernel = start_kernel
        self.size = size
        self.max_size = max(size, max_size)
        self.shrink_after_s = shrink_after_s
        self.metrics = metrics
        self.target = size
        self._ready: collections.deque[KernelSession] = collections.deque()
        self._wake = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._discarded = BackgroundTasks(f"pool {profile.image}")
        """Closing kernels that died while waiting: finished, not cancelled, on close."""
        self._last_demand = time.monotonic()
        self._created = time.monotonic()
        self._warmed = False
        self.failures = 0

    @property
    def ready(self) -> int:
        return len(self._ready)

    def start(self) -> None:
        self._filler = asyncio.create_task(self._fill_loop(), name=f"pool-{self.profile.image}")

    async def close(self) -> None:
        await cancel_and_wait(self._filler)
        await self._discarded.join()
        while self._ready:
            await self._ready.popleft().close()
        self._publish_size()

    def take(self) -> KernelSession | None:
        """A ready kernel, or None (a miss: the caller starts one cold)."""
        self._last_demand = time.monotonic()
        while self._ready:
            session = self._ready.popleft()
            if session.state == "idle":
                if self.metrics:
                    self.metrics.pool_hits.inc()
                self._publish_size()
                self._wake.set()
                return session
            self._discarded.spawn(session.close(), name=f"pool-discard-{session.id}")  # died while waiting
        if self.metrics:
            self.metrics.pool_misses.inc()
        if self.target < self.max_size:
            self.target += 1
        self._wake.set()
        return None

    def _publish_size(self) -> None:
        if self.metrics:
            self.metrics.pool_ready.set(len(self._ready))

    async def _fill_loop(self) -> None:
        while True:
            idle_for = time.monotonic() - self._last_demand
            if self.target > self.size and idle_for > self.shrink_after_s:
                self.target = self.size
            while len(self._ready) > self.target:
                await self._ready.pop().close()
                self._publish_size()
            if len(self._ready) < self.target:
                try:
                    session = await self._start_kernel()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.failures += 1
                    log.warning("warm pool could not start a kernel (%s); retrying", exc)
                    await asyncio.sleep(min(30.0, 2.0 ** min(self.failures, 5)))
                    continue
                self.failures = 0
                self._ready.append(session)
                self._publish_size()
                if not self._warmed:
                    log.info(
                        "warm pool %s: %d/%d kernels ready (%.1fs)",
                        self.profile.image,
                        len(self._ready),
                        self.target,
                        time.monotonic() - self._created,
                    )
                    self._warmed = len(self._ready) >= self.target
                continue
            self._wake.clear()
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that races with the event being set (CPython gh-86296),
            # and close() would then wait for the next timeout.
            try:
                async with asyncio.timeout(max(1.0, self.shrink_after_s / 4)):
                    await self._wake.wait()
            except TimeoutError:
                pass
