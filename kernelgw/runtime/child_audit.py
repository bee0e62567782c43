"""The recorder of a child session (an E2B context): audited, not stored.

A child is no session of the store: it is neither listed nor reattached, and
ends with its parent's kernel or with the gateway process. Its cells and its
kernel's deaths and restarts still reach the audit log, under its parent's id
(the sandbox is the unit, as for limits) and its owner's key, the context
named in the detail, when the parent's recorder audits (the store does:
``child_execution``, ``session_event``). Its cells are not in the sandbox's
history (`/v1/sessions/{id}/history` is its own kernel's).
"""

from __future__ import annotations

from collections.abc import Sequence

from kernelgw import events as ev
from kernelgw.runtime.fanout import Published
from kernelgw.runtime.recorder import RecordedExecution, RecordedSession, Recorder, StoredSession


class ChildAudit:
    """A `Recorder` for one child session: audits through ``recorder`` under ``parent``."""

    def __init__(self, recorder: Recorder, parent: RecordedSession) -> None:
        self._recorder = recorder
        self._parent = parent

    async def session_started(self, session: RecordedSession) -> None:
        return None

    def execution_started(self, session: RecordedSession, execution: RecordedExecution) -> None:
        return None

    def execution_progress(self, session: RecordedSession, execution: RecordedExecution) -> None:
        return None  # no chunk is taken: the cell's output stays with it (capped by max_output_bytes)

    async def execution_finished(
        self, session: RecordedSession, execution: RecordedExecution, done: Published | None = None
    ) -> None:
        hook = getattr(self._recorder, "child_execution", None)
        if hook is None:
            return
        end = done.event if done is not None else execution.done.result() if execution.done.done() else None
        if isinstance(end, ev.Done):
            hook(self._parent, session.id, execution, end)

    async def execution_late(
        self, session: RecordedSession, execution_id: str, events: Sequence[Published], part: int, error: bool
    ) -> None:
        return None

    async def execution_followed(
        self, session: RecordedSession, execution_id: str, done: ev.Done, interim_reason: str
    ) -> None:
        return None

    async def session_ended(self, session: RecordedSession, reason: str) -> None:
        return None

    def kernel_changed(self, session: RecordedSession) -> None:
        return None

    async def lease_changed(self, session: RecordedSession) -> None:
        return None

    async def open_sessions(self, replay_bytes: int = 0) -> list[StoredSession]:
        return []

    async def flush(self) -> None:
        return None

    async def session_lost(self, session_id: str, reason: str) -> None:
        return None

    def session_event(self, session: RecordedSession, kind: str, detail: str) -> None:
        """A child kernel died or was restarted: audited as its parent's, naming it."""
        hook = getattr(self._recorder, "session_event", None)
        if hook is not None:
            hook(self._parent, kind, f"context {session.id}: {detail}")
