"""The first bytes of an exec's stream, which docker-py's HTTP client may read
with the engine's response headers: `read_ahead` gives them back to both
readers of hijacked connections (a user's command, a gateway helper). Real
sockets and Python's own http.client; only docker-py's attribute chain from
the socket to that reader is built here (``sock._response.raw._fp``)."""

from __future__ import annotations

import asyncio
import http.client
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from kernelgw.runtime.backends.docker import DockerExec
from kernelgw.runtime.backends.docker_command import DockerCommand, OpenCommands, read_ahead

HEADERS = b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\nUpgrade: tcp\r\n\r\n"


def frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


@pytest.fixture
def hijacked() -> Iterator[tuple[Any, socket.socket]]:
    """docker-py's answer to ``exec_start(socket=True)`` when the engine's first
    frames came in the same read as its headers, and the engine's end."""
    client, engine = socket.socketpair()
    engine.sendall(HEADERS + frame(2, b"4242\n") + frame(1, b"early\n"))
    response = http.client.HTTPResponse(client)
    response.begin()  # reads the headers with a buffered readline: the frames come along
    sock = socket.SocketIO(client, "rb")
    sock._response = SimpleNamespace(raw=SimpleNamespace(_fp=response))  # type: ignore[attr-defined]
    yield sock, engine
    engine.close()
    client.close()


def test_the_bytes_behind_the_headers_are_in_the_http_clients_reader(hijacked: tuple[Any, socket.socket]) -> None:
    sock, _ = hijacked
    sock._sock.setblocking(False)
    assert read_ahead(sock) == frame(2, b"4242\n") + frame(1, b"early\n")
    assert read_ahead(sock) == b""  # taken once
    with pytest.raises(BlockingIOError):
        sock._sock.recv(1)  # and not on the socket: reading it alone lost them


async def test_a_command_finds_its_pid_and_first_output_in_them(hijacked: tuple[Any, socket.socket]) -> None:
    sock, engine = hijacked
    command = DockerCommand(SimpleNamespace(), "exec-id", sock)  # type: ignore[arg-type]
    engine.sendall(frame(1, b"later\n"))
    engine.shutdown(socket.SHUT_WR)
    await command.started()
    assert command.pid == 4242
    assert await command.read() == (1, b"early\n")
    assert await command.read() == (1, b"later\n")
    assert await command.read() is None


def test_a_helper_reads_them_first(hijacked: tuple[Any, socket.socket]) -> None:
    sock, engine = hijacked
    helper = DockerExec(SimpleNamespace(), "exec-id", sock, timeout=5)  # type: ignore[arg-type]
    engine.sendall(frame(1, b"later\n"))
    engine.shutdown(socket.SHUT_WR)
    assert helper._read_frames() == b"early\n"
    assert helper._read_frames() == b"later\n"
    assert helper._read_frames() == b""
    assert helper.stderr == b"4242\n"


async def test_a_hung_up_command_ends_though_the_engine_keeps_its_stream_open(
    hijacked: tuple[Any, socket.socket],
) -> None:
    """Under gVisor the engine keeps a removed container's exec streams open:
    the backend hangs them up itself, and a reader waiting on one sees the end
    (the engine's side, ``engine``, stays open and silent throughout)."""
    sock, _engine = hijacked
    command = DockerCommand(SimpleNamespace(), "exec-id", sock)  # type: ignore[arg-type]
    await command.started()
    assert await command.read() == (1, b"early\n")
    reading = asyncio.create_task(command.read())
    await asyncio.sleep(0.05)
    assert not reading.done()  # nothing comes, and the engine never ends it
    open_commands = OpenCommands()
    open_commands.add("container-a", command)
    assert open_commands.hang_up("container-b") == 0  # another container's removal leaves it be
    assert not reading.done()
    assert open_commands.hang_up("container-a") == 1
    async with asyncio.timeout(5):
        assert await reading is None
    assert await command.exit_code() is None  # unknown; the engine is not asked (it has no engine here)
    assert open_commands.hang_up("container-a") == 0  # hung up once
    await command.close()
