"""Whether the history store can write, and whether its SQLite file is still the one it opened.

The writer reports every commit here (`WriteHealth.succeeded` / `failed`); the
gateway refuses new sessions and executions while the store is faulted, since
what it would answer could not be recorded, and admits them again on its own
once a queued row commits. `FileIdentity` catches a data directory or file
that was deleted or replaced under a running gateway: SQLite keeps writing
into the open (deleted) inode and every commit "succeeds" into nowhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path


class DatabaseFileReplaced(Exception):
    """The SQLite file at the store's path is gone or is another file than the one opened."""


@dataclass(frozen=True)
class StorageFault:
    """Why the store cannot write, and since when (the first failure of a run of them)."""

    error: str
    since: datetime


class WriteHealth:
    """The outcome of the writer's latest commit: ok, or the fault that stops it."""

    def __init__(self) -> None:
        self.fault: StorageFault | None = None
        self.last_fault: StorageFault | None = None
        """The latest fault, kept after recovery (for the operator and for tests)."""
        self.recovered_at: datetime | None = None
        self.failures = 0

    @property
    def ok(self) -> bool:
        return self.fault is None

    def failed(self, error: str) -> bool:
        """Record a failed commit; True when this starts a fault (the store was healthy)."""
        self.failures += 1
        if self.fault is None:
            self.fault = StorageFault(error=error, since=datetime.now(UTC))
            self.last_fault = self.fault
            return True
        self.fault = StorageFault(error=error, since=self.fault.since)
        self.last_fault = self.fault
        return False

    def succeeded(self) -> bool:
        """Record a commit that worked; True when this ends a fault."""
        if self.fault is None:
            return False
        self.fault = None
        self.recovered_at = datetime.now(UTC)
        return True

    def describe(self) -> str:
        """One line for ``/healthz`` and error messages."""
        if self.fault is None:
            return "writable"
        return f"cannot write since {self.fault.since.isoformat(timespec='seconds')}: {self.fault.error}"


@dataclass(frozen=True)
class FileIdentity:
    """A file's (device, inode): equal while the path names the file that was opened."""

    device: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity | None:
        """The identity of the file at ``path`` now, or None when there is none (blocking: a stat)."""
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        return cls(device=st.st_dev, inode=st.st_ino)

    def check(self, path: Path) -> None:
        """Raise `DatabaseFileReplaced` unless ``path`` still names this file."""
        now = FileIdentity.of(path)
        if now is None:
            raise DatabaseFileReplaced(f"the database file {path} was deleted (or its directory)")
        if now != self:
            raise DatabaseFileReplaced(f"the database file {path} was replaced by another file")
