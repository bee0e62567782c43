"""What a session's parts share about the kernel: its state and the gateway's counters.

One mutable record, held by the session façade and its execution queue, so the
state a client reads is the state the queue acts on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SessionState = Literal["starting", "idle", "busy", "dead", "paused", "closed"]


@dataclass
class SessionStatus:
    state: SessionState = "starting"
    dead_reason: str | None = None
    execution_count: int = 0
    """The count of the last cell, by the gateway's own counting (0 after a restart)."""
    count_unknown: bool = False
    """Reattached after a crash: a cell cut off then may or may not have been
    counted by the kernel, so the next reply's count is taken once as the base."""
