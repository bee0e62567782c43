"""The relay of a shimmed kernel's fd 1 and fd 2 (images/python/kernelgw_kernel/fdrelay.py),
on real pipes: what the kernel writes is the running cell's stream output,
before the cell's end, and the container's log's (bounded) while no cell runs."""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from jupyter_client.session import Session

from tests.support.local_backend import image_helper

KEY = b"0123456789abcdef"


@pytest.fixture(scope="module")
def fdrelay() -> Iterator[ModuleType]:
    with image_helper("fdrelay") as module:
        yield module


@pytest.fixture(scope="module")
def shim() -> Iterator[ModuleType]:
    with image_helper("shim") as module:
        yield module


class Pipes:
    """The kernel's fd 1 and 2 (write ends) and the container's log (read ends)."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.out_r, self.out = self._pipe()
        self.err_r, self.err = self._pipe()
        self.log_out, log_out_w = self._pipe()
        self.log_err, log_err_w = self._pipe()
        for fd in (self.out_r, self.err_r, self.log_out, self.log_err, log_out_w, log_err_w):
            os.set_blocking(fd, False)
        for fd in (log_out_w, log_err_w):  # room for the whole budget, as the engine's reader makes
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
        self.pipes = {"stdout": self.out_r, "stderr": self.err_r}
        self.logs = {"stdout": log_out_w, "stderr": log_err_w}

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe()
        self.fds += [r, w]
        return r, w

    def logged(self, fd: int) -> bytes:
        data = b""
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                return data
            data += chunk

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


@pytest.fixture
def pipes() -> Iterator[Pipes]:
    p = Pipes()
    yield p
    p.close()


def relay_of(fdrelay: ModuleType, shim: ModuleType, pipes: Pipes) -> Any:
    return fdrelay.FdRelay(shim.Signer(KEY), "s1", pipes.pipes, pipes.logs)


def execute(gateway: Session, code: str = "x", silent: bool = False) -> tuple[list[bytes], dict[str, Any]]:
    msg = gateway.msg("execute_request", {"code": code, "silent": silent})
    return gateway.serialize(msg), msg["header"]


def pub(session: Session, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> list[bytes]:
    return [b"kernel.topic", *session.serialize(session.msg(msg_type, content, parent=parent))]


def streams(gateway: Session, messages: list[list[bytes]]) -> list[tuple[str, str, str]]:
    """(parent msg_id, name, text) of each message, their signatures checked."""
    out = []
    for frames in messages:
        i = frames.index(b"<IDS|MSG>")
        msg = gateway.deserialize(frames[i + 1 :], content=True)  # checks the HMAC
        assert msg["header"]["msg_type"] == "stream"
        out.append((msg["parent_header"]["msg_id"], msg["content"]["name"], msg["content"]["text"]))
    return out


def test_raw_writes_are_the_running_cells_streams_before_its_output_and_idle(
    fdrelay: ModuleType, shim: ModuleType, pipes: Pipes
) -> None:
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    relay = relay_of(fdrelay, shim, pipes)
    request, cell = execute(gateway)
    relay.request(request)
    os.write(pipes.out, b"raw\n")
    os.write(pipes.err, b"oops\n")
    # the kernel's own print of the cell: what the pipes held goes first
    printed = pub(kernel, "stream", {"name": "stdout", "text": "print\n"}, cell)
    assert streams(gateway, relay.before(printed)) == [
        (cell["msg_id"], "stdout", "raw\n"),
        (cell["msg_id"], "stderr", "oops\n"),
    ]
    os.write(pipes.out, b"more")
    reply = kernel.serialize(kernel.msg("execute_reply", {"status": "ok"}, parent=cell))
    assert streams(gateway, relay.before(reply, "shell")) == [(cell["msg_id"], "stdout", "more")]
    assert relay.cell == cell["msg_id"]  # the reply does not end the cell
    os.write(pipes.out, b"last\n")
    idle = pub(kernel, "status", {"execution_state": "idle"}, cell)
    assert streams(gateway, relay.before(idle)) == [(cell["msg_id"], "stdout", "last\n")]
    assert relay.cell is None
    # after the idle: the container's log, never the next cell
    os.write(pipes.out, b"between cells\n")
    assert relay.readable(pipes.out_r) == []
    assert pipes.logged(pipes.log_out) == b"between cells\n"
    # messages of other parents pass with nothing before them
    request2, cell2 = execute(gateway)
    relay.request(request2)
    os.write(pipes.out, b"x")
    assert relay.before(pub(kernel, "status", {"execution_state": "busy"}, {"msg_id": "other"})) == []
    assert streams(gateway, relay.readable(pipes.out_r)) == [(cell2["msg_id"], "stdout", "x")]


def test_what_came_before_a_cell_is_logged_not_the_cells(fdrelay: ModuleType, shim: ModuleType, pipes: Pipes) -> None:
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    relay = relay_of(fdrelay, shim, pipes)
    os.write(pipes.err, b"Warning: the kernel's banner\n")  # not read yet when the request comes
    request, cell = execute(gateway)
    relay.request(request)
    assert relay.before(pub(kernel, "status", {"execution_state": "idle"}, cell)) == []
    assert pipes.logged(pipes.log_err) == b"Warning: the kernel's banner\n"
    # a silent request (a fence's probe, the gateway's warm-up) starts no cell
    os.write(pipes.out, b"quiet\n")
    relay.request(execute(gateway, silent=True)[0])
    assert relay.cell is None and relay.readable(pipes.out_r) == []
    assert pipes.logged(pipes.log_out) == b"quiet\n"


def test_the_log_between_cells_is_bounded(fdrelay: ModuleType, shim: ModuleType, pipes: Pipes) -> None:
    gateway = Session(key=KEY)
    relay = relay_of(fdrelay, shim, pipes)
    budget = fdrelay.LOG_BUDGET
    for _ in range(3):
        os.write(pipes.out, b"y" * 60_000)
        assert relay.readable(pipes.out_r) == []
    logged = pipes.logged(pipes.log_out)
    assert logged == b"y" * budget + b"\n" + fdrelay.DROPPED.format(n=budget).encode()
    # a cell starts the budget again
    relay.request(execute(gateway)[0])
    relay.before(pub(gateway, "status", {"execution_state": "idle"}, {"msg_id": relay.cell}))
    os.write(pipes.out, b"again\n")
    relay.readable(pipes.out_r)
    assert pipes.logged(pipes.log_out) == b"again\n"


def test_a_flood_is_relayed_as_it_comes_in_bounded_reads(fdrelay: ModuleType, shim: ModuleType, pipes: Pipes) -> None:
    gateway = Session(key=KEY)
    relay = relay_of(fdrelay, shim, pipes)
    request, cell = execute(gateway)
    relay.request(request)
    size = 4 * 1024 * 1024
    writer = threading.Thread(target=lambda: os.write(pipes.out, b"z" * size))
    writer.start()
    got, calls = 0, 0
    while got < size:
        messages = relay.readable(pipes.out_r)
        calls += 1
        got_streams = streams(gateway, messages)
        assert {(parent, name) for parent, name, _ in got_streams} <= {(cell["msg_id"], "stdout")}
        texts = [text for _, _, text in got_streams]
        assert all(len(t) <= fdrelay.READ_CHUNK for t in texts)
        assert sum(map(len, texts)) <= fdrelay.MAX_READ_PER_WAKEUP
        got += sum(map(len, texts))
    writer.join()
    assert got == size and calls >= size // fdrelay.MAX_READ_PER_WAKEUP


def test_a_character_cut_between_reads_is_whole_and_one_cut_at_the_end_stays_in_its_cell(
    fdrelay: ModuleType, shim: ModuleType, pipes: Pipes
) -> None:
    gateway, kernel = Session(key=KEY), Session(key=KEY)
    relay = relay_of(fdrelay, shim, pipes)
    request, cell = execute(gateway)
    relay.request(request)
    euro = "€".encode()
    os.write(pipes.out, b"a" + euro[:1])
    first = streams(gateway, relay.readable(pipes.out_r))
    os.write(pipes.out, euro[1:] + euro[:2])
    second = streams(gateway, relay.readable(pipes.out_r))
    assert "".join(t for _, _, t in first + second) == "a€"
    ended = streams(gateway, relay.before(pub(kernel, "status", {"execution_state": "idle"}, cell)))
    assert ended == [(cell["msg_id"], "stdout", "\ufffd")]
    request2, cell2 = execute(gateway)
    relay.request(request2)
    os.write(pipes.out, b"b")
    assert streams(gateway, relay.readable(pipes.out_r)) == [(cell2["msg_id"], "stdout", "b")]


def test_a_pipe_whose_writers_are_gone_is_closed(fdrelay: ModuleType, shim: ModuleType) -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    relay = fdrelay.FdRelay(shim.Signer(KEY), "s1", {"stdout": r}, {})
    os.close(w)
    try:
        assert relay.readable(r) == [] and relay.fds == []
    finally:
        os.close(r)
