"""What a kernel behind the shim writes to its own file descriptors 1 and 2,
relayed as the running cell's ``stream`` output (wired by `kernelgw_kernel.shim`).

ipykernel captures its process's fd 1 and fd 2 and sends what comes as stream
output of the running cell. Other kernels do not: Deno's
``Deno.stdout.writeSync`` and a child spawned with ``stdout: 'inherit'``, R's
``system()``, Java's ``FileOutputStream(FileDescriptor.out)`` and an
``inheritIO()`` child wrote to the container's log, and the cell ended ``ok``
with nothing. The shim starts the kernel with fd 1 and fd 2 on pipes it reads
(`FdRelay`):

- while a cell runs (from its non-silent execute_request until its idle goes
  to the gateway), what comes is published on iopub as ``stream`` messages
  (``stdout`` for fd 1, ``stderr`` for fd 2), parented to the cell's
  execute_request and signed with the kernel's key, as it comes: one message
  per read (at most `READ_CHUNK` bytes), at most `MAX_READ_PER_WAKEUP` bytes
  per pipe before the relay serves other sockets; nothing is held back (the
  gateway caps a cell's output and says ``truncated``);
- before any message of the cell goes on (its output, its execute_reply, its
  idle) the pipes are read up to empty: bytes written before the kernel sent
  that message are in the pipe, so they keep their order with the kernel's
  own output and are never after the cell's end;
- while no cell runs (the kernel's start, its banners and warnings, a
  background process between cells), what comes goes to the container's log
  as before, at most `LOG_BUDGET` bytes between two cells (then one line says
  the rest is dropped); pipes are read up to empty before a cell starts, so
  none of it lands in the next cell.

Writes to the log never block the relay (a full log pipe drops them).
"""

from __future__ import annotations

import codecs
import json
import os
import stat
from typing import Protocol

from kernelgw_kernel.wire import DELIM, dumps, is_idle, own_header, split

READ_CHUNK = 64 * 1024
"""Bytes per read, and so at most per ``stream`` message (a pipe's default capacity)."""
MAX_READ_PER_WAKEUP = 1024 * 1024
"""Bytes read from one pipe per wake-up (or per drain) before the relay serves others."""
LOG_BUDGET = 64 * 1024
"""Bytes of output while no cell runs written to the container's log between two cells."""
DROPPED = "kernelgw shim: more than {n} bytes of output while no cell runs: the rest until the next cell is dropped\n"


class Signer(Protocol):
    def sign(self, parts: list[bytes]) -> bytes: ...


