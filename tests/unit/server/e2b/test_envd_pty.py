"""E2B's terminal (``sandbox.pty``), sync and async SDK unchanged, against a real
gateway (uvicorn on loopback) whose commands are host subprocesses on a
pseudo-terminal: create with a size, input, resize, connect, kill, the exit;
``StreamInput`` for a terminal and for a command's stdin; input, resizing and
closing crossed between terminals and commands are refused with a message.
tests/integration/e2b/test_pty.py does the same against containers."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox as BaseAsyncSandbox
from e2b import CommandExitException, InvalidArgumentException, NotFoundException, PtySize, SandboxException
from e2b import Sandbox as BaseSandbox

from kernelgw.runtime.commands import Output
from kernelgw.runtime.session import KernelSession
from kernelgw.server.e2b import envd_process
from kernelgw.server.e2b.connect import ConnectError, parse_message
from tests.support.local_backend import LocalBackend
from tests.support.terminal import read_until
from tests.unit.server.e2b.test_envd_sdk import sdk
from tests.unit.server.e2b.test_interpreter import WAIT_S, Gateway, in_thread, serve

Sbx = tuple[KernelSession, str]


@pytest.fixture(scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    backend = LocalBackend()
    try:
        async with serve(tmp_path_factory.mktemp("pty"), backend) as gateway:
            yield gateway
        assert not backend.running(), f"kernel processes left running: {backend.running()}"
    finally:
        await backend.kill_all()


def test_terminal_messages() -> None:
    assert envd_process.event_of(Output(3, b"$ ")) == {"event": {"data": {"pty": base64.b64encode(b"$ ").decode()}}}
    start = parse_message(
        b'{"process":{"cmd":"/bin/bash","args":["-i","-l"]},"pty":{"size":{"cols":80,"rows":24}}}',
        envd_process.StartRequest,
    )
    assert start.pty is not None
    size = envd_process.terminal_size(start.pty)
    assert (size.rows, size.cols) == (24, 80)
    for bad in (b'{"size":{"cols":80}}', b"{}", b'{"size":{"rows":24,"cols":70000}}'):
        with pytest.raises(ConnectError) as caught:
            envd_process.terminal_size(parse_message(bad, envd_process.Pty))
        assert caught.value.code == "invalid_argument" and "rows and cols" in caught.value.message
    update = parse_message(b'{"process":{"pid":5},"pty":{"size":{"cols":100,"rows":40}}}', envd_process.UpdateRequest)
    assert update.process.pid == 5 and update.pty is not None and update.pty.size.rows == 40
    msg = parse_message(b'{"data":{"input":{"pty":"YWI="}}}', envd_process.StreamInputRequest)
    assert msg.data is not None and msg.data.input.pty == "YWI="


async def test_sync_create_input_resize_connect_and_exit(gw: Gateway, sandbox: Sbx) -> None:
    sbx = sdk(BaseSandbox, gw, *sandbox)
    handle = await in_thread(lambda: sbx.pty.create(PtySize(rows=24, cols=80), envs={"MARK": "m"}))
    # $((..)) is echoed as typed and printed computed: the output proves the shell ran it
    await in_thread(lambda: sbx.pty.send_stdin(handle.pid, b"stty size; test -t 0 && echo tty$((6*7))$MARK\n"))
    seen = await in_thread(lambda: read_until(handle, "tty42m"))
    assert "24 80" in seen
    await in_thread(lambda: sbx.pty.resize(handle.pid, PtySize(rows=40, cols=100)))
    await in_thread(lambda: sbx.pty.send_stdin(handle.pid, b"stty size; echo size$((1+1))\n"))
    assert "40 100" in await in_thread(lambda: read_until(handle, "size2"))
    # another SDK object attaches: what the terminal showed is still in its ring
    other = sdk(BaseSandbox, gw, *sandbox)
    attached = await in_thread(lambda: other.pty.connect(handle.pid))
    assert "tty42m" in await in_thread(lambda: read_until(attached, "size2"))
    await in_thread(lambda: sbx.pty.send_stdin(handle.pid, b"exit 3\n"))
    with pytest.raises(CommandExitException) as ended:
        await in_thread(handle.wait)
    assert ended.value.exit_code == 3
    await in_thread(attached.disconnect)


async def test_async_on_data_kill_and_stream_input(gw: Gateway, sandbox: Sbx) -> None:
    sbx = sdk(BaseAsyncSandbox, gw, *sandbox)
    printed = bytearray()
    saw = asyncio.Event()

    def on_data(data: bytes) -> None:
        printed.extend(data)
        if b"streamed5" in printed:
            saw.set()

    handle = await sbx.pty.create(PtySize(rows=30, cols=90), on_data=on_data)
    async with asyncio.timeout(WAIT_S):
        async with sbx.pty.stream_input(handle.pid) as stream:
            await stream.send(b"echo stream")
            await stream.send("ed$((2+3))\n")
        await saw.wait()
    assert await sbx.pty.kill(handle.pid)
    with pytest.raises(CommandExitException) as killed:
        await handle.wait()
    assert "kill" in (killed.value.error or "")
    assert not await sbx.pty.kill(handle.pid)  # ended: nothing to kill


async def test_stream_input_reaches_a_commands_stdin(gw: Gateway, sandbox: Sbx) -> None:
    sbx = sdk(BaseSandbox, gw, *sandbox, envd="0.5.2")
    reader = await in_thread(lambda: sbx.commands.run("read a; read b; echo got:$a:$b", background=True, stdin=True))
    await in_thread(lambda: sbx.commands.stream_input(reader.pid, ["one\n", b"tw", "o\n"]))
    assert (await in_thread(reader.wait)).stdout == "got:one:two\n"
    # close_stdin (the SDK sends it from envd 0.5.2): the command sees its input end
    cat = await in_thread(lambda: sbx.commands.run("cat; echo closed", background=True, stdin=True))
    await in_thread(lambda: sbx.commands.send_stdin(cat.pid, "x\n"))
    await in_thread(lambda: sbx.commands.close_stdin(cat.pid))
    assert (await in_thread(cat.wait)).stdout == "x\nclosed\n"
    with pytest.raises(NotFoundException):
        await in_thread(lambda: sbx.commands.stream_input(999_999, ["x"]))


async def test_stream_input_needs_its_start_first(gw: Gateway, sandbox: Sbx) -> None:
    session, token = sandbox
    data = json.dumps({"data": {"input": {"stdin": "eA=="}}}).encode()
    headers = {**gw.headers(session, token, port=49983), "Content-Type": "application/connect+json"}
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT_S) as http:
        answer = await http.post(
            "/process.Process/StreamInput", content=b"\0" + len(data).to_bytes(4, "big") + data, headers=headers
        )
    assert answer.status_code == 200 and answer.content[0] == 2  # Connect: the error ends the stream
    error = json.loads(answer.content[5:])["error"]
    assert error["code"] == "invalid_argument" and "first message must be the start" in error["message"]


async def test_crossed_calls_are_refused_with_a_message(gw: Gateway, sandbox: Sbx) -> None:
    sbx = sdk(BaseSandbox, gw, *sandbox, envd="0.5.2")
    terminal = await in_thread(lambda: sbx.pty.create(PtySize(rows=24, cols=80)))
    command = await in_thread(lambda: sbx.commands.run("sleep 600", background=True, stdin=True))
    try:
        with pytest.raises(SandboxException, match="without a terminal"):
            await in_thread(lambda: sbx.pty.resize(command.pid, PtySize(rows=10, cols=10)))
        with pytest.raises(SandboxException, match="no terminal"):
            await in_thread(lambda: sbx.pty.send_stdin(command.pid, b"x"))
        with pytest.raises(SandboxException, match="runs in a terminal"):
            await in_thread(lambda: sbx.commands.send_stdin(terminal.pid, "x"))
        with pytest.raises(SandboxException, match="Ctrl-D"):
            await in_thread(lambda: sbx.commands.close_stdin(terminal.pid))
        with pytest.raises(InvalidArgumentException, match="rows and cols"):
            await in_thread(lambda: sbx.pty.resize(terminal.pid, PtySize(rows=0, cols=80)))
        with pytest.raises(InvalidArgumentException, match="rows and cols"):
            await in_thread(lambda: sbx.pty.create(PtySize(rows=24, cols=0)))
        with pytest.raises(SandboxException, match="not found"):
            await in_thread(lambda: sbx.pty.resize(999_999, PtySize(rows=10, cols=10)))
        with pytest.raises(SandboxException, match="one unprivileged user"):
            await in_thread(lambda: sbx.pty.create(PtySize(rows=24, cols=80), user="root"))
        # the terminal still works
        await in_thread(lambda: sbx.pty.send_stdin(terminal.pid, b"echo ok$((3*3))\n"))
        await in_thread(lambda: read_until(terminal, "ok9"))
    finally:
        await in_thread(lambda: sbx.pty.kill(terminal.pid))
        await in_thread(lambda: sbx.commands.kill(command.pid))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_stopping_gateway_ends_its_commands_and_terminals(tmp_path: Path) -> None:
    backend = LocalBackend()
    try:
        async with serve(tmp_path, backend) as gateway:
            session, token = await gateway.sandbox()
            sbx = sdk(BaseSandbox, gateway, session, token)
            command = await in_thread(lambda: sbx.commands.run("sleep 600", background=True, timeout=0))
            terminal = await in_thread(lambda: sbx.pty.create(PtySize(rows=24, cols=80), timeout=0))
            for handle in (command, terminal):
                await in_thread(handle.disconnect)  # nobody watches: they run on
            assert alive(command.pid) and alive(terminal.pid)
        # the gateway stopped: its readers of them closed (here the local backend's processes end with them)
        assert not alive(command.pid) and not alive(terminal.pid)
    finally:
        await backend.kill_all()
