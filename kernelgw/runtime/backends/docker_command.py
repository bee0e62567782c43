"""A user's command through ``docker exec`` (`DockerCommand`), and the exit
code of any exec the backend started (`exec_exit_code`).

Apart from `kernelgw.runtime.backends.docker` for size only: what they need of
the backend is its thread pool and engine client (`ExecEngine`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import docker
import docker.errors

from kernelgw.errors import BackendError, EngineUnavailable
from kernelgw.runtime.backends.base import CommandStream, TerminalSize

T = TypeVar("T")


class ExecEngine(Protocol):
    """The backend as an exec's wrapper uses it (`DockerBackend` is one)."""

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...

    def _client(self) -> docker.DockerClient: ...


async def exec_exit_code(backend: ExecEngine, exec_id: str) -> int | None:
    """An exec's exit code once it has ended (asked for up to a second: the
    engine marks it ended a moment after its output closes); None if unknown."""

    def inspect() -> int | None:
        for _ in range(20):
            info = backend._client().api.exec_inspect(exec_id)
            if not info.get("Running"):
                code = info.get("ExitCode")
                return int(code) if code is not None else None
            time.sleep(0.05)
        return None

    try:
        return await backend._run(inspect)
    except docker.errors.DockerException:
        return None


def read_ahead(sock: Any) -> bytes:
    """The stream's first bytes that the HTTP client already read with the
    engine's response headers: docker-py hands back the raw socket behind
    http.client's buffered reader, whose ``readline`` of the headers may take in
    what the engine sent right after them (a command that writes its pid at
    once, under load). Read from the socket alone, they were lost: the pid line
    with them ("ended before it started"). ``sock`` must be non-blocking here."""
    try:
        reader = sock._response.raw._fp.fp
    except AttributeError:
        return b""
    try:
        head = reader.peek()  # buffered bytes, or one non-blocking read (nothing)
    except (BlockingIOError, OSError, ValueError):
        return b""
    return bytes(reader.read(len(head))) if head else b""


