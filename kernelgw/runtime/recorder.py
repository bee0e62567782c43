"""What a session tells the outside world about its life: the seam for storage.

The session manager calls a `Recorder` (storage implements it) when sessions start
and end, and when every execution starts and ends. ``execution_finished`` is on
the answer's path on purpose: ``done`` is published after it returns, so a cell
acknowledged to a client is stored. A recorder that fails is logged and the
``done`` says the record was not stored; it never breaks the session.

The recorder sees a session and an execution through the small read-only views
below, not the runtime's classes: storage depends on what it reads, and this
module on nothing that depends on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from kernelgw import events as ev
from kernelgw.runtime.backends.base import KernelHandle, KernelSpec
from kernelgw.runtime.fanout import Published
from kernelgw.runtime.lineage import LineageCell
from kernelgw.runtime.session_config import SessionConfig

CHUNK_BYTES = 256 << 10
"""Once a running cell's output not yet handed to the store reaches this (JSON
bytes), it is queued as the next chunk at once: no write of a cell's output
holds much more, and the gateway lets a chunk's events go once it is committed."""
TAIL_BYTES = 16 << 10
"""At a checkpoint, output not yet stored up to this rewrites the running row's
tail; more is stored as a chunk (small cells keep all their events in their row)."""


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

    @property
    def handle(self) -> KernelHandle | None: ...

    @property
    def paused_from(self) -> KernelHandle | None: ...

    @property
    def lineage_kernels(self) -> tuple[str, ...]: ...

    @property
    def config(self) -> SessionConfig: ...

    @property
    def execution_count(self) -> int: ...

    @property
    def last_seq(self) -> int: ...

    @property
    def resume_seq(self) -> int:
        """Where a successor gateway's event numbering must continue."""
        ...

    @property
    def following(self) -> FollowedCell | None:
        """A cell left running in the kernel for the next gateway to follow (`FollowedCell`)."""
        ...

    @property
    def metadata(self) -> dict[str, str]:
        """Free labels kept with the session (`kernelgw.runtime.lease`)."""
        ...

    @property
    def lease_until(self) -> datetime | None:
        """When its lease runs out (UTC); None: no lease runs."""
        ...

    @property
    def on_lease_end(self) -> str:
        """``end`` or ``pause``."""
        ...

    @property
    def access_sha256(self) -> str | None:
        """The sha256 of its access token (never the token)."""
        ...


@dataclass(frozen=True)
class FollowedCell:
    """A cell a gateway left running in a kept kernel (``on_shutdown=keep``): what
    the next gateway of the name needs to follow it to its end and complete its
    record (`kernelgw.runtime.execution_queue.ExecutionQueue.follow`)."""

    execution_id: str
    msg_id: str
    """Its ``execute_request``'s msg_id: what the kernel's messages for it name as parent."""
    nonce: str
    """Its end-of-cell nonce (`kernelgw.runtime.execution.answers`): tells its real reply."""
    timeout_s: float
    """Its whole timeout; the follower enforces what remains of it."""
    sent_at: float
    """When the kernel was sent it (Unix time): its duration and remaining timeout count from here."""
    output_bytes: int = 0
    """Its output so far, counted against its cap (late output included)."""
    truncated: bool = False
    late_parts: int = 0
    """Batches of output already appended to its record after its interim end."""


@dataclass(frozen=True)
class StoredCell:
    """One stored execution of an open session, as a successor replays it."""

    execution_id: str
    events: Sequence[ev.Event]
    cut_off: bool
    """Its gateway died while it ran: stored without its ``done``."""


@dataclass(frozen=True)
class StoredSession:
    """An open session as a previous gateway process stored it: everything needed
    to reach its kernel again (the handle holds the kernel's HMAC key)."""

    session_id: str
    owner: str | None
    created_at: datetime
    handle: KernelHandle
    spec: KernelSpec
    exec_timeout_s: float
    execution_count: int
    last_seq: int
    """The stored reservation: numbering continues after it."""
    cells: Sequence[StoredCell] = ()
    """The latest stored executions, oldest first (to refill the replay buffer)."""
    lineage: Sequence[LineageCell] = ()
    """The cells that built the kernel's state (what a replay runs again)."""
    auto_replay: bool = False
    paused: bool = False
    """Paused: no container to reach; its state is in the gateway's snapshot directory."""
    lineage_kernels: tuple[str, ...] = ()
    """The kernels whose stored cells make the lineage (empty: the handle's alone)."""
    following: FollowedCell | None = None
    """A cell the previous gateway left running in the kernel, to follow to its end."""
    metadata: dict[str, str] = field(default_factory=dict)
    lease_until: datetime | None = None
    """When its lease runs out (UTC; None: no lease ran). Passed already: ended at once."""
    on_lease_end: str = "end"
    access_sha256: str | None = None


