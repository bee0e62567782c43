"""The answer journal (kernelgw/storage/journal.py): a small cell's end row is
answered once it is in the journal, before its commit, and a gateway killed
before the commit loses nothing it answered. The kill is a real SIGKILL of a
real process whose writer is stuck in its commit; the database is a real SQLite
file."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelgw.storage.journal import DIRECTORY, MAX_RECORD_BYTES, ROTATE_BYTES, Journal, read_segments, segments
from kernelgw.storage.store import DB_FILE, Store
from tests.support.stand_ins import finished_execution, stand_in_session

ROW = {"session_id": "s", "position": 1, "execution_id": "e", "code": "print('ü')"}
EVENTS = '[{"type":"stream","text":"ünïcode ✓\\n"},{"type":"done","status":"ok"}]'


def test_a_record_reads_back_as_written_and_a_committed_segment_is_emptied(tmp_path: Path) -> None:
    journal = Journal(tmp_path / DIRECTORY, "gw")
    first, second = journal.append(ROW, EVENTS), journal.append({**ROW, "position": 2}, "[]")
    assert first is not None and second is not None
    records, paths = read_segments(tmp_path / DIRECTORY, "gw")
    assert [r.row["position"] for r in records] == [1, 2]
    assert records[0].row == ROW and records[0].events == EVENTS  # the events as written, not re-encoded
    first()
    assert paths[0].stat().st_size > 0  # one row in it is not committed yet
    second()
    assert paths[0].stat().st_size == 0
    assert read_segments(tmp_path / DIRECTORY, "other") == ([], [])  # another gateway's name


def test_a_full_segment_gets_a_successor_and_goes_once_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kernelgw.storage.journal.ROTATE_BYTES", 100)
    assert ROTATE_BYTES > 100
    journal = Journal(tmp_path / DIRECTORY, "gw")
    releases = [journal.append({**ROW, "position": i}, EVENTS) for i in range(3)]
    on_disk = [n for n, _ in segments(tmp_path / DIRECTORY, "gw")]
    assert on_disk == [1, 2, 3]
    for release in releases[:2]:
        assert release is not None
        release()
    assert [n for n, _ in segments(tmp_path / DIRECTORY, "gw")] == [3]
    # a new journal of the same name (the next gateway) writes past what is on disk
    assert Journal(tmp_path / DIRECTORY, "gw").append(ROW, "[]") is not None
    assert [n for n, _ in segments(tmp_path / DIRECTORY, "gw")] == [3, 4]


def test_what_cannot_be_journalled_is_refused_so_the_answer_waits_for_the_commit(tmp_path: Path) -> None:
    directory = tmp_path / "data" / DIRECTORY
    (tmp_path / "data").mkdir()
    journal = Journal(directory, "gw")
    assert journal.append(ROW, "[" + '"x",' * (MAX_RECORD_BYTES // 4) + '"x"]') is None  # too large
    assert journal.append(ROW, EVENTS) is not None
    (directory / "gw.1.jsonl").unlink()  # the data directory was deleted under it
    assert journal.append(ROW, EVENTS) is None
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
    (tmp_path / "data").rmdir()
    assert journal.append(ROW, EVENTS) is None  # its parent is not the journal's to make
    (tmp_path / "data").mkdir()  # made again (by the writer)
    assert journal.append(ROW, EVENTS) is not None


def test_a_line_cut_short_is_left_out(tmp_path: Path) -> None:
    journal = Journal(tmp_path / DIRECTORY, "gw")
    assert journal.append(ROW, EVENTS) is not None
    [(_, path)] = segments(tmp_path / DIRECTORY, "gw")
    with path.open("ab") as f:
        f.write(b'{"row":{"session_id":"s","posi')
    records, _ = read_segments(tmp_path / DIRECTORY, "gw")
    assert [r.row for r in records] == [ROW]


CHILD = textwrap.dedent(
    """
    import asyncio, os, sys, threading
    sys.path[:0] = [{root!r}]
    from kernelgw.storage.store import Store
    from kernelgw.storage import writer
    from tests.support.stand_ins import finished_execution as finished, stand_in_session as stand_in

    async def main():
        store = Store({url!r}, gateway_name="gw", purge_interval_s=0)
        await store.start()
        session = stand_in("s1")
        await store.session_started(session)
        committed = finished("committed", "1 + 1")
        await store.execution_finished(session, committed)  # an answer that was committed
        await store.flush()
        running = finished("running", "2 + 2")
        store.execution_started(session, running)  # its running row is committed, its end is not
        await store.flush()
        stuck = threading.Event()
        original = writer.Writer._commit_in_thread
        def never(self, *args):  # the disk stopped: no commit returns
            stuck.wait()
        writer.Writer._commit_in_thread = never
        try:
            async with asyncio.timeout(10):  # without the journal they would wait for ever
                await store.execution_finished(session, running)
                await store.execution_finished(session, finished("fresh", "3 + 3"))
            print("answered", flush=True)
        except TimeoutError:
            print("not answered", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


def kill_once_answered(url: str) -> None:
    """Run CHILD and SIGKILL it once it answered its cells."""
    root = str(Path(__file__).resolve().parents[3])
    with subprocess.Popen(
        [sys.executable, "-c", CHILD.format(root=root, url=url)], stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "answered"  # while no commit could return
        finally:
            os.kill(child.pid, signal.SIGKILL)


async def test_answers_given_before_their_commit_survive_a_kill(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / DB_FILE}"
    await asyncio.to_thread(kill_once_answered, url)
    with sqlite3.connect(tmp_path / DB_FILE) as conn:
        before = dict(conn.execute("SELECT execution_id, status FROM kgw_executions").fetchall())
    assert before == {"committed": "ok", "running": "running"}  # the kill came before the commits
    records, _ = read_segments(tmp_path / DIRECTORY, "gw")
    assert [r.row["execution_id"] for r in records] == ["running", "fresh"]

    store = Store(url, gateway_name="gw", purge_interval_s=0)
    await store.start()
    try:
        stored = {e.execution_id: e for e in await store.list_executions("s1")}
        assert {k: (e.status, e.code) for k, e in stored.items()} == {
            "committed": ("ok", "1 + 1"),
            "running": ("ok", "2 + 2"),
            "fresh": ("ok", "3 + 3"),
        }
        assert [e.type for e in stored["fresh"].events] == ["queued", "stream", "done"]
        assert stored["fresh"].events[1].text == "ünïcode ✓\n"  # type: ignore[union-attr]
        assert segments(tmp_path / DIRECTORY, "gw") == []  # written, then removed
    finally:
        await store.close()
    # a second start finds nothing more to write
    again = Store(url, gateway_name="gw", purge_interval_s=0)
    await again.start()
    try:
        assert len(await again.list_executions("s1")) == 3
    finally:
        await again.close()


async def test_with_fsync_durability_an_answer_waits_for_its_commit(tmp_path: Path) -> None:
    """An fsync on the event loop would hold it up: ``durability=fsync`` keeps no
    journal, so the row is in the database file once the answer may go."""
    store = Store(
        f"sqlite+aiosqlite:///{tmp_path / DB_FILE}", gateway_name="gw", purge_interval_s=0, durability="fsync"
    )
    await store.start()
    try:
        session = stand_in_session("s1")
        await store.session_started(session)
        await store.execution_finished(session, finished_execution("e1", "1 + 1"))
        with sqlite3.connect(tmp_path / DB_FILE) as conn:  # another reader, no flush
            assert conn.execute("SELECT execution_id, status FROM kgw_executions").fetchall() == [("e1", "ok")]
        assert not (tmp_path / DIRECTORY).exists()
    finally:
        await store.close()
