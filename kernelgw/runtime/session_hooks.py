"""What a session's execution queue asks of the session around it.

`KernelSession` implements it and the queue's worker calls it: the queue
imports neither the session (which imports the queue) nor the store.
"""

from __future__ import annotations

from typing import Protocol

from kernelgw import events as ev
from kernelgw.runtime.cell_end import EndHooks
from kernelgw.runtime.execution import QueuedExecution


class SessionHooks(EndHooks, Protocol):
    """What the queue asks of the session around it (and, through `EndHooks`,
    what ending a cell asks: an audit log entry, its record)."""

    def touch(self) -> None: ...

    def execution_started(self, rec: QueuedExecution) -> None:
        """Record a cell as running (queued for the store; never waits)."""
        ...

    def execution_progress(self, rec: QueuedExecution) -> None:
        """Store a running cell's events so far (queued; never waits)."""
        ...

    async def restart_after_timeout(self) -> str | None:
        """Replace a kernel that ignored an interrupt; returns why it failed, if it did."""
        ...

    async def keep_files(self) -> None:
        """The session has files now: keep them past its kernel (logs, never raises)."""
        ...

    async def followed_ended(self, rec: QueuedExecution, done: ev.Done) -> None:
        """A cell a previous gateway left running ended (`ExecutionQueue.follow`):
        store ``done`` over its interim record (logs, never raises)."""
        ...

    async def restart_after_death(self) -> str | None:
        """Replace a kernel that died under a cell (``auto_replay``); returns why it failed, if it did."""
        ...
