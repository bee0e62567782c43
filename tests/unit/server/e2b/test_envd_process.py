"""envd's process service, the pure parts: events as proto3 JSON in Connect
envelopes, request envelopes, and the command registry's ring, watchers,
backpressure, limit and ends, over a scripted command (no container: the
real ones are in tests/integration/e2b/test_commands.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kernelgw.runtime.backends.base import CommandStream, KernelHandle, KernelState, TerminalSize
from kernelgw.runtime.commands import (
    ENDED_RING_BYTES,
    OUTPUT_RING_BYTES,
    CommandConfig,
    CommandNotFound,
    CommandRegistry,
    End,
    Output,
    TooManyCommands,
)
from kernelgw.server.e2b import envd_process
from kernelgw.server.e2b.connect import ConnectError, end_envelope, envelope, parse_message
from tests.support.waiting import until


def unwrap(data: bytes) -> tuple[int, Any]:
    flags, size = data[0], int.from_bytes(data[1:5], "big")
    assert size == len(data) - 5
    return flags, json.loads(data[5:])


def test_events_are_envds_in_proto3_json() -> None:
    assert envd_process.event_of(Output(1, b"hi\n")) == {
        "event": {"data": {"stdout": base64.b64encode(b"hi\n").decode()}}
    }
    assert envd_process.event_of(Output(2, b"\xff")) == {"event": {"data": {"stderr": "/w=="}}}
    assert envd_process.event_of(None) == {"event": {"keepalive": {}}}
    end = End(exit_code=3, exited=True, status="exit status 3")
    assert envd_process.event_of(end) == {"event": {"end": {"exitCode": 3, "exited": True, "status": "exit status 3"}}}
    killed = End(exit_code=-1, exited=False, status="signal: killed", error="timeout")
    assert envd_process.event_of(killed)["event"]["end"]["error"] == "timeout"
    assert unwrap(envelope(envd_process.start_event(7))) == (0, {"event": {"start": {"pid": 7}}})
    assert unwrap(end_envelope()) == (2, {})
    error = unwrap(end_envelope(ConnectError("not_found", "gone")))
    assert error == (2, {"error": {"code": "not_found", "message": "gone"}})


def test_requests_and_signals() -> None:
    start = parse_message(
        b'{"process":{"cmd":"/bin/bash","args":["-l","-c","ls"],"envs":{"A":"1"},"cwd":"/home/user"},"stdin":false}',
        envd_process.StartRequest,
    )
    assert (start.process.cmd, start.process.args, start.process.envs, start.stdin) == (
        "/bin/bash",
        ["-l", "-c", "ls"],
        {"A": "1"},
        False,
    )
    with pytest.raises(ConnectError) as bad:
        parse_message(b'{"process":{"cmd":5}}', envd_process.StartRequest)
    assert bad.value.code == "invalid_argument"
    assert envd_process.signal_of("SIGNAL_SIGKILL") == signal.SIGKILL
    assert envd_process.signal_of(15) == signal.SIGTERM
    with pytest.raises(ConnectError):
        envd_process.signal_of("SIGNAL_UNSPECIFIED")
    check = envd_process.check_command_user
    for runtime in ("runc", "runsc"):
        with pytest.raises(ConnectError) as root:
            check("root", False, runtime)  # not allowed by the gateway
        assert root.value.code == "permission_denied" and "e2b_root_commands" in root.value.message
        assert check("user", True, runtime) is False and check(None, True, runtime) is False
        with pytest.raises(ConnectError, match="one unprivileged user"):
            check("postgres", True, runtime)
    with pytest.raises(ConnectError) as runc:
        check("root", True, "runc")  # allowed, but root under runc is the host's uid 0
    assert runc.value.code == "permission_denied" and "gVisor" in runc.value.message
    assert check("root", True, "runsc") is True


class Scripted:
    """A `CommandProcess` whose output the test feeds; it ends when told."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.queue: asyncio.Queue[tuple[CommandStream, bytes] | None] = asyncio.Queue()
        self.code: int | None = 0
        self.closed = False
        self.taken = 0

    async def read(self) -> tuple[CommandStream, bytes] | None:
        item = await self.queue.get()
        self.taken += 1
        return item

    async def write(self, data: bytes) -> None:
        pass

    async def close_stdin(self) -> None:
        pass

    async def resize(self, size: TerminalSize) -> None:
        pass

    async def exit_code(self) -> int | None:
        return self.code

    async def close(self) -> None:
        self.closed = True


