"""E2B's contexts through its code-interpreter SDK from PyPI, unchanged, against a
real gateway and real kernel containers: each context is a kernel of its own,
a process in its sandbox's container (`kernelgw.runtime.backends.child_kernels`),
so variables are apart and files shared; a deno template's sandbox runs
JavaScript and Python side by side; one context's stuck cell leaves the others
running; a killed sandbox leaves no container and no socket directory; a
language the image lacks is a clear error; another sandbox's token reaches none
of its contexts; under gVisor too."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from e2b import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import Sandbox

from kernelgw.runtime.backends.base import KernelHandle, KernelHost
from kernelgw.runtime.backends.docker import DockerBackend
from tests.integration.conftest import (
    RUNTIME,
    assert_nothing_left,
    conn_dir_of,
    gateway_settings,
    make_key,
    remove_everything,
    start_gateway,
)
from tests.integration.e2b.conftest import E2BGateway

pytestmark = pytest.mark.integration

DENO_TEMPLATE = "deno-contexts"


@pytest.fixture(scope="module")
def e2b_gateway(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BGateway]:
    """A gateway with keys required that offers a deno template besides the default one."""
    yield from _gateway(docker_client, tmp_path_factory, f"ctx{os.getpid()}")


def _gateway(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory, name: str, **overrides: Any
) -> Iterator[E2BGateway]:
    data_dir: Path = tmp_path_factory.mktemp(name)
    key = make_key(data_dir, name)
    settings = gateway_settings(
        gateway_name=name,
        data_dir=data_dir,
        auth="required",
        kernels=["python3", "deno"],
        e2b_templates={DENO_TEMPLATE: "deno", "code-interpreter-v1": "python3"},  # pinned (gateway_settings)
        **overrides,
    )
    gw = start_gateway(settings)
    try:
        yield E2BGateway(gw, key)
    finally:
        gw.stop()
        try:
            assert_nothing_left(docker_client, name)
            runtime = settings.runtime_dir / name
            assert not runtime.exists() or not any(runtime.iterdir()), f"left in {runtime}: {list(runtime.iterdir())}"
        finally:
            remove_everything(docker_client, name)


@pytest.fixture
def deno_sbx(e2b_env: E2BGateway) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(template=DENO_TEMPLATE, timeout=300)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def _container(docker_client: docker.DockerClient, sandbox_id: str) -> Any:
    (container,) = docker_client.containers.list(filters={"label": f"kernelgw.session={sandbox_id}"})
    return container


def test_two_python_contexts_keep_variables_apart_and_share_files(sbx: Sandbox) -> None:
    sbx.run_code("x = 'default'\nopen('/home/user/shared.txt', 'w').write('written by the default')")
    ctx = sbx.create_code_context(language="python")
    assert (ctx.language, ctx.cwd) == ("python", "/home/user")
    assert sbx.run_code("'x' in dir()", context=ctx).text == "False"
    assert sbx.run_code("open('shared.txt').read()", context=ctx).text == "written by the default"
    sbx.run_code("x = 'ctx'\nopen('from_ctx.txt', 'w').write('back')", context=ctx)
    assert sbx.run_code("x, open('/home/user/from_ctx.txt').read()").text == "('default', 'back')"
    # the sandbox's uid, no capability, no network: as its own kernel
    probe = (
        "import os, socket\n"
        "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm', 'CapBnd'))]\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2); net = True\n"
        "except OSError:\n    net = False\n"
        "(os.getuid(), caps, net)"
    )
    assert sbx.run_code(probe, context=ctx).text == sbx.run_code(probe).text
    assert sbx.run_code(probe, context=ctx).text.endswith(
        "['0000000000000000', '0000000000000000', '0000000000000000'], False)"
    )
    assert [c.id for c in sbx.list_code_contexts()][1:] == [ctx.id]


def test_deno_sandbox_runs_javascript_and_python_side_by_side(deno_sbx: Sandbox) -> None:
    js = deno_sbx.run_code("const n: number = 6 * 7; n")
    assert js.error is None and js.text == "42", js
    py = deno_sbx.run_code(
        "import sys\nopen('/home/user/py.txt', 'w').write('from python')\nsys.version_info[0]", language="python"
    )
    assert py.error is None and py.text == "3", py
    assert deno_sbx.run_code("Deno.readTextFileSync('/home/user/py.txt')", language="javascript").text == "from python"
    assert deno_sbx.run_code("n + 1").text == "43"  # the default context kept its state
    contexts = {c.language: c for c in deno_sbx.list_code_contexts()}
    assert set(contexts) == {"javascript", "python"}
    # the language's default context is made once, then reused
    deno_sbx.run_code("y = 5", language="python")
    assert deno_sbx.run_code("y * 2", context=contexts["python"]).text == "10"
    # and a second javascript context is a kernel of its own
    js2 = deno_sbx.create_code_context(language="js")
    assert js2.language == "javascript"
    gone = deno_sbx.run_code("typeof n", context=js2)
    assert gone.text == "undefined", gone


def test_a_stuck_context_leaves_the_others_running(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context()
    pid = int(sbx.run_code("import os; os.getpid()", context=ctx).text or 0)
    with pytest.raises(TimeoutException):
        sbx.run_code("import time\nwhile True: time.sleep(0.1)", context=ctx, timeout=3)
    # the default context answers at once meanwhile, and the context's cell was interrupted
    assert sbx.run_code("'free'").text == "free"
    assert sbx.run_code("1 + 1", context=ctx, timeout=30).text == "2"
    # a context busy with a cell does not hold the default one: the cell waits for the default's file
    done: list[str | None] = []
    waiting = "import os, time\nwhile not os.path.exists('/home/user/go'): time.sleep(0.05)\n'went'"
    thread = threading.Thread(target=lambda: done.append(sbx.run_code(waiting, context=ctx, timeout=60).text))
    thread.start()
    try:
        sbx.run_code("open('/home/user/go', 'w').close()")
    finally:
        thread.join(60)
    assert done == ["went"]
    # removing the context ends its process, not the sandbox's kernel
    sbx.remove_code_context(ctx)
    assert sbx.run_code(f"import os; os.path.exists('/proc/{pid}')").text == "False"
    with pytest.raises(NotFoundException, match="removed"):
        sbx.run_code("1", context=ctx)


def test_killing_the_sandbox_ends_every_context_and_leaves_nothing(
    sbx: Sandbox, docker_client: docker.DockerClient
) -> None:
    contexts = [sbx.create_code_context() for _ in range(2)]
    for ctx in contexts:
        assert sbx.run_code("1", context=ctx).text == "1"
    container = _container(docker_client, sbx.sandbox_id)
    conn_dir = Path(conn_dir_of(container))
    assert len([d for d in conn_dir.iterdir() if d.name.startswith("c") and d.is_dir()]) == 2
    sbx.kill()
    with pytest.raises(docker.errors.NotFound):
        container.reload()
    assert not conn_dir.exists()
    assert not docker_client.containers.list(all=True, filters={"label": f"kernelgw.session={sbx.sandbox_id}"})


def test_a_language_the_image_lacks_is_a_clear_error(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match=r"400.*'r' needs the ir kernel.*does not hold"):
        sbx.create_code_context(language="r")
    with pytest.raises(SandboxException, match=rf"400.*'javascript' needs the deno kernel.*\['{DENO_TEMPLATE}'\]"):
        sbx.run_code("1", language="javascript")
    assert [c.language for c in sbx.list_code_contexts()] == ["python"]


def test_another_sandboxs_token_reaches_no_context(sbx: Sandbox, e2b_env: E2BGateway) -> None:
    ctx = sbx.create_code_context()
    other = Sandbox.create(timeout=300)
    try:
        with httpx.Client(base_url=e2b_env.url, timeout=60) as http:
            headers = {"E2b-Sandbox-Port": "49999", "Content-Type": "application/json"}
            # the context's sandbox with the other's token: no sandbox at all
            wrong_token = {
                **headers,
                "E2b-Sandbox-Id": sbx.sandbox_id,
                "X-Access-Token": other._envd_access_token or "",
            }
            response = http.post("/execute", json={"code": "1", "context_id": ctx.id}, headers=wrong_token)
            assert response.status_code == 502, response.text
            # the other sandbox, rightly reached, holds no such context
            with pytest.raises(NotFoundException, match=f"Context {ctx.id} not found"):
                other.run_code("1", context=ctx)
            with pytest.raises(NotFoundException):
                other.remove_code_context(ctx)
        assert sbx.run_code("'still mine'", context=ctx).text == "still mine"
    finally:
        other.kill()


def test_contexts_under_gvisor(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "runsc" in docker_client.info().get("Runtimes", {}), "gVisor is not registered: run scripts/ensure-runsc.sh"
    for gw in _gateway(docker_client, tmp_path_factory, f"ctg{os.getpid()}", runtime="runsc"):
        gw.use(monkeypatch)
        sbx = Sandbox.create(timeout=300)
        try:
            assert _container(docker_client, sbx.sandbox_id).attrs["HostConfig"]["Runtime"] == "runsc"
            sbx.run_code("x = 1\nopen('g.txt', 'w').write('gvisor')")
            ctx = sbx.create_code_context()
            assert sbx.run_code("'x' in dir(), open('g.txt').read()", context=ctx).text == "(False, 'gvisor')"
            with pytest.raises(TimeoutException):
                sbx.run_code("import time\nwhile True: time.sleep(0.1)", context=ctx, timeout=3)
            assert sbx.run_code("2", context=ctx, timeout=30).text == "2"
            assert sbx.run_code("x").text == "1"
        finally:
            sbx.kill()


def test_contexts_do_not_outlive_a_gateway_restart(
    docker_client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that keeps its kernels (on_shutdown=keep): the sandbox and its
    default context's variables are kept, its other contexts are not (their
    processes end, their socket directories go)."""
    name, data_dir = f"ctxr{os.getpid()}", tmp_path / "data"
    key = make_key(data_dir, name)
    settings = gateway_settings(gateway_name=name, data_dir=data_dir, auth="required", on_shutdown="keep")
    try:
        first = start_gateway(settings)
        try:
            E2BGateway(first, key).use(monkeypatch)
            sbx = Sandbox.create(timeout=600)
            sbx.run_code("x = 41")
            ctx = sbx.create_code_context()
            pid = sbx.run_code("import os; os.getpid()", context=ctx).text
        finally:
            first.stop()
        conn_dir = Path(conn_dir_of(_container(docker_client, sbx.sandbox_id)))
        second = start_gateway(settings)
        try:
            E2BGateway(second, key).use(monkeypatch)
            again = Sandbox.connect(sbx.sandbox_id, timeout=60)
            assert again.run_code("x + 1").text == "42"
            assert again.run_code(f"import os; os.path.exists('/proc/{pid}')").text == "False"
            assert [c.language for c in again.list_code_contexts()] == ["python"]
            with pytest.raises(NotFoundException, match=f"Context {ctx.id} not found"):
                again.run_code("1", context=ctx)
            assert not [d for d in conn_dir.iterdir() if d.is_dir()]  # the context's socket directory went
            assert again.kill()
        finally:
            second.stop()
    finally:
        remove_everything(docker_client, name)
    assert_nothing_left(docker_client, name)