class DockerCommand:
    """A user's command through ``docker exec`` (see ``CommandProcess``).

    Its connection is read and written without a thread: the socket is put in
    non-blocking mode and driven by the event loop, since a command may run
    (and be read) as long as its sandbox does, and a thread each would drain
    the backend's pool. Frames as in `DockerExec`; the first line of stderr is
    the pid the wrapper (`COMMAND_WRAPPER`) wrote. With a terminal (``tty``)
    the engine sends what the terminal shows as raw bytes, no frames: the pid
    is its first line (``\r\n``-ended, as a terminal writes it).
    """

    READ_SIZE = 64 * 1024

    def __init__(self, backend: ExecEngine, exec_id: str, sock: Any, *, tty: bool = False) -> None:
        self._backend = backend
        self.exec_id = exec_id
        self.tty = tty
        self._holder = sock
        raw = getattr(sock, "_sock", sock)
        if not isinstance(raw, socket.socket) or type(raw) is not socket.socket:
            raise EngineUnavailable("Commands need the Docker engine on a unix socket or plain TCP (not TLS).")
        self._sock: socket.socket = raw
        self._sock.setblocking(False)
        self._buffer = bytearray(read_ahead(sock))
        self._eof = False
        self._closed = False
        self._hung_up = False
        self._pid = 0
        self._pending: list[tuple[CommandStream, bytes]] = []

    @property
    def pid(self) -> int:
        return self._pid

    async def _recv(self) -> bytes:
        loop = asyncio.get_running_loop()
        try:
            return await loop.sock_recv(self._sock, self.READ_SIZE)
        except OSError as exc:
            if self._closed or self._hung_up:
                return b""
            raise BackendError(f"The connection to a command in the kernel container broke: {exc}") from exc

    async def _frame(self) -> tuple[int, bytes] | None:
        """The next whole frame (stream id, payload), or None at the end."""
        while True:
            if len(self._buffer) >= 8:
                size = int.from_bytes(self._buffer[4:8], "big")
                if len(self._buffer) >= 8 + size:
                    stream, payload = self._buffer[0], bytes(self._buffer[8 : 8 + size])
                    del self._buffer[: 8 + size]
                    return stream, payload
            if self._eof:
                return None
            # a frame is at most what the engine read at once (32 KiB): the buffer stays small
            data = await self._recv()
            if not data:
                self._eof = True
            self._buffer += data

    async def _raw(self) -> bytes:
        """A terminal's next bytes (``b""`` at the end)."""
        if self._buffer:
            data = bytes(self._buffer)
            self._buffer.clear()
            return data
        if self._eof:
            return b""
        data = await self._recv()
        if not data:
            self._eof = True
        return data

    async def _started_tty(self) -> None:
        while b"\n" not in self._buffer:
            data = await self._recv()
            if not data:
                raise BackendError("The command ended before it started (the kernel container stopped?).")
            self._buffer += data
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        if not line.strip().isdigit():
            raise BackendError(f"The command's wrapper did not name its pid: {line[:80]!r}")
        self._pid = int(line)

    async def started(self) -> None:
        """Read the wrapper's pid line (stderr's first); output before it is kept
        (the engine copies stdout and stderr apart: stdout may come first)."""
        if self.tty:
            return await self._started_tty()
        err = bytearray()
        while b"\n" not in err:
            frame = await self._frame()
            if frame is None:
                raise BackendError("The command ended before it started (the kernel container stopped?).")
            stream, payload = frame
            if stream == 2:
                err += payload
            elif stream == 1 and payload:
                self._pending.append((1, payload))
        line, _, rest = bytes(err).partition(b"\n")
        if not line.strip().isdigit():
            raise BackendError(f"The command's wrapper did not name its pid: {line[:80]!r}")
        self._pid = int(line)
        if rest:
            self._pending.append((2, rest))

    async def read(self) -> tuple[CommandStream, bytes] | None:
        if self.tty:
            data = await self._raw()
            return (3, data) if data else None
        if self._pending:
            return self._pending.pop(0)
        while True:
            frame = await self._frame()
            if frame is None:
                return None
            stream, payload = frame
            if payload and stream in (1, 2):
                return (1 if stream == 1 else 2), payload

    async def write(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_sendall(self._sock, data)
        except OSError as exc:
            raise BackendError(f"The command's stdin is closed: {exc}") from exc

    async def close_stdin(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise BackendError(f"The command's stdin is closed: {exc}") from exc

    async def resize(self, size: TerminalSize) -> None:
        if not self.tty:
            raise BackendError("The command has no terminal to resize.")

        def resize() -> None:
            self._backend._client().api.exec_resize(self.exec_id, height=size.rows, width=size.cols)

        try:
            await self._backend._run(resize)
        except docker.errors.APIError as exc:
            raise BackendError(f"The Docker engine did not resize the terminal: {exc.explanation or exc}") from exc
        except docker.errors.DockerException as exc:
            raise BackendError(f"The Docker engine did not resize the terminal: {exc}") from exc

    def hang_up(self) -> None:
        """End the stream on our side: its container is gone (`OpenCommands`).
        Readers see its end; the exit code is unknown (None)."""
        self._hung_up = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    async def exit_code(self) -> int | None:
        if self._hung_up:
            return None  # the engine may call it running for ever (gVisor)
        return await exec_exit_code(self._backend, self.exec_id)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(Exception):
            self._holder.close()


class OpenCommands:
    """The commands started in each container, hung up when it is removed.

    The engine does not end an exec's stream when a gVisor (runsc) container
    stops or is removed: measured here (Docker 20.10, runsc 20221219), four
    exec streams in five stayed open for as long as anyone watched (90 s and
    more), with or without a tty; under runc each ended at once. A command of a
    killed sandbox then looked as running for ever, and its watcher (an E2B
    ``wait()`` with no timeout) hung. The gateway knows when it removes a
    container, so it ends the streams itself rather than wait for the engine.
    """

    def __init__(self) -> None:
        self._by_container: dict[str, weakref.WeakSet[DockerCommand]] = {}

    def add(self, container_id: str, command: DockerCommand) -> None:
        self._by_container.setdefault(container_id, weakref.WeakSet()).add(command)

    def hang_up(self, container_id: str) -> int:
        """Hang up every command of ``container_id`` (removed); returns how many."""
        commands = list(self._by_container.pop(container_id, ()))
        for command in commands:
            command.hang_up()
        return len(commands)
