"""``user="root"`` for E2B's commands and terminal, allowed by the operator
(``e2b_root_commands``): root in a gVisor sandbox is the sandbox's own, with
the file capabilities it needs to use the sandbox's files, while the kernel
keeps none; under runc, where root would be the host's uid 0, it is refused
even when allowed (docs/security.md, "Root in a sandbox"). Both gateways run
their runtime whatever the pass (runsc is installed before either pass).
No ``ls`` here: runsc 20221219 answers coreutils' ``statx`` with EINVAL
(docs/security.md, gVisor), for root and the user alike."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from e2b import CommandExitException, PtySize, SandboxException
from e2b_code_interpreter import Sandbox

from tests.integration.conftest import gateway_with_key
from tests.integration.e2b.conftest import E2BGateway

pytestmark = pytest.mark.integration

FILE_CAPS = {1 << 0, 1 << 1, 1 << 2, 1 << 3}
"""CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER."""


def caps(status: str, field: str) -> int:
    match = re.search(rf"^{field}:\s*([0-9a-f]+)$", status, re.MULTILINE)
    assert match is not None, status
    return int(match[1], 16)


def sandbox_on(
    docker_client: docker.DockerClient, tmp_path: Path, runtime: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Sandbox]:
    name = f"e2broot{runtime}{os.getpid()}"
    with gateway_with_key(docker_client, tmp_path, name, runtime=runtime, e2b_root_commands=True) as (gw, key):
        for variable, value in E2BGateway(gw, key).env().items():
            monkeypatch.setenv(variable, value)
        sandbox = Sandbox.create(timeout=300)
        try:
            yield sandbox
        finally:
            sandbox.kill()


@pytest.fixture
def gvisor_sbx(
    docker_client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Sandbox]:
    yield from sandbox_on(docker_client, tmp_path, "runsc", monkeypatch)


@pytest.fixture
def runc_sbx(docker_client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    yield from sandbox_on(docker_client, tmp_path, "runc", monkeypatch)


def test_root_in_a_gvisor_sandbox_uses_its_files_and_the_kernel_keeps_no_capability(gvisor_sbx: Sandbox) -> None:
    sbx = gvisor_sbx
    assert sbx.commands.run("id -u", user="root").stdout == "0\n"
    assert sbx.commands.run("id -u").stdout.strip() != "0"  # the sandbox's user otherwise
    sbx.files.write("/home/user/mine.txt", "the user's")
    made = sbx.commands.run("cat /home/user/mine.txt; echo root > /home/user/root.txt; echo /home/user/*", user="root")
    assert made.stdout == "the user's/home/user/mine.txt /home/user/root.txt\n"  # (no ls: statx, below)
    assert sbx.files.read("/home/user/root.txt") == "root\n"  # root's file, readable by the user
    as_root = caps(sbx.commands.run("cat /proc/self/status", user="root").stdout, "CapEff")
    assert all(as_root & cap for cap in FILE_CAPS), hex(as_root)
    as_user = sbx.commands.run("cat /proc/self/status").stdout
    kernel = sbx.run_code("print(open('/proc/self/status').read())").logs.stdout[0]
    for status in (as_user, kernel):
        assert caps(status, "CapEff") == 0 and caps(status, "CapBnd") == 0
    terminal = sbx.pty.create(PtySize(rows=24, cols=80), user="root")
    sbx.pty.send_stdin(terminal.pid, b"exit $(id -u)\n")
    terminal.wait()  # exit 0: root's id
    # a file only root may read: the user's tools cannot read it, and a pause (which reads
    # the workspace as the user) fails and leaves the sandbox running as it was
    sbx.commands.run("echo secret > /home/user/root-only.txt; chmod 600 /home/user/root-only.txt", user="root")
    with pytest.raises(SandboxException):
        sbx.files.read("/home/user/root-only.txt")
    sbx.run_code("kept = 42")
    with pytest.raises(SandboxException) as paused:
        sbx.pause()
    assert paused.value.status_code == 400 and "root-only.txt" in str(paused.value), paused.value
    assert "Permission denied" in str(paused.value) and "make it readable or remove it" in str(paused.value)
    assert sbx.run_code("kept").text == "42"


def test_root_under_runc_is_refused_even_when_allowed(runc_sbx: Sandbox) -> None:
    sbx = runc_sbx
    with pytest.raises(SandboxException, match="gVisor") as refused:
        sbx.commands.run("id -u", user="root")
    assert "uid 0" in str(refused.value)
    with pytest.raises(SandboxException, match="gVisor"):
        sbx.pty.create(PtySize(rows=24, cols=80), user="root")
    with pytest.raises(CommandExitException):
        sbx.commands.run('test "$(id -u)" = 0')  # the sandbox's user is not root