def test_a_child_kernel_ends_when_its_gateway_goes_away(docker_client: docker.DockerClient) -> None:
    """A gateway that dies (no stop, no detach) only drops its connections: the
    child's watchdog then kills the child kernel's process group, so it does not
    run on unwatched in a sandbox a later gateway reattaches. The sandbox's
    kernel (its container) is untouched."""
    from tests.integration.languages import RUNTIME_DIR, kernel_spec

    name = f"ctxw{os.getpid() % 100000}{secrets.token_hex(2)}"
    backend = DockerBackend(gateway_name=name, runtime_dir=RUNTIME_DIR)
    spec = kernel_spec("kernelgw/python:latest")

    async def alive(host: KernelHandle, pid: int) -> bool:
        process = await backend.exec(host, ["/bin/sh", "-c", 'kill -0 "$1" 2>/dev/null && echo yes', "sh", str(pid)])
        try:
            out = b""
            while chunk := await process.read():
                out += chunk
            return out.strip() == b"yes"
        finally:
            await process.close()

    async def scenario() -> None:
        host = await backend.start(spec)
        try:
            child_spec = dataclasses.replace(spec, host=KernelHost(host, "python3", "/home/user"))
            child = await backend.start(child_spec)
            pid = backend.children._children[child.kernel_id].process.pid
            deadline = asyncio.get_running_loop().time() + 60
            while not (child.conn_dir / "k-5").exists():  # the kernel is up: it bound its sockets, and waits
                assert asyncio.get_running_loop().time() < deadline, "the child kernel did not bind its sockets"
                await asyncio.sleep(0.05)
            assert await alive(host, pid)
            assert (await backend.state(child)).alive
            await backend.children.close()  # what the gateway process's exit does to its connections
            deadline = asyncio.get_running_loop().time() + 30
            while await alive(host, pid):
                assert asyncio.get_running_loop().time() < deadline, "the child kernel outlived its connection"
                await asyncio.sleep(0.05)
            assert (await backend.state(host)).alive  # the sandbox's kernel goes on
        finally:
            await backend.stop(host)
            await backend.end_session(spec.session_id)
            await backend.close()

    try:
        asyncio.run(scenario())
    finally:
        remove_everything(docker_client, name)
    assert_nothing_left(docker_client, name)