class ScriptedBackend:
    def __init__(self) -> None:
        self.made: list[Scripted] = []
        self.signals: list[tuple[int, int]] = []

    async def run_command(
        self,
        handle: KernelHandle,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        stdin: bool = False,
        tty: TerminalSize | None = None,
        root: bool = False,
    ) -> Scripted:
        self.made.append(Scripted(100 + len(self.made)))
        return self.made[-1]

    async def state(self, handle: KernelHandle, oom_seen: int = 0) -> KernelState:
        return KernelState("running")

    async def signal_command(
        self, handle: KernelHandle, pid: int, signum: int, *, session: bool = False, root: bool = False
    ) -> None:
        self.signals.append((pid, signum))
        for command in self.made:
            if command.pid == pid:
                command.code = None
                command.queue.put_nowait(None)


HANDLE = KernelHandle("k", "s", "c", conn_dir=None, connection={})  # type: ignore[arg-type]
CONFIG = CommandConfig("/bin/bash", ["-l", "-c", "x"], {}, "/home/user")


_MADE: list[CommandRegistry] = []


@pytest.fixture(autouse=True)
async def _close_registries() -> AsyncIterator[None]:
    """Every registry a test made is closed with its loop (no task left pending)."""
    yield
    while _MADE:
        await _MADE.pop().close()


def registry(**options: Any) -> tuple[CommandRegistry, ScriptedBackend]:
    backend = ScriptedBackend()
    made = CommandRegistry(backend, **{"grace_s": 0.05, **options})  # type: ignore[arg-type]
    _MADE.append(made)
    return made, backend


async def start(commands: CommandRegistry, session: str = "s", timeout_s: float | None = None) -> Any:
    return await commands.start(
        session, HANDLE, ["x"], CONFIG, env={}, cwd="/workspace", stdin=False, timeout_s=timeout_s
    )


async def collect(watching: Any) -> list[Output | End]:
    return [item async for item in watching if item is not None]


async def test_a_late_watcher_gets_what_the_ring_holds_then_the_end() -> None:
    commands, backend = registry()
    command = await start(commands)
    process = backend.made[0]
    process.queue.put_nowait((1, b"one\n"))
    process.queue.put_nowait((2, b"two\n"))
    process.queue.put_nowait(None)
    first = await collect(command.watch(5))
    assert first == [Output(1, b"one\n"), Output(2, b"two\n"), End(0, True, "exit status 0")]
    assert process.closed
    # a second watcher within the grace period reads the same, then the command goes
    assert await collect(command.watch(5)) == first

    async def gone() -> bool:
        return not commands.commands("s")

    await until(gone, "the ended command removed after its grace period")
    with pytest.raises(CommandNotFound):
        commands.get("other", command.pid)  # another session's pid is not this one's


async def test_nobody_watching_keeps_only_the_latest_output() -> None:
    commands, backend = registry()
    command = await start(commands)
    process = backend.made[0]
    chunk = b"x" * 60_000
    for _ in range(50):  # ~3 MB
        process.queue.put_nowait((1, chunk))
    process.queue.put_nowait((1, b"END"))
    process.queue.put_nowait(None)

    async def ended() -> bool:
        return command.end is not None

    await until(ended, "the command read to its end")
    items = await collect(command.watch(5))
    data = b"".join(i.data for i in items if isinstance(i, Output))
    # ended with nobody watching: its ring shrank to the tail a late watcher may want
    assert data.endswith(b"END") and ENDED_RING_BYTES <= len(data) <= ENDED_RING_BYTES + len(chunk)


