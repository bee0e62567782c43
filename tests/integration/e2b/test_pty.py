"""E2B's terminal (``sandbox.pty``), SDK from PyPI unchanged (sync and async),
through kernelgw's envd face against real kernel containers (runc, and gVisor
in scripts/test.sh's runsc pass): a ``docker exec -t`` of the SDK's
``bash -i -l`` with the size asked, input, resize, connect from another SDK
object, kill, exit, ``stream_input``; as the sandbox's user; a terminal that
prints without end costs the gateway its ring only; it ends with its sandbox."""

from __future__ import annotations

import asyncio

import pytest
from e2b import CommandExitException, PtySize, SandboxException
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.integration.e2b.conftest import E2BGateway
from tests.support.terminal import read_until
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
RING = 1 << 20


def running(sbx: Sandbox) -> str:
    """The command lines of the sandbox's processes (the image has no ps)."""
    return sbx.commands.run("cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout


def test_create_input_resize_connect_kill(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/sub")
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), cwd="/home/user/sub", envs={"MARK": "m"})
    # $((..)) is echoed as typed and printed computed: the output proves the shell ran it
    sbx.pty.send_stdin(terminal.pid, b"stty size; pwd; id -u; echo $TERM; test -t 0 && echo tty$((6*7))$MARK\n")
    seen = read_until(terminal, "tty42m")
    lines = [line.strip() for line in seen.splitlines()]
    assert "24 80" in lines and "/home/user/sub" in lines and "xterm-256color" in lines
    uid = lines[lines.index("/home/user/sub") + 1]
    assert uid.isdigit() and uid != "0"  # the sandbox's user, never root
    sbx.pty.resize(terminal.pid, PtySize(rows=40, cols=120))
    sbx.pty.send_stdin(terminal.pid, b"stty size; echo size$((1+1))\n")
    assert "40 120" in read_until(terminal, "size2")
    # another SDK object attaches: what the terminal showed is still in its ring
    other = Sandbox.connect(sbx.sandbox_id)
    attached = other.pty.connect(terminal.pid)
    assert "tty42m" in read_until(attached, "size2")
    # what the terminal runs writes the sandbox's files
    sbx.pty.send_stdin(terminal.pid, b"echo from-pty > ../pty.txt; echo wrote$((2*2))\n")
    read_until(terminal, "wrote4")
    assert sbx.files.read("/home/user/pty.txt") == "from-pty\n"
    assert terminal.pid in {p.pid for p in sbx.commands.list()}
    # a background job is a process group of its own; the kill takes it too (the terminal's whole session)
    sbx.pty.send_stdin(terminal.pid, b"sleep 654 & echo job$((2+3))\n")
    read_until(terminal, "job5")
    assert "sleep 654" in running(sbx)
    assert other.pty.kill(terminal.pid)
    with pytest.raises(CommandExitException) as killed:
        terminal.wait()
    assert "kill" in (killed.value.error or "")
    wait_until(lambda: "sleep 654" not in running(sbx), "the terminal's background job killed with it")
    attached.disconnect()
    wait_until(lambda: terminal.pid not in {p.pid for p in sbx.commands.list()}, "the killed terminal unlisted")


def test_exit_code_root_refused_and_a_crossed_call(sbx: Sandbox) -> None:
    terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    with pytest.raises(SandboxException, match="runs in a terminal"):
        sbx.commands.send_stdin(terminal.pid, "x")
    sbx.pty.send_stdin(terminal.pid, b"exit 7\n")
    with pytest.raises(CommandExitException) as ended:
        terminal.wait()
    assert ended.value.exit_code == 7
    with pytest.raises(SandboxException, match="one unprivileged user"):
        sbx.pty.create(PtySize(rows=24, cols=80), user="root")


def test_close_stdin_ends_a_commands_input_and_is_refused_for_a_terminal(sbx: Sandbox) -> None:
    # the sandbox claims an envd that closes stdin (0.5.2 and later): the SDK sends CloseStdin
    cat = sbx.commands.run("cat; echo closed", background=True, stdin=True)
    sbx.commands.send_stdin(cat.pid, "x\n")
    sbx.commands.close_stdin(cat.pid)
    assert cat.wait().stdout == "x\nclosed\n"
    terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    with pytest.raises(SandboxException, match="Ctrl-D"):
        sbx.commands.close_stdin(terminal.pid)
    read_until(terminal, "$ ")  # the prompt: the shell reads its input
    sbx.pty.send_stdin(terminal.pid, b"\x04")  # Ctrl-D at the prompt: the shell's input ends, and the shell
    assert terminal.wait().exit_code == 0


def test_endless_output_is_bounded(sbx: Sandbox) -> None:
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)
    terminal.disconnect()  # nobody watches: the ring keeps the latest output only
    sbx.pty.send_stdin(terminal.pid, b"head -c 5000000 /dev/zero | tr '\\0' x; echo; echo END$((1+1)); touch done\n")
    wait_until(lambda: sbx.files.exists("/home/user/done"), "the burst printed", timeout=120)
    seen = read_until(Sandbox.connect(sbx.sandbox_id).pty.connect(terminal.pid), "END2")
    assert "xxxx" in seen and len(seen) <= RING + 64 * 1024
    assert sbx.commands.run("echo still answers").stdout == "still answers\n"
    assert sbx.pty.kill(terminal.pid)


async def test_async_on_data_stream_input_and_the_sandbox_end(e2b_env: E2BGateway) -> None:
    sbx = await AsyncSandbox.create()
    try:
        printed = bytearray()
        saw = asyncio.Event()

        def on_data(data: bytes) -> None:
            printed.extend(data)
            if b"streamed5" in printed:
                saw.set()

        terminal = await sbx.pty.create(PtySize(rows=30, cols=90), on_data=on_data, timeout=0)
        async with asyncio.timeout(60):
            async with sbx.pty.stream_input(terminal.pid) as stream:
                await stream.send(b"echo stream")
                await stream.send("ed$((2+3))\n")
            await saw.wait()
        await sbx.kill()
        # the sandbox ended: its terminal's stream ends with it
        with pytest.raises((CommandExitException, SandboxException)):
            await terminal.wait()
    finally:
        await sbx.kill()
