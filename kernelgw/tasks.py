"""Ending background tasks without losing anything: cancellations or references.

``task.cancel(); try: await task except BaseException: pass`` also swallowed the
*caller's* cancellation when it arrived during the wait, so a shutdown could
stall on a coroutine that was told to stop. `cancel_and_wait` never catches
the caller's cancellation. `BackgroundTasks` keeps a reference to every
fire-and-forget task (the event loop keeps only a weak one) until it ends, and
ends the rest on shutdown. `TurnTaker` lets other tasks run in loops whose awaits need not suspend.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel the tasks and wait until all have ended, however they end.

    How a task ended is not the caller's business (its exceptions are logged,
    its own cancellation is expected). The wait is ``asyncio.wait``, which never
    raises what the tasks raised: a CancelledError out of this coroutine is the
    caller's own, and propagates at once."""
    pending = {task for task in tasks if task is not None}
    if not pending:
        return
    for task in pending:
        task.cancel()
    await asyncio.wait(pending)
    for task in pending:
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.debug("a cancelled task had failed: %r", exc)


class BackgroundTasks:
    """Tasks started and not awaited by the code that started them.

    Each is referenced until it ends (an unreferenced task may be garbage
    collected mid-flight); a task that fails is logged, not left for
    "exception was never retrieved"."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s: background task %s failed", self.name, task.get_name(), exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def join(self) -> None:
        """Wait for every task, including any started meanwhile (for work that
        must finish, such as closing a session)."""
        while pending := {task for task in self._tasks if not task.done()}:
            await asyncio.wait(pending)

    async def cancel(self) -> None:
        """Cancel every task and wait until all have ended."""
        while pending := {task for task in self._tasks if not task.done()}:
            await cancel_and_wait(*pending)


class TurnTaker:
    """Lets the event loop's other work run every ``every`` steps of a loop whose
    awaits need not suspend: taking from a queue that holds items, or sending on
    a socket that is writable. A WebSocket client catching up on thousands of
    queued events would otherwise hold the loop until it had them all."""

    def __init__(self, every: int = 32) -> None:
        self.every = every
        self._steps = 0

    async def step(self) -> None:
        self._steps += 1
        if self._steps % self.every == 0:
            await asyncio.sleep(0)
