"""What the store gives back: plain frozen records, no database types."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kernelgw.events import EVENT_LIST_ADAPTER, Event


def as_utc(value: datetime) -> datetime:
    """SQLite gives back naive datetimes; everything stored is UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def stored_metadata(text: str | None) -> dict[str, str]:
    """A session row's ``session_metadata`` back (empty when none, or unreadable)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


@dataclass(frozen=True)
class SessionRecord:
    id: str
    gateway_name: str
    image: str
    created_at: datetime
    ended_at: datetime | None = None
    end_reason: str | None = None
    """``deleted``, ``reaped``, ``gateway shutdown``, ... (None while it runs)."""
    language_info: dict[str, Any] = field(default_factory=dict)
    """From the kernel's ``kernel_info_reply`` (name, version, mimetype, ...)."""
    owner: str | None = None
    """The id of the API key that created the session (None without authentication)."""
    kernel: str = "python3"
    """The kernel's name (``kernelgw.kernels``): the notebook's kernelspec."""
    metadata: dict[str, str] = field(default_factory=dict)
    """The labels a face gave the session (E2B's metadata)."""


@dataclass(frozen=True)
class ExecutionRecord:
    session_id: str
    position: int
    """0, 1, 2, ... in the order the session ran its executions."""
    execution_id: str
    seq: int
    """The session ``seq`` of the execution's ``queued`` event: orders executions
    and notes on one axis."""
    code: str
    status: str
    """The ``done`` status: ok, error, timeout, interrupted or dead."""
    execution_count: int | None
    started_at: datetime
    duration_ms: float
    reason: str | None
    state_lost: bool
    events_json: str
    """Every event of the execution, in order, as one JSON array (the texts that
    were sent to clients, spliced, never re-encoded)."""
    kernel_id: str | None = None
    """The kernel it ran in (None for rows stored before recovery by replay)."""
    replay_of: str | None = None
    """Set for a replayed execution: the execution it re-ran."""
    replayable: bool = True
    """False: its client marked it not to be replayed."""
    client_session: str | None = None
    """A Jupyter client's cell: the ``session_id`` of the connection that sent it."""
    client_header: dict[str, Any] | None = None
    """A Jupyter client's cell: its ``execute_request``'s header."""
    client_answered: bool = False
    """Its answer reached an open connection of the client."""

    @property
    def events(self) -> list[Event]:
        return EVENT_LIST_ADAPTER.validate_json(self.events_json)


@dataclass(frozen=True)
class NoteRecord:
    session_id: str
    after_seq: int
    """The session's last ``seq`` when the note was added: the note follows every
    execution queued before it (also one still running) and precedes later ones."""
    markdown: str
    created_at: datetime