async def test_a_running_command_keeps_a_whole_ring_for_late_watchers() -> None:
    commands, backend = registry()
    command = await start(commands)
    process = backend.made[0]
    chunk = b"x" * 60_000
    for _ in range(50):  # ~3 MB
        process.queue.put_nowait((1, chunk))

    async def read() -> bool:
        return process.queue.empty() and not command._changed.locked()

    await until(read, "the output read")
    watching = command.watch(5)
    got = 0
    while got < OUTPUT_RING_BYTES:
        item = await anext(watching)
        assert isinstance(item, Output)
        got += len(item.data)
    assert got <= OUTPUT_RING_BYTES + len(chunk)
    await watching.aclose()


async def test_a_sandbox_keeps_a_bounded_number_of_ended_commands() -> None:
    """Short loud commands in a loop: the gateway keeps the latest few ended ones
    for late watchers, each with a small ring, not every one of the last minute."""
    commands, backend = registry(grace_s=60, max_ended=3)
    started = [await start(commands) for _ in range(8)]
    for process in backend.made:
        process.queue.put_nowait((1, b"z" * 200_000))
        process.queue.put_nowait(None)

    async def ended() -> bool:
        return all(c.end is not None for c in started) and len(commands.commands("s")) == 3

    await until(ended, "the oldest ended commands forgotten")
    assert [c.pid for c in commands.commands("s")] == [c.pid for c in started[-3:]]
    assert all(c._kept <= ENDED_RING_BYTES + 200_000 for c in commands.commands("s"))
    with pytest.raises(CommandNotFound):
        commands.get("s", started[0].pid)


async def test_a_slow_watcher_holds_the_reader_back_instead_of_losing_output() -> None:
    commands, backend = registry()
    command = await start(commands)
    process = backend.made[0]
    chunk = b"y" * 60_000
    process.queue.put_nowait((1, chunk))
    watching = command.watch(5)
    assert await anext(watching) == Output(1, chunk)  # attached, and not reading on
    for _ in range(60):
        process.queue.put_nowait((1, chunk))
    process.queue.put_nowait(None)

    async def held() -> bool:
        return process.queue.qsize() > 0 and not command._changed.locked()

    await until(held, "the reader held back")
    for _ in range(20):  # the loop goes round: the reader stays held, about a ring ahead of the watcher
        await asyncio.sleep(0)
    assert 10 < process.taken < 40
    rest = [i async for i in watching if i is not None]
    data = b"".join(i.data for i in rest if isinstance(i, Output))
    assert len(data) == 60 * len(chunk) and isinstance(rest[-1], End)


async def test_kill_timeout_and_limit() -> None:
    commands, backend = registry(max_running=2)
    killed = await start(commands)
    timed = await start(commands, timeout_s=0.05)
    with pytest.raises(TooManyCommands):
        await start(commands)
    await killed.signal(signal.SIGKILL, "killed by sandbox.commands.kill (SIGKILL)")
    (end,) = await collect(killed.watch(5))
    assert end == End(-1, False, "signal: killed", "killed by sandbox.commands.kill (SIGKILL)")
    (end,) = await collect(timed.watch(5))
    assert isinstance(end, End) and "timeout (0.05 s) ran out" in (end.error or "")
    assert [s for _, s in backend.signals] == [signal.SIGKILL, signal.SIGKILL]
    await start(commands)  # room again


async def test_a_command_its_container_took_ends_saying_so() -> None:
    commands, backend = registry()
    command = await start(commands)
    backend.made[0].code = None
    backend.made[0].queue.put_nowait(None)
    (end,) = await collect(command.watch(5))
    assert isinstance(end, End) and not end.exited and "sandbox ended" in (end.error or "")
