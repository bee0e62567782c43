"""Users' commands in a session's container: started, watched, signalled, listed.

A command is a `Backend.run_command` in the session's kernel container (the
kernel's user, the container's limits, no network). It outlives the request
that started it: a task reads its output into a bounded ring
(`OUTPUT_RING_BYTES`), from which any number of watchers stream (the one that
started it, others that attach later and get what the ring still holds
first). While someone watches, the reader waits for the slowest watcher
rather than drop what it has not sent (backpressure down to the command's
pipe); with nobody watching, the oldest output goes. A session has at most
`MAX_RUNNING` running commands; an ended one stays `ENDED_GRACE_S` for a late
watcher to read its end, then goes.

A command ends with its container: killed, paused or restarted sessions take
their commands with them (the backend ends each exec's stream as it removes
the container: under gVisor the engine may not, `OpenCommands`).

A terminal is a command with a tty (``tty``: its size): its input goes to the
terminal, its output is one stream (3) as the terminal shows it, and it can
be resized. Everything else (ring, watchers, limits, kills) is a command's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections import deque
from collections.abc import AsyncGenerator, Coroutine
from dataclasses import dataclass, field
from functools import partial
from itertools import count
from typing import Any

from kernelgw.errors import KernelGWError
from kernelgw.runtime.backends.base import Backend, CommandProcess, CommandStream, KernelHandle, TerminalSize

log = logging.getLogger(__name__)

MAX_RUNNING = 64
"""Running commands per session."""
OUTPUT_RING_BYTES = 1 << 20
"""The output a command keeps for watchers (the latest of it)."""
CONTAINER_CHECKS, CONTAINER_CHECK_S = 10, 0.1
"""How long a command killed by a signal waits to learn whether its container went too."""
ENDED_GRACE_S = 60.0
"""How long an ended command stays for a watcher to read its end."""
ENDED_RING_BYTES = 64 << 10
"""What an ended command nobody watches keeps of its output (the latest)."""
MAX_ENDED = 64
"""Ended commands a session keeps for late watchers; past it the oldest go at once.
Without both, a sandbox starting short loud commands in a loop held a ring of
up to 1 MiB for each of its last minute's commands in the gateway (hundreds)."""


class CommandNotFound(KernelGWError):
    status_code = 404


class TooManyCommands(KernelGWError):
    status_code = 429


@dataclass(frozen=True)
class CommandConfig:
    """What the command was started with, as its starter named it (for listings)."""

    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str
    tag: str | None = None


@dataclass(frozen=True)
class Output:
    stream: CommandStream
    data: bytes


@dataclass(frozen=True)
class End:
    exit_code: int
    exited: bool
    """False: ended by a signal (or with its container)."""
    status: str
    """As envd (Go's ``ProcessState``) says it: ``exit status 1``, ``signal: killed``."""
    error: str | None = None


@dataclass
class _Chunk:
    start: int
    output: Output


