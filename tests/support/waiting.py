"""Waiting on an observable condition with a deadline, instead of sleeping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30, interval: float = 0.02) -> None:
    """Return once ``condition()`` holds; fail saying ``what`` was awaited if it
    does not within ``timeout`` seconds. ``interval`` only paces the polling."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        time.sleep(interval)


async def until(
    condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 30, interval: float = 0.02
) -> None:
    """`wait_until` for a condition that must be awaited (an HTTP poll), on the loop."""
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        await asyncio.sleep(interval)
