"""The gateway's drain: what SIGTERM starts before the process exits.

Draining refuses new sessions and executions (503, ``Retry-After``) and turns
``/readyz`` unready at once, while running cells go on streaming. Once no cell
is running (or the grace is over) the drain *closes*: each WebSocket sends what
it still holds, its cells' ``done`` among it, then closes with 1012 (service
restart: reconnect). `kernelgw serve` calls `Drain.run` from its signal handler
and stops the server after it.
"""

from __future__ import annotations

import asyncio
import logging
import time

from kernelgw.runtime.manager import SessionManager

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.05
"""How often a drain looks whether cells are still running."""


class Drain:
    """Not draining, draining (new work refused), closing (sockets end)."""

    def __init__(self) -> None:
        self.started_at: float | None = None
        self._closing = asyncio.Event()

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def begin(self) -> bool:
        """Refuse new work from now on; True the first time."""
        if self.started_at is not None:
            return False
        self.started_at = time.monotonic()
        return True

    def close(self) -> None:
        """End the WebSockets (after what they hold is sent)."""
        self.begin()
        self._closing.set()

    async def wait_closing(self) -> None:
        await self._closing.wait()

    async def run(self, manager: SessionManager, grace_s: float) -> bool:
        """Begin, wait up to ``grace_s`` for running and queued cells to end, close.

        True when every cell ended within the grace."""
        self.begin()
        busy = _busy(manager)
        log.warning("draining: %d cells running or queued, up to %gs for them to end", busy, grace_s)
        deadline = time.monotonic() + grace_s
        while busy and time.monotonic() < deadline:
            await asyncio.sleep(IDLE_POLL_S)
            busy = _busy(manager)
        if busy:
            log.error("draining: %d cells still running after the %gs grace", busy, grace_s)
        self.close()
        return busy == 0


def _busy(manager: SessionManager) -> int:
    return sum(session.queue_length for session in manager.list())