@dataclass(eq=False)
class Command:
    """One running (or just ended) command."""

    pid: int
    config: CommandConfig
    process: CommandProcess
    handle: KernelHandle
    backend: Backend
    stdin: bool
    """Its input is open (a terminal's always is)."""
    tty: bool = False
    """It runs in a terminal (`resize` works)."""
    root: bool = False
    """It runs as root (signalled as root: another uid's processes)."""
    _ring: deque[_Chunk] = field(default_factory=deque)
    _kept: int = 0
    _written: int = 0
    _cursors: dict[int, int] = field(default_factory=dict)
    _watchers: count[int] = field(default_factory=count)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    end: End | None = None
    _kill_reason: str | None = None
    _deadline: asyncio.TimerHandle | None = None

    @property
    def running(self) -> bool:
        return self.end is None

    # ------------------------------------------------------------ the reader

    async def pump(self) -> None:
        """Read the command's output until it ends, then say how it ended."""
        failure: str | None = None
        try:
            while (item := await self.process.read()) is not None:
                await self._keep(Output(*item))
        except Exception as exc:  # the connection broke: the command is lost to us
            failure = str(exc)
        code: int | None = None
        with contextlib.suppress(Exception):
            code = await self.process.exit_code() if failure is None else None
        with contextlib.suppress(Exception):
            await self.process.close()
        if self._deadline is not None:
            self._deadline.cancel()
        if code is not None and code > 128 and self._kill_reason is None and not await self._container_alive():
            code = None  # killed as its container stopped (a pause, a kill, a restart): say that
        await self._finish(self._ending(code, failure))

    async def _container_alive(self) -> bool:
        """Whether the container outlived the command: the engine may report a
        container it is removing as running for a moment, so ask for up to a second."""
        for _ in range(CONTAINER_CHECKS):
            try:
                if not (await self.backend.state(self.handle)).alive:
                    return False
            except Exception:
                return False
            await asyncio.sleep(CONTAINER_CHECK_S)
        return True

    def _ending(self, code: int | None, failure: str | None) -> End:
        if self._kill_reason is not None:
            return End(exit_code=-1, exited=False, status="signal: killed", error=self._kill_reason)
        if code is None:
            reason = failure or "the sandbox ended (killed, paused, or its timeout ran out) and its commands with it"
            return End(exit_code=-1, exited=False, status="signal: killed", error=reason)
        if code > 128:
            sig = code - 128
            name = signal.Signals(sig).name[3:].lower() if sig in signal.Signals._value2member_map_ else str(sig)
            return End(exit_code=code, exited=True, status=f"exit status {code}", error=f"killed by signal {name}")
        return End(exit_code=code, exited=True, status=f"exit status {code}")

    async def _keep(self, output: Output) -> None:
        async with self._changed:
            # backpressure: never drop what a watcher has not sent yet
            await self._changed.wait_for(
                lambda: not self._cursors or min(self._cursors.values()) >= self._written - OUTPUT_RING_BYTES
            )
            self._ring.append(_Chunk(self._written, output))
            self._written += len(output.data)
            self._kept += len(output.data)
            while self._ring and self._kept - len(self._ring[0].output.data) >= OUTPUT_RING_BYTES:
                self._kept -= len(self._ring.popleft().output.data)
            self._changed.notify_all()

    def trim(self, limit: int) -> None:
        """Keep the latest ``limit`` bytes of output (whole chunks: up to one
        more), as the ring does while the command runs, never dropping what a
        watcher has not been sent yet."""
        floor = min(self._cursors.values(), default=self._written)
        while self._ring:
            first = len(self._ring[0].output.data)
            if self._kept - first < limit or self._ring[0].start + first > floor:
                break
            self._kept -= first
            self._ring.popleft()

    async def _finish(self, end: End) -> None:
        async with self._changed:
            self.end = end
            self._changed.notify_all()

    # ------------------------------------------------------------ watchers

    async def watch(self, keepalive_s: float) -> AsyncGenerator[Output | End | None]:
        """The output the ring holds, then what comes, then the end; None every
        ``keepalive_s`` without any (a keepalive)."""
        me = next(self._watchers)
        cursor = self._ring[0].start if self._ring else self._written
        self._cursors[me] = cursor
        try:
            while True:
                async with self._changed:
                    try:
                        async with asyncio.timeout(keepalive_s):
                            await self._changed.wait_for(partial(self._news, cursor))
                    except TimeoutError:
                        pending: list[Output] | None = None
                    else:
                        pending = [c.output for c in self._ring if c.start + len(c.output.data) > cursor]
                        first = self._ring[0].start if self._ring else self._written
                        if pending and cursor > first:  # part of the first chunk was sent
                            chunk = next(c for c in self._ring if c.start + len(c.output.data) > cursor)
                            pending[0] = Output(chunk.output.stream, chunk.output.data[cursor - chunk.start :])
                        cursor = self._written
                        ended = self.end
                if pending is None:
                    yield None
                    continue
                for output in pending:
                    yield output
                async with self._changed:
                    self._cursors[me] = cursor
                    self._changed.notify_all()
                if ended is not None and cursor >= self._written:
                    yield ended
                    return
        finally:
            self._cursors.pop(me, None)
            with contextlib.suppress(RuntimeError):  # the loop is closing
                asyncio.get_running_loop().create_task(self._release())

    def _news(self, cursor: int) -> bool:
        return self._written > cursor or self.end is not None

    async def _release(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    @property
    def watched(self) -> bool:
        return bool(self._cursors)

    # ------------------------------------------------------------ control

    async def signal(self, signum: int, reason: str | None = None) -> None:
        if self.end is not None:
            return
        if signum == signal.SIGKILL and self._kill_reason is None:
            self._kill_reason = reason or "killed (SIGKILL)"
        # a terminal's jobs are process groups of their own: signal its whole session
        await self.backend.signal_command(self.handle, self.pid, signum, session=self.tty, root=self.root)

    async def resize(self, size: TerminalSize) -> None:
        """Set the size of the command's terminal."""
        if not self.tty:
            raise KernelGWError(f"process {self.pid} was started without a terminal (pty): it has no size to set")
        await self.process.resize(size)

    def kill_at(self, seconds: float, reason: str) -> None:
        """SIGKILL the command ``seconds`` from now, naming ``reason`` in its end."""

        async def kill() -> None:
            try:
                await self.signal(signal.SIGKILL, reason)
            except Exception as exc:  # its container went meanwhile: the command ends with it
                log.info("command %d: the kill at its timeout failed: %s", self.pid, exc)

        def fire() -> None:
            task = asyncio.get_running_loop().create_task(kill())
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)

        self._deadline = asyncio.get_running_loop().call_later(seconds, fire)