class FdRelay:
    """The kernel's fd 1 and fd 2 pipes (read ends, non-blocking) as stream output.

    ``pipes`` maps a stream name (``stdout``, ``stderr``) to the read end of the
    pipe on the kernel's fd; ``logs`` maps it to where output goes while no
    cell runs (the shim's own fd 1 and 2: the container's log)."""

    def __init__(self, signer: Signer, session: str, pipes: dict[str, int], logs: dict[str, int]) -> None:
        self.signer = signer
        self.session = session
        self.pipes = dict(pipes)
        self.names = {fd: name for name, fd in self.pipes.items()}
        self.logs = logs
        self.decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in self.pipes}
        self.cell: str | None = None
        """The msg_id of the running cell (its request passed, its idle not yet)."""
        self.cell_header = b""
        """The running cell's header frame, as the gateway signed it (the parent of its streams)."""
        self.count = 0
        self.logged = 0
        """Bytes written to the log since the last cell started (`LOG_BUDGET`)."""
        self.closed: set[str] = set()

    @property
    def fds(self) -> list[int]:
        """The read ends still open (for the relay's poller)."""
        return [fd for name, fd in self.pipes.items() if name not in self.closed]

    # ---------------------------------------------------------------- events

    def request(self, frames: list[bytes]) -> None:
        """A shell request on its way to the kernel (identities taken off): a
        non-silent execute_request starts a cell, after what came before it
        went to the log."""
        i = split(frames)
        if i is None:
            return
        try:
            header, content = json.loads(frames[i + 2]), json.loads(frames[i + 5])
        except ValueError:
            return
        if not isinstance(header, dict) or header.get("msg_type") != "execute_request":
            return
        if not isinstance(content, dict) or content.get("silent") or not isinstance(header.get("msg_id"), str):
            return
        self.drain()  # what came before the request is not the cell's
        self._flush_decoders()
        self.cell, self.cell_header = header["msg_id"], frames[i + 2]
        self.logged = 0

    def readable(self, fd: int) -> list[list[bytes]]:
        """The messages to publish for what waits on ``fd`` (the poller said so)."""
        name = self.names.get(fd)
        return [] if name is None else self._read(name)

    def before(self, frames: list[bytes], channel: str = "iopub") -> list[list[bytes]]:
        """The messages to publish before ``frames`` goes to the gateway: a
        message of the running cell (on iopub, or its shell reply) is preceded
        by what the pipes hold; after the cell's idle no cell runs."""
        if self.cell is None:
            return []
        i = split(frames)
        if i is None:
            return []
        try:
            parent = json.loads(frames[i + 3])
        except ValueError:
            return []
        if not isinstance(parent, dict) or parent.get("msg_id") != self.cell:
            return []
        out = self.drain()
        if channel == "iopub" and is_idle(frames, i):
            out += self._flush_decoders()
            self.cell, self.cell_header = None, b""
        return out

    def drain(self) -> list[list[bytes]]:
        """Read every pipe up to empty (bounded): messages for the cell, or to the log."""
        out: list[list[bytes]] = []
        for name in list(self.pipes):
            if name not in self.closed:
                out += self._read(name)
        return out

    # ---------------------------------------------------------------- the work

    def _read(self, name: str) -> list[list[bytes]]:
        fd = self.pipes[name]
        out: list[list[bytes]] = []
        total = 0
        while total < MAX_READ_PER_WAKEUP:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:  # every writer is gone
                self.closed.add(name)
                out += self._flush_decoder(name)
                break
            total += len(chunk)
            if self.cell is None:
                self._log(name, chunk)
                continue
            text = self.decoders[name].decode(chunk)
            if text:
                out.append(self.stream(name, text))
        return out

    def _flush_decoders(self) -> list[list[bytes]]:
        out: list[list[bytes]] = []
        for name in self.decoders:
            out += self._flush_decoder(name)
        return out

    def _flush_decoder(self, name: str) -> list[list[bytes]]:
        """A cut multi-byte sequence at a cell's end (replaced), not carried to the next."""
        text = self.decoders[name].decode(b"", final=True)
        self.decoders[name].reset()
        if not text:
            return []
        if self.cell is None:
            self._log(name, text.encode("utf-8", "replace"))
            return []
        return [self.stream(name, text)]

    def stream(self, name: str, text: str) -> list[bytes]:
        """A signed ``stream`` message of the running cell."""
        self.count += 1
        made = own_header(f"{self.session}_fd_{self.count}", "stream", self.session)
        content = {"name": name, "text": text}
        parts = [dumps(made), self.cell_header or b"{}", b"{}", dumps(content)]
        return [b"kernel.shim.stream", DELIM, self.signer.sign(parts), *parts]

    def _log(self, name: str, data: bytes) -> None:
        fd = self.logs.get(name)
        if fd is None or self.logged > LOG_BUDGET:
            return
        room = LOG_BUDGET - self.logged
        self.logged += len(data)
        if len(data) > room:
            data = data[:room] + b"\n" + DROPPED.format(n=LOG_BUDGET).encode()
            self.logged = LOG_BUDGET + 1
        try:
            os.write(fd, data)
        except OSError:  # full (non-blocking) or gone: dropped
            pass


def log_fd(fd: int) -> int:
    """A descriptor for writing to ``fd`` that never blocks: the pipe opened
    again with O_NONBLOCK (its own open file, so ``fd`` keeps its flags); ``fd``
    itself where that cannot be done (not a pipe: a file opened again
    would not append; no /proc)."""
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        pass
    return fd
