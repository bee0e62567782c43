"""What a session tells the outside world about its life: the seam for storage.

The session manager calls a `Recorder` (storage implements it) when sessions start
and end and after every execution. Calls happen off the event path: a client has
already received ``done`` when ``execution_finished`` runs, and a recorder that
fails is logged, never allowed to break the session.

The recorder sees a session and an execution through the small read-only views
below, not the runtime's classes: storage depends on what it reads, and this
module on nothing that depends on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from kernelgw import events as ev
from kernelgw.runtime.backends.base import KernelSpec
from kernelgw.runtime.fanout import Published


class RecordedSession(Protocol):
    """What a recorder may read of a session."""

    @property
    def id(self) -> str: ...

    @property
    def owner(self) -> str | None: ...

    @property
    def spec(self) -> KernelSpec: ...

    @property
    def created_at(self) -> datetime: ...

    @property
    def kernel_info(self) -> dict[str, Any]: ...


class RecordedExecution(Protocol):
    """What a recorder may read of a finished execution."""

    @property
    def execution_id(self) -> str: ...

    @property
    def code(self) -> str: ...

    @property
    def done(self) -> asyncio.Future[ev.Done]: ...

    @property
    def published(self) -> Sequence[Published]: ...

    @property
    def output_bytes(self) -> int: ...


class Recorder(Protocol):
    async def session_started(self, session: RecordedSession) -> None:
        """After the kernel answered for the first time."""
        ...

    async def execution_finished(self, session: RecordedSession, execution: RecordedExecution) -> None:
        """After ``done`` was published; ``execution.published`` holds all its events."""
        ...

    async def session_ended(self, session: RecordedSession, reason: str) -> None:
        """After the session was deleted or reaped (``reason`` says which)."""
        ...
