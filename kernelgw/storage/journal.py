"""The answer journal: small cells' end rows, answered before their commit.

A cell's ``done`` waited for its row's SQLite commit: about 0.5 ms of the 1.4 ms
a WebSocket ``1+1`` spends in the gateway (queue, writer thread, commit, back to
the loop). With the default durability a commit is promised to survive a crash
of the gateway process (WAL, ``synchronous=NORMAL``: it has reached the
operating system), and a ``write(2)`` to a file promises the same. So the end
row of a small cell is appended here, in one write on the event loop (tens of
microseconds, no thread hop), the answer goes out, and the row commits with the
writer's next batch. Once every row of a segment is committed the segment is
emptied (`release`). The gateway that starts next under the same name writes
whatever the files still hold into the database (`read_segments`,
`Store.start`) before it marks cut-off cells.

Not used, so the answer waits for the commit as before: PostgreSQL (another
gateway may take the session over, and this file is on one host), durability
``fsync`` (an fsync on the event loop would hold it up), a row over
`MAX_RECORD_BYTES`, a cell whose output chunks are not committed yet, a writer
holding rows back after a fault, and a file that cannot be written or whose
directory was deleted (`append` returns None).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)

MAX_RECORD_BYTES = 64 << 10
"""Larger end rows wait for their commit: writing them on the event loop would
cost more than the hop it saves (their cells printed a lot and were slow anyway)."""
ROTATE_BYTES = 8 << 20
"""A segment this large gets a successor; it is removed once its rows are committed."""
DIRECTORY = "journal"
"""Beside the database file."""


@dataclass
class _Segment:
    path: Path
    fd: int
    size: int = 0
    pending: int = 0
    """Rows written here and not committed yet."""


class Journal:
    """One gateway's segments (``<directory>/<name>.<n>.jsonl``); used on the event loop only."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.name = name
        self._current: _Segment | None = None
        self._next = max((n for n, _ in segments(directory, name)), default=0) + 1
        """Numbers past the segments on disk: those are replayed and removed at start."""

    def append(self, row: dict[str, Any], events: str) -> Callable[[], None] | None:
        """Write a row (its ``events`` JSON apart, spliced in as is); the function
        to call once the row is committed, or None if it was not written (the
        caller then waits for the commit)."""
        record = _record(row, events)
        if len(record) > MAX_RECORD_BYTES:
            return None
        segment = self._segment()
        if segment is None:
            return None
        try:
            written = os.write(segment.fd, record)
            if written != len(record):  # a full disk: no half record left behind
                os.ftruncate(segment.fd, segment.size)
                raise OSError("short write")
            if os.fstat(segment.fd).st_nlink == 0:  # its directory was deleted
                raise FileNotFoundError(segment.path)
        except OSError as exc:
            log.warning("history journal: cannot append to %s (%s); answers wait for commits", segment.path, exc)
            self._close(segment)
            return None
        segment.size += written
        segment.pending += 1
        return lambda: self._release(segment)

    def close(self) -> None:
        """At shutdown, after the writer committed what it could: an empty segment goes."""
        if (segment := self._current) is not None:
            self._current = None
            self._close(segment, remove=segment.pending == 0)

    def _segment(self) -> _Segment | None:
        segment = self._current
        if segment is not None and segment.size >= ROTATE_BYTES:
            self._current = segment = None  # the old one goes once its rows are committed
        if segment is None:
            path = self.directory / f"{self.name}.{self._next}.jsonl"
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self.directory, 0o700)  # not its parent: a deleted data directory is the writer's to make
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            except OSError as exc:
                log.warning("history journal: cannot open %s (%s); answers wait for commits", path, exc)
                return None
            self._current = segment = _Segment(path, fd)
            self._next += 1
        return segment

    def _release(self, segment: _Segment) -> None:
        segment.pending -= 1
        if segment.pending > 0:
            return
        if segment is not self._current:
            self._close(segment, remove=True)
        elif segment.size:
            try:
                os.ftruncate(segment.fd, 0)  # every row in it is committed
                segment.size = 0
            except OSError:
                self._close(segment)

    def _close(self, segment: _Segment, remove: bool = False) -> None:
        if segment is self._current:
            self._current = None
        if segment.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(segment.fd)
            segment.fd = -1
        if remove:
            with contextlib.suppress(OSError):
                segment.path.unlink()


def _record(row: dict[str, Any], events: str) -> bytes:
    """One line: compact JSON holds no raw newline, so a line is a record.
    orjson: the standard encoder took a third of the append (datetimes by ``default``)."""
    return b'{"row":' + orjson.dumps(row) + b',"events":' + events.encode() + b"}\n"


_NAME = re.compile(r"^(?P<name>.+)\.(?P<n>\d+)\.jsonl$")


def segments(directory: Path, name: str) -> list[tuple[int, Path]]:
    """A gateway's segments on disk, oldest first."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            match = _NAME.match(entry.name)
            if match and match["name"] == name:
                found.append((int(match["n"]), Path(entry.path)))
    return sorted(found)


@dataclass
class JournalRecord:
    row: dict[str, Any]
    """The row's columns (``started_at`` as ISO text) but ``events``."""
    events: str
    """The row's ``events`` column, as written."""


def read_segments(directory: Path, name: str) -> tuple[list[JournalRecord], list[Path]]:
    """What a gateway of this name left behind, oldest first, and the files it was
    in (to remove once written to the database). A last line cut short (the
    power failed during a write, which nothing had been answered for) is left out."""
    records: list[JournalRecord] = []
    paths = []
    for _, path in segments(directory, name):
        paths.append(path)
        try:
            lines = path.read_bytes().split(b"\n")
        except OSError as exc:
            log.error("history journal: cannot read %s: %s", path, exc)
            continue
        for line in lines:
            if not line.strip():
                continue
            try:
                records.append(_parse(line.decode()))
            except ValueError:
                log.warning("history journal: left out a record of %s that is not whole", path)
    return records, paths


_HEAD, _EVENTS = '{"row":', ',"events":'


def _parse(line: str) -> JournalRecord:
    """The inverse of `_record`: the events as they were written, not re-encoded."""
    if not line.startswith(_HEAD):
        raise ValueError("not a journal record")
    row, end = json.JSONDecoder().raw_decode(line, len(_HEAD))
    if not isinstance(row, dict) or not line.startswith(_EVENTS, end) or not line.endswith("}"):
        raise ValueError("not a journal record")
    events = line[end + len(_EVENTS) : -1]
    if not isinstance(json.loads(events), list):
        raise ValueError("not a journal record")
    return JournalRecord(row, events)
