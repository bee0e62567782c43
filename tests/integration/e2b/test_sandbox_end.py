"""What runs in a sandbox ends with it: its commands, terminal and directory
watches, when it is killed or paused, E2B's SDK unchanged (async), under runc
and in scripts/test.sh's runsc pass. Under gVisor the engine keeps a removed
container's exec streams open, so this holds only because the gateway ends
them itself (`kernelgw.runtime.backends.docker_command.OpenCommands`); the
streams have no timeout here (``timeout=0``), as an agent's often have, so a
stream left open would hang its ``wait()``: each wait is bounded by the test."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from e2b import CommandExitException, PtySize, SandboxException
from e2b_code_interpreter import AsyncSandbox

from tests.integration.e2b.conftest import E2BGateway

pytestmark = pytest.mark.integration
ENDS_WITHIN_S = 60.0
"""A bound on the wait for each end (it comes within a second or two): past
it the stream was left open, and the test fails instead of hanging."""


async def start_everything(sbx: AsyncSandbox) -> tuple[list[Any], asyncio.Future[Exception | None]]:
    """Two background commands, a terminal and a watch of the home directory,
    none with a timeout; returns the handles to wait on and the watch's exit."""
    commands = [await sbx.commands.run(f"sleep 60{n}", background=True, timeout=0) for n in range(2)]
    terminal = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=lambda _: None, timeout=0)
    watch_exit: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def on_exit(error: Exception | None) -> None:
        if not watch_exit.done():
            watch_exit.set_result(error)

    await sbx.files.watch_dir("/home/user", on_event=lambda _: None, on_exit=on_exit, timeout=0)
    return [*commands, terminal], watch_exit


async def assert_each_ended(handles: list[Any], watch_exit: asyncio.Future[Exception | None]) -> list[str]:
    """Every handle's wait ends with E2B's error for an ended process, and the
    watch's stream ends; returns the commands' errors."""
    errors = []
    for handle in handles:
        with pytest.raises((CommandExitException, SandboxException)) as ended:
            async with asyncio.timeout(ENDS_WITHIN_S):
                await handle.wait()
        errors.append(str(getattr(ended.value, "error", None) or ended.value))
    async with asyncio.timeout(ENDS_WITHIN_S):
        await watch_exit
    return errors


async def test_a_killed_sandbox_ends_its_commands_terminal_and_watches(e2b_env: E2BGateway) -> None:
    sbx = await AsyncSandbox.create()
    try:
        handles, watch_exit = await start_everything(sbx)
        assert len(await sbx.commands.list()) == 3  # the two commands and the terminal
        await sbx.kill()
        await assert_each_ended(handles, watch_exit)
    finally:
        await sbx.kill()


async def test_a_paused_sandbox_ends_them_and_says_why(e2b_env: E2BGateway) -> None:
    sbx = await AsyncSandbox.create()
    try:
        handles, watch_exit = await start_everything(sbx)
        await sbx.pause()
        errors = await assert_each_ended(handles, watch_exit)
        assert all("sandbox ended" in error for error in errors), errors
        # and the sandbox wakes with none of them running
        assert (await sbx.commands.run("echo awake")).stdout == "awake\n"
        assert await sbx.commands.list() == []
    finally:
        await sbx.kill()