@dataclass(frozen=True)
class ClientOrigin:
    """A Jupyter client's cell, as its row keeps it for the client's return."""

    session: str
    """The ``session_id`` the client's channels connection gave."""
    header: dict[str, Any]
    """The ``execute_request``'s header: the parent of what the cell sends."""
    answered: bool = False
    """Its answer (reply and idle) went to an open connection of the client."""


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

    @property
    def kernel_id(self) -> str | None:
        """The kernel it ran in (None: it never reached one)."""
        ...

    @property
    def replay_of(self) -> str | None:
        """For a replayed execution: the execution it re-ran."""
        ...

    @property
    def replayable(self) -> bool:
        """False: marked not to be replayed."""
        ...

    @property
    def origin(self) -> ClientOrigin | None:
        """The Jupyter client that sent it (None: a /v1 cell, or no ``session_id``)."""
        ...

    @property
    def stored_events(self) -> int:
        """How many of ``published`` (from its start) are queued as chunks: the
        row holds the events after them."""
        ...

    @property
    def last_error(self) -> ev.Error | None: ...

    # The two calls by which a recorder takes a running cell's output in chunks
    # and lets the execution forget what is committed (the only writes it makes).
    def take_chunk(self) -> tuple[int, list[Published]]:
        """The events not yet in chunks, as the next chunk, with the number of the first."""
        ...

    def release(self, first: int, count: int) -> None:
        """The chunk of events ``first`` to ``first + count`` is committed."""
        ...


class Recorder(Protocol):
    async def session_started(self, session: RecordedSession) -> None:
        """After the kernel answered for the first time."""
        ...

    def execution_started(self, session: RecordedSession, execution: RecordedExecution) -> None:
        """When the kernel is sent the cell: record it as running. Queue it, never
        wait; a later `execution_finished` of the same execution completes it."""
        ...

    def execution_progress(self, session: RecordedSession, execution: RecordedExecution) -> None:
        """A running cell has events not yet stored (at a state poll, or `CHUNK_BYTES`
        of them): store them as a chunk (`take_chunk`) or in its running row, so a
        gateway crash keeps them. Queue, never wait."""
        ...

    async def execution_finished(
        self, session: RecordedSession, execution: RecordedExecution, done: Published | None = None
    ) -> None:
        """When the execution ended: return once its record is committed, raise when
        it cannot be, and only once every chunk of it is committed too. ``done``:
        its end, not yet published (``execution.published`` holds the events
        before it, after those released); None: ``done`` was published already
        and is the last of ``execution.published``."""
        ...

    async def execution_late(
        self, session: RecordedSession, execution_id: str, events: Sequence[Published], part: int, error: bool
    ) -> None:
        """Output the kernel sent for an ended execution (`kernelgw.runtime.late_output`),
        its ``part``-th batch, numbered and not yet published: append it to the
        execution's record, after its ``done`` (``error``: an error came late, its
        status is ``error`` now), and return once committed; raise when it cannot be."""
        ...

    async def execution_followed(
        self, session: RecordedSession, execution_id: str, done: ev.Done, interim_reason: str
    ) -> None:
        """A cell a previous gateway left running (`FollowedCell`) ended: its record's
        interim end (``dead`` with ``interim_reason``; any other record is left as it
        is) is replaced by ``done``'s status, execution count, duration and reason;
        return once committed (after any late output queued before), raise when it
        cannot be."""
        ...

    async def session_ended(self, session: RecordedSession, reason: str) -> None:
        """After the session was deleted or reaped (``reason`` says which)."""
        ...

    def kernel_changed(self, session: RecordedSession) -> None:
        """The session's kernel, execution count or last seq changed (a restart,
        a graceful shutdown that keeps the kernel, a pause, which stops the
        lease): store what reattach needs."""
        ...

    async def lease_changed(self, session: RecordedSession) -> None:
        """The session's lease was set or extended (`SessionManager.set_lease`): store
        ``lease_until`` and ``on_lease_end``; return once committed, raise when it
        cannot be (the caller's answer says so)."""
        ...

    async def open_sessions(self, replay_bytes: int = 0) -> list[StoredSession]:
        """At start-up: this gateway name's open sessions that can be reattached,
        each with its latest cells (up to ``replay_bytes`` of events). Open
        sessions stored without a kernel to reach are ended here."""
        ...

    async def flush(self) -> None:
        """Return once every write queued so far is committed (reattachment
        waits for the sessions' new reservations before serving)."""
        ...

    async def session_lost(self, session_id: str, reason: str) -> None:
        """At start-up: an open session whose kernel could not be reattached is over."""
        ...