_BACKGROUND: set[asyncio.Task[None]] = set()


class CommandRegistry:
    """Every session's commands, by session id and pid."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_running: int = MAX_RUNNING,
        grace_s: float = ENDED_GRACE_S,
        max_ended: int = MAX_ENDED,
    ) -> None:
        self.backend = backend
        self.max_running = max_running
        self.max_ended = max_ended
        self.grace_s = grace_s
        self._sessions: dict[str, dict[int, Command]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def commands(self, session_id: str) -> list[Command]:
        return list(self._sessions.get(session_id, {}).values())

    def get(self, session_id: str, pid: int) -> Command:
        command = self._sessions.get(session_id, {}).get(pid)
        if command is None:
            raise CommandNotFound(f"process with pid {pid} not found (it ended, or never ran in this sandbox)")
        return command

    async def start(
        self,
        session_id: str,
        handle: KernelHandle,
        argv: list[str],
        config: CommandConfig,
        *,
        env: dict[str, str],
        cwd: str,
        stdin: bool,
        timeout_s: float | None,
        tty: TerminalSize | None = None,
        root: bool = False,
    ) -> Command:
        """Start ``argv`` in the session's container (in a terminal of size
        ``tty``, if given); it runs until it ends, is killed, its ``timeout_s``
        passes (None: no limit) or its container goes."""
        running = [c for c in self.commands(session_id) if c.running]
        if len(running) >= self.max_running:
            raise TooManyCommands(
                f"This sandbox runs {len(running)} commands, the most it may at once; "
                "wait for one to end or kill one (sandbox.commands.kill)"
            )
        process = await self.backend.run_command(handle, argv, env=env, cwd=cwd, stdin=stdin, tty=tty, root=root)
        command = Command(
            process.pid, config, process, handle, self.backend, stdin or tty is not None, tty is not None, root
        )
        self._sessions.setdefault(session_id, {})[command.pid] = command
        if timeout_s:
            command.kill_at(timeout_s, f"the command's timeout ({timeout_s:g} s) ran out: kernelgw killed it")
        self._spawn(self._run(session_id, command))
        return command

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, session_id: str, command: Command) -> None:
        try:
            await command.pump()
            command.trim(ENDED_RING_BYTES)
            self._drop_oldest_ended(session_id)
            while True:  # the end stays for a late watcher, and while one reads it
                await asyncio.sleep(self.grace_s)
                if not command.watched:
                    break
        finally:
            commands = self._sessions.get(session_id, {})
            if commands.get(command.pid) is command:
                del commands[command.pid]
                if not commands:
                    self._sessions.pop(session_id, None)

    def _drop_oldest_ended(self, session_id: str) -> None:
        """Forget the oldest ended commands nobody watches past ``max_ended``."""
        commands = self._sessions.get(session_id, {})
        ended = [c for c in commands.values() if c.end is not None and not c.watched]
        for command in ended[: max(len(ended) - self.max_ended, 0)]:  # started first, listed first
            del commands[command.pid]

    async def close(self) -> None:
        """Stop watching every command (the gateway is stopping): each one's
        connection closes."""
        # taken first: a cancelled reader's task unlists its command as it ends
        every = [command for commands in self._sessions.values() for command in commands.values()]
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for command in every:
            with contextlib.suppress(Exception):
                await command.process.close()
        self._sessions.clear()
