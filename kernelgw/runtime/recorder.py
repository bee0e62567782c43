"""What a session tells the outside world about its life: the seam for storage.

The session manager calls a `Recorder` (storage implements it) when sessions start
and end and after every execution. Calls happen off the event path: a client has
already received ``done`` when ``execution_finished`` runs, and a recorder that
fails is logged, never allowed to break the session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kernelgw.runtime.session import KernelSession, QueuedExecution


class Recorder(Protocol):
    async def session_started(self, session: KernelSession) -> None:
        """After the kernel answered for the first time."""
        ...

    async def execution_finished(self, session: KernelSession, execution: QueuedExecution) -> None:
        """After ``done`` was published; ``execution.published`` holds all its events."""
        ...

    async def session_ended(self, session: KernelSession, reason: str) -> None:
        """After the session was deleted or reaped (``reason`` says which)."""
        ...