def test_a_pause_ends_the_contexts_and_the_resumed_sandbox_makes_new_ones(sbx: Sandbox) -> None:
    sbx.run_code("kept = 'in the snapshot'")
    ctx = sbx.create_code_context()
    sbx.run_code("lost = 1", context=ctx)
    assert sbx.pause()
    with pytest.raises(NotFoundException, match="paused: contexts besides its default are not kept"):
        sbx.run_code("lost", context=ctx)
    assert sbx.run_code("kept").text == "in the snapshot"  # the default context resumed the sandbox
    fresh = sbx.create_code_context()
    assert sbx.run_code("'lost' in dir(), open('/proc/self/status').read().count('Uid')", context=fresh).text == (
        "(False, 1)"
    )


def test_a_context_says_so_when_the_sandbox_s_kernel_died(sbx: Sandbox) -> None:
    """The container ends with the sandbox's own kernel, and its contexts with it."""
    ctx = sbx.create_code_context()
    assert sbx.run_code("1", context=ctx).text == "1"
    died = sbx.run_code("import os; os._exit(3)")
    assert died.error is not None, died
    after = sbx.run_code("1", context=ctx)
    assert after.error is not None and "the sandbox's container stopped" in after.error.value, after.error
    sbx.restart_code_context(sbx.list_code_contexts()[0])  # the sandbox's kernel again, its contexts gone
    assert sbx.run_code("2").text == "2"
    assert [c.id for c in sbx.list_code_contexts()][1:] == []


