"""E2B's SDK from PyPI (sync and async), unchanged, runs a sandbox's commands
through kernelgw's envd face against real kernel containers: ``commands.run``
with its cwd, envs, timeout and output callbacks, exit codes as E2B's
exceptions, background commands (wait, kill, stdin, ``connect`` from another
SDK object), ``list``; bad input (user root, another sandbox's pid, a command
that prints without end) gets a clear error and leaves the gateway working."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import docker
import httpx
import pytest
from e2b import CommandExitException, InvalidArgumentException, SandboxException, SandboxState, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox

from kernelgw.runtime.commands import OUTPUT_RING_BYTES
from tests.integration.conftest import assert_nothing_left, gateway_settings, start_gateway
from tests.integration.e2b.conftest import E2BGateway
from tests.support.metrics import metric
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def test_run_with_cwd_envs_and_callbacks(sbx: Sandbox) -> None:
    result = sbx.commands.run("echo hi")
    assert (result.stdout, result.stderr, result.exit_code) == ("hi\n", "", 0)
    # the sandbox's home is the code interpreter's working directory
    assert sbx.commands.run("pwd").stdout == "/home/user\n"
    sbx.files.make_dir("/home/user/sub")
    assert sbx.commands.run("pwd; ls ..", cwd="/home/user/sub").stdout == "/home/user/sub\nsub\n"
    assert sbx.commands.run("echo $GREETING", envs={"GREETING": "hello"}).stdout == "hello\n"
    out: list[str] = []
    err: list[str] = []
    sbx.commands.run("echo one; echo two >&2; echo three", on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == "one\nthree\n" and "".join(err) == "two\n"
    # what a command writes, the code interpreter reads: one workspace
    sbx.commands.run("echo from-bash > made.txt")
    assert sbx.run_code("open('made.txt').read() == 'from-bash\\n'").text == "True"
    assert sbx.files.read("/home/user/made.txt") == "from-bash\n"
    # bash -l: a login shell as E2B's, running as the sandbox's user, not root
    assert sbx.commands.run("id -u").stdout.strip() != "0"


def test_exit_codes_and_bad_input(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as caught:
        sbx.commands.run("echo out; echo err >&2; exit 3")
    assert (caught.value.exit_code, caught.value.stdout, caught.value.stderr) == (3, "out\n", "err\n")
    with pytest.raises(CommandExitException) as missing:
        sbx.commands.run("no-such-program")
    assert missing.value.exit_code == 127
    with pytest.raises(SandboxException, match="one unprivileged user"):
        sbx.commands.run("id", user="root")
    with pytest.raises(InvalidArgumentException, match="PATH"):
        sbx.commands.run("true", envs={"PATH": "/tmp"})
    with pytest.raises(SandboxException, match="outside"):
        sbx.commands.run("true", cwd="/etc")
    assert sbx.commands.run("echo still").stdout == "still\n"


def test_background_wait_kill_list_stdin_and_connect(sbx: Sandbox, e2b_env: E2BGateway) -> None:
    sleeper = sbx.commands.run("sleep 600", background=True)
    reader = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
    pids = {p.pid: p for p in sbx.commands.list()}
    assert {sleeper.pid, reader.pid} <= set(pids)
    assert pids[sleeper.pid].cmd == "/bin/bash" and pids[sleeper.pid].args[-1] == "sleep 600"
    sbx.commands.send_stdin(reader.pid, "hello\n")
    assert reader.wait().stdout == "got:hello\n"
    # another SDK object with the sandbox's id attaches to the running command
    other = Sandbox.connect(sbx.sandbox_id)
    counter = sbx.commands.run("for i in 1 2 3; do echo $i; sleep 0.2; done; sleep 600", background=True)
    attached = other.commands.connect(counter.pid)
    assert "".join(_take(attached, 3)) == "1\n2\n3\n"  # what it printed before too: the ring holds it
    assert sleeper.kill()
    with pytest.raises(CommandExitException) as killed:
        sleeper.wait()
    assert "kill" in (killed.value.error or "") and killed.value.exit_code != 0
    assert other.commands.kill(counter.pid)
    assert not sbx.commands.kill(999_999)  # unknown pid: False, as E2B's SDK says
    wait_until(
        lambda: sleeper.pid not in {p.pid for p in sbx.commands.list()}, "the killed command unlisted", timeout=30
    )


def _take(handle: object, lines: int) -> list[str]:
    """Stdout of an attached handle until ``lines`` lines came."""
    seen: list[str] = []
    for stdout, _, _ in handle:  # type: ignore[attr-defined]
        if stdout:
            seen.append(stdout)
            if "".join(seen).count("\n") >= lines:
                break
    return seen


def test_timeout_kills_and_endless_output_is_bounded(sbx: Sandbox) -> None:
    # the SDK's timeout ends its stream (TimeoutException, as with E2B) and kernelgw kills the command
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 600", timeout=2)
    wait_until(lambda: not sbx.commands.list(), "the timed-out command unlisted", timeout=30)
    # printing without end, watched by nobody: the gateway keeps the latest output only
    loud = sbx.commands.run("yes kernelgw", background=True, timeout=0)
    loud.disconnect()
    burst = "head -c 5000000 /dev/zero | tr '\\0' x; echo; echo END; touch done; sleep 600"
    printed = sbx.commands.run(burst, background=True, timeout=0)
    printed.disconnect()
    wait_until(lambda: sbx.files.exists("/home/user/done"), "the burst printed", timeout=60)
    seen = ""
    for stdout, _, _ in Sandbox.connect(sbx.sandbox_id).commands.connect(printed.pid):
        seen += stdout or ""
        if "END" in seen:
            break
    assert seen.endswith("x\nEND\n") and len(seen) <= OUTPUT_RING_BYTES + 64 * 1024
    assert sbx.commands.run("echo still answers").stdout == "still answers\n"
    assert sbx.commands.kill(loud.pid) and sbx.commands.kill(printed.pid)
    wait_until(lambda: not sbx.commands.list(), "the killed commands unlisted", timeout=30)


async def test_async_commands(e2b_env: E2BGateway) -> None:
    sbx = await AsyncSandbox.create(envs={"FROM_CREATE": "made"})
    try:
        result = await sbx.commands.run("echo async; echo e >&2")
        assert (result.stdout, result.stderr) == ("async\n", "e\n")
        # the env vars the sandbox was created with reach its commands, the call's own come on top
        both = await sbx.commands.run("echo $FROM_CREATE $MINE", envs={"MINE": "mine"})
        assert both.stdout == "made mine\n"
        handle = await sbx.commands.run("sleep 600", background=True)
        assert handle.pid in {p.pid for p in await sbx.commands.list()}
        assert await handle.kill()
        with pytest.raises(CommandExitException):
            await handle.wait()
    finally:
        await sbx.kill()


def test_another_sandboxs_commands_are_unreachable_and_end_with_it(e2b_env: E2BGateway) -> None:
    mine, theirs = Sandbox.create(), Sandbox.create()
    try:
        running = theirs.commands.run("sleep 600", background=True)
        assert mine.commands.list() == []
        assert not mine.commands.kill(running.pid)  # this sandbox has no such pid
        headers = {
            "E2b-Sandbox-Id": theirs.sandbox_id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": mine._envd_access_token or "",
        }
        with httpx.Client(base_url=e2b_env.url, headers=headers, timeout=30) as http:
            answer = http.post("/process.Process/List", json={})
            assert answer.status_code == 502 and "was not found" in answer.json()["message"], answer.text
            stdin = base64.b64encode(b"x").decode()
            body = {"process": {"pid": running.pid}, "input": {"stdin": stdin}}
            answer = http.post(
                "/process.Process/SendInput", content=json.dumps(body), headers={"Content-Type": "application/json"}
            )
            assert answer.status_code == 502, answer.text
        theirs.kill()
        # the sandbox ended: its command's stream ends with it
        with pytest.raises((CommandExitException, SandboxException)):
            running.wait()
    finally:
        mine.kill()
        theirs.kill()


def test_a_pause_ends_running_commands_and_a_command_wakes_the_sandbox(sbx: Sandbox) -> None:
    running = sbx.commands.run("sleep 600", background=True)
    sbx.pause()
    assert sbx.get_info().state == SandboxState.PAUSED
    with pytest.raises(CommandExitException) as ended:
        running.wait()
    assert "sandbox ended" in (ended.value.error or "")
    assert sbx.commands.run("echo awake").stdout == "awake\n"
    assert sbx.get_info().state == SandboxState.RUNNING
    assert sbx.commands.list() == []


def test_a_pooled_sandbox_s_commands_and_contexts_get_its_create_time_envs(
    docker_client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox from the warm pool: its container started before the create
    named any env var, and the kernel's were set after; its commands and its
    other contexts get them (and E2B's HOME) all the same. (Keys are off here:
    /metrics is open.)"""
    name = f"e2bp{os.getpid()}"
    gw = start_gateway(gateway_settings(gateway_name=name, data_dir=tmp_path, pool_size=1))
    try:
        E2BGateway(gw, "kgw_any").use(monkeypatch)
        with httpx.Client(base_url=gw.url, timeout=30) as http:
            wait_until(lambda: metric(http, "kernelgw_pool_ready") == 1, "a warm kernel", timeout=120)
            sbx = Sandbox.create(envs={"FROM_CREATE": "made"})
            try:
                assert metric(http, "kernelgw_pool_hits_total") == 1  # the create took the warm kernel
                env = sbx.run_code("import os; os.environ['FROM_CREATE'], os.environ['HOME']").text
                assert env == "('made', '/home/user')"
                assert sbx.commands.run("echo $FROM_CREATE $HOME").stdout == "made /home/user\n"
                context = sbx.create_code_context(language="python")  # another kernel in that container
                assert (
                    sbx.run_code("import os; os.environ['FROM_CREATE'], os.environ['HOME']", context=context).text
                    == "('made', '/home/user')"
                )
            finally:
                sbx.kill()
    finally:
        gw.stop()
        assert_nothing_left(docker_client, name)
