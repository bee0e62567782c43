"""SQLite's switch to WAL mode when another gateway holds the file's write lock."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from kernelgw.storage.engine import enable_wal


def test_the_switch_to_wal_waits_for_a_writer_instead_of_failing_at_once(tmp_path: Path) -> None:
    path = tmp_path / "kernelgw.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE t (x INTEGER)")
    writer.execute("BEGIN IMMEDIATE")  # what a gateway's schema upgrade holds
    writer.execute("INSERT INTO t VALUES (1)")

    with sqlite3.connect(path, timeout=5) as plain:  # the busy timeout alone does not help
        try:
            plain.execute("PRAGMA journal_mode=WAL")
            raised = None
        except sqlite3.OperationalError as exc:
            raised = str(exc)
    assert raised is not None and "locked" in raised

    release = threading.Timer(0.3, lambda: writer.execute("COMMIT"))
    release.start()
    enable_wal(path)
    release.join()
    writer.close()
    with sqlite3.connect(path) as check:
        assert check.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert check.execute("SELECT x FROM t").fetchall() == [(1,)]
