"""SQLite's write-ahead log, checkpointed beside the writer rather than in its commits.

By default SQLite copies the WAL back into the database file (a checkpoint)
inside the commit that takes the WAL past 1000 pages. The history writer's
commits are what answers wait for: a cell that printed 16 MiB made its own
commit, and every commit queued behind it, pay for copying 16 MiB more (a
16 MiB row took 65-87 ms to commit with the checkpoint in it, 23-35 ms
without). So the writer's connection does not checkpoint
(``wal_autocheckpoint=0``), and after every few MiB committed a passive
checkpoint runs on its own connection in its own thread: in WAL mode it does
not block the writer, and it leaves out what a reader still needs (the next
one takes it). Durability is the same: a commit is in the WAL when it returns.
"""

from __future__ import annotations

import concurrent.futures
import logging
import sqlite3
from pathlib import Path

log = logging.getLogger(__name__)

CHECKPOINT_AFTER_BYTES = 4 << 20
"""About SQLite's own default (1000 pages of 4 KiB)."""
PAGE = 4096


class WalCheckpointer:
    """Counts what the writer committed; checkpoints in its own thread when due."""

    def __init__(self, path: Path, after_bytes: int = CHECKPOINT_AFTER_BYTES) -> None:
        self.path = path
        self.after_bytes = after_bytes
        self.pending_bytes = 0
        self.checkpoints = 0
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="wal-checkpoint")
        self._running: concurrent.futures.Future[None] | None = None

    def committed(self, sizes: list[int]) -> None:
        """A commit of rows of about these sizes (bytes) returned; never waits."""
        self.pending_bytes += sum(max(size, PAGE) for size in sizes)
        if self.pending_bytes < self.after_bytes or (self._running is not None and not self._running.done()):
            return
        self.pending_bytes = 0
        self._running = self._thread.submit(self._checkpoint)

    def _checkpoint(self) -> None:
        try:
            # mode=rw: a deleted data directory is not made again here (the writer notices it)
            conn = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, timeout=30)
        except sqlite3.Error as exc:
            log.warning("history storage: cannot open %s to checkpoint its log: %s", self.path, exc)
            return
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            self.checkpoints += 1
        except sqlite3.Error as exc:
            log.warning("history storage: checkpointing %s failed: %s", self.path, exc)
        finally:
            conn.close()

    def wait(self) -> None:
        """Until the running checkpoint (if any) is over (blocking)."""
        if self._running is not None:
            concurrent.futures.wait([self._running])

    def close(self) -> None:
        self._thread.shutdown(wait=False)  # a running checkpoint ends on its own