def test_a_context_works_in_its_cwd_and_one_that_is_not_there_is_named(sbx: Sandbox) -> None:
    sbx.run_code("import os; os.makedirs('/home/user/proj/sub', exist_ok=True)")
    ctx = sbx.create_code_context(cwd="/home/user/proj/sub")
    assert ctx.cwd == "/home/user/proj/sub"
    assert sbx.run_code("import os; os.getcwd()", context=ctx).text == "/workspace/proj/sub"
    with pytest.raises(SandboxException, match=r"400.*The working directory /nowhere does not exist"):
        sbx.create_code_context(cwd="/nowhere")
    assert len(sbx.list_code_contexts()) == 2


def test_a_context_that_runs_out_of_memory_is_named(sbx: Sandbox) -> None:
    """The sandbox's memory limit holds for all its kernels (one cgroup): a context
    past it is killed, out-of-memory. Under runc the kernel killer takes that
    process and the sandbox's kernel lives on; under gVisor the whole sandbox
    goes (its Sentry is the cgroup's one process), the default context too."""
    sbx.run_code("kept = 'alive'")
    ctx = sbx.create_code_context()
    hog = sbx.run_code("chunks = []\nwhile True: chunks.append(bytearray(64 << 20))", context=ctx, timeout=120)
    assert hog.error is not None and hog.error.name == "OutOfMemory", hog.error
    if RUNTIME == "runsc":
        gone = sbx.run_code("kept")
        assert gone.error is not None and gone.error.name in ("OutOfMemory", "KernelDied"), gone.error
        sbx.restart_code_context(sbx.list_code_contexts()[0])  # the sandbox again; its contexts went with it
        assert sbx.run_code("'kept' in dir()").text == "False"
        return
    assert sbx.run_code("kept").text == "alive"
    sbx.restart_code_context(ctx)  # a fresh kernel for the context
    assert sbx.run_code("'chunks' in dir()", context=ctx).text == "False"


def test_a_context_cannot_touch_the_sockets_the_gateway_follows(sbx: Sandbox) -> None:
    """Once sealed, /conn lets the sandbox's uid pass through (a context's own
    directory is in it), but not list, add, rename or remove anything there, nor
    list or change a sealed context's own directory."""
    ctx = sbx.create_code_context()
    assert sbx.run_code("1", context=ctx).text == "1"  # started and sealed
    probe = (
        "import os\n"
        "def tries(f, *a):\n"
        "    try:\n        f(*a); return 'done'\n"
        "    except OSError as e:\n        return type(e).__name__\n"
        "mine = [a for a in open('/proc/self/cmdline').read().split('\\0') if a.startswith('/conn/')]\n"
        "own = os.path.dirname(mine[0]) if mine else '/conn'\n"
        "' '.join([tries(os.listdir, '/conn'), tries(os.mkdir, '/conn/x'), tries(os.rename, '/conn/k-1', '/conn/k-9'),"
        " tries(os.unlink, '/conn/k-2'), tries(os.symlink, '/etc/passwd', '/conn/k-7'), tries(os.listdir, own),"
        " tries(os.unlink, own + '/k-1')])"
    )
    expected = " ".join(["PermissionError"] * 7)
    assert sbx.run_code(probe).text == expected
    assert sbx.run_code(probe, context=ctx).text == expected
    assert sbx.run_code("own", context=ctx).text.startswith("/conn/c")  # the context's own directory was tried
    assert sbx.run_code("1 + 1").text == "2" and sbx.run_code("1 + 1", context=ctx).text == "2"
