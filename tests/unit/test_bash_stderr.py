"""The Bash kernel's stderr relay (images/python/kernelgw_kernel/bash_launcher.py):
how it cuts what cells write into stream messages. The relay runs against a real
FIFO and its own thread; the writes happen while its lock is held, so when the
thread sends is decided by the relay's rules, not by the machine's scheduling
(the integration test in tests/integration/languages/test_bash.py runs real bash,
where a pause of more than HOLD_S between two writes may cut a line)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.local_backend import image_helper


@pytest.fixture(scope="module")
def launcher() -> Iterator[ModuleType]:
    with image_helper("bash_launcher") as module:
        yield module


class Recorder:
    """Stands in for the Outlet (which publishes on iopub through bash_kernel)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.arrived = threading.Condition()

    def show(self, name: str, text: str) -> str:
        with self.arrived:
            self.sent.append(text)
            self.arrived.notify_all()
        return text

    def wait_for(self, count: int, timeout: float = 10.0) -> list[str]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.sent) >= count, timeout), self.sent
            return list(self.sent)


def write_held(relay: object, pieces: list[bytes]) -> None:
    """Write ``pieces`` to the relay's FIFO one by one while its thread cannot send."""
    fd = os.open(relay.path, os.O_WRONLY)  # type: ignore[attr-defined]
    try:
        with relay.lock:  # type: ignore[attr-defined]
            for piece in pieces:
                os.write(fd, piece)
                time.sleep(0.01)  # the thread's select wakes between the writes
    finally:
        os.close(fd)


def test_a_line_written_in_pieces_is_one_message_and_a_partial_line_follows(
    launcher: ModuleType, tmp_path: Path
) -> None:
    outlet = Recorder()
    relay = launcher.StderrRelay(outlet, str(tmp_path / "relay"))
    relay.begin()
    write_held(relay, [b"one ", b"line", b" of stderr\n", b"no newline"])
    started = time.monotonic()
    sent = outlet.wait_for(2)
    waited = time.monotonic() - started
    assert sent == ["one line of stderr\n", "no newline"]
    # the partial line was held for more writes before it was sent
    assert waited >= launcher.HOLD_S * 0.9, waited


def test_what_a_cell_writes_before_it_ends_is_sent_by_end(launcher: ModuleType, tmp_path: Path) -> None:
    outlet = Recorder()
    relay = launcher.StderrRelay(outlet, str(tmp_path / "relay"))
    relay.begin()
    write_held(relay, ["half a char: é".encode()[:-1]])
    relay.end()  # reads and sends even what the thread has not seen yet
    assert "".join(outlet.sent) == "half a char: \ufffd"
    # after the cell, output waits for the next cell
    write_held(relay, [b"late\n"])
    time.sleep(launcher.HOLD_S * 4)
    assert "".join(outlet.sent) == "half a char: \ufffd"
    relay.begin()
    assert outlet.wait_for(2)[-1] == "late\n"
