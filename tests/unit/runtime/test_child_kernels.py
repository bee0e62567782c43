"""Child kernels (E2B contexts): what runs where, the wrapper that starts them
(run here by the host's own /bin/sh), and the manager's rules for them on real
kernel subprocesses (tests/support/local_backend.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from kernelgw.config import Settings
from kernelgw.errors import ChildNotFound, KernelNotInImage, SessionLimitReached
from kernelgw.image.bundle import bundle_script
from kernelgw.kernels import BUNDLE_START_DIR, CODE_INTERPRETER_BUNDLE, bundle_image, image_kernels
from kernelgw.keys import KeyQuotas, Principal
from kernelgw.runtime.backends.base import KernelState
from kernelgw.runtime.backends.child_kernels import (
    CWD_MISSING_EXIT,
    IMAGE_START,
    kernel_argv,
    wrapped,
)
from kernelgw.runtime.backends.child_kernels import (
    KernelNotInImage as NotInImage,
)
from kernelgw.runtime.manager import MAX_CHILDREN, SessionManager, SessionOptions
from kernelgw.storage import audit
from kernelgw.storage.store import Store
from tests.support.local_backend import LocalBackend
from tests.support.waiting import until, wait_until


# ---------------------------------------------------------------- what runs where
def test_an_image_holds_its_kernel_and_python() -> None:
    assert image_kernels("python3") == ("python3",)
    assert image_kernels("deno") == ("deno", "python3")


def test_a_kernel_starts_by_its_image_s_entry_point_or_as_python() -> None:
    assert kernel_argv("deno", "deno", "/conn/c1/kernel.json") == [IMAGE_START, "/conn/c1/kernel.json"]
    python = kernel_argv("python3", "deno", "/conn/c1/kernel.json")
    assert python[:2] == ["/bin/sh", "-c"] and python[-1] == "/conn/c1/kernel.json"
    assert "kernelgw_kernel.launcher" in python[2] and '-f "$1"' in python[2]
    with pytest.raises(NotInImage, match="the python3 image holds python3 kernels, not deno"):
        kernel_argv("deno", "python3", "/conn/c1/kernel.json")


def test_the_code_interpreter_image_holds_every_e2b_language_each_started_from_its_own_path() -> None:
    image = bundle_image(CODE_INTERPRETER_BUNDLE)
    assert image_kernels("python3", image) == ("python3", "deno", "bash", "java", "ir")
    assert image_kernels("python3", "kernelgw/python:latest") == ("python3",)  # by its name, not its kernel
    assert kernel_argv("python3", "python3", "/conn/c1/kernel.json", image) == [IMAGE_START, "/conn/c1/kernel.json"]
    for kernel in ("deno", "ir", "java", "bash"):
        argv = kernel_argv(kernel, "python3", "/conn/c1/kernel.json", image)
        assert argv == [f"{BUNDLE_START_DIR}/{kernel}/start-kernel", "/conn/c1/kernel.json"]
    with pytest.raises(NotInImage, match=r"kernelgw/code-interpreter:latest image holds .* not ruby"):
        kernel_argv("ruby", "python3", "/conn/c1/kernel.json", image)


def test_the_bundle_script_installs_each_language_from_build_and_keeps_python_s_start() -> None:
    script = bundle_script(("python3", "deno", "ir"))
    lines = script.splitlines()
    assert lines[1] == f"install -D -m 0755 /opt/kernelgw/start-kernel {BUNDLE_START_DIR}/python3/start-kernel"
    deno, ir = lines.index("ln -sfn /bundle/deno /build"), lines.index("ln -sfn /bundle/ir /build")
    assert deno < ir and lines[deno + 1] == lines[ir + 1] == "sh -eu /build/install.sh"
    assert lines[deno + 2].endswith(f"/opt/kernelgw/start-kernel {BUNDLE_START_DIR}/deno/start-kernel")
    # Python's start is the image's own again at the end
    assert f"install -m 0755 {BUNDLE_START_DIR}/python3/start-kernel /opt/kernelgw/start-kernel" in lines[-2]


def test_a_child_s_death_is_named_with_what_is_known() -> None:
    state = KernelState(status="exited", exit_code=1, detail="ModuleNotFoundError: no module named x")
    assert state.describe() == "the kernel exited with code 1 (ModuleNotFoundError: no module named x)"
    assert KernelState(status="exited", exit_code=137).describe() == "the kernel was killed by signal 9"


# ---------------------------------------------------------------- the wrapper, in a real shell
def test_the_wrapper_refuses_a_working_directory_that_is_not_there(tmp_path: Path) -> None:
    done = subprocess.run(wrapped(["true"], str(tmp_path / "nope")), capture_output=True, text=True, timeout=30)
    assert done.returncode == CWD_MISSING_EXIT
    assert f"the working directory {tmp_path / 'nope'} does not exist" in done.stderr


def test_the_wrapper_keeps_the_exec_s_pid_and_enters_the_directory(tmp_path: Path) -> None:
    done = subprocess.run(
        ["/bin/sh", "-c", 'echo "$$"; exec "$@"', "sh", *wrapped(["/bin/sh", "-c", 'echo "$$"; pwd'], str(tmp_path))],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    first, second, cwd = done.stdout.split()
    assert first == second and cwd == str(tmp_path)


def test_the_kernel_s_group_ends_when_the_gateway_s_connection_closes(tmp_path: Path) -> None:
    """stdin is the gateway's connection: its end kills the kernel and what it started."""
    grandchild = tmp_path / "grandchild.pid"
    kernel = ["/bin/sh", "-c", f"sleep 300 & echo $! > {grandchild}.part && mv {grandchild}.part {grandchild}; wait"]
    process = subprocess.Popen(wrapped(kernel, str(tmp_path)), stdin=subprocess.PIPE, start_new_session=True)
    try:
        wait_until(grandchild.exists, "the kernel to start a process of its own")
        pid = int(grandchild.read_text())
        assert process.poll() is None  # nothing ends it while the connection is open
        assert process.stdin is not None
        process.stdin.close()
        assert process.wait(timeout=30) == -signal.SIGKILL
        wait_until(lambda: not _alive(pid), "the kernel's own child to end with it")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


# ---------------------------------------------------------------- the manager's rules
@pytest.fixture
async def manager(local_backend: LocalBackend, tmp_path: Path) -> AsyncIterator[SessionManager]:
    settings = Settings(data_dir=tmp_path, max_memory_mb=2048, state_poll_s=0.1, pool_size=0, max_sessions_per_key=1)
    manager = SessionManager(settings, local_backend)
    yield manager
    await manager.shutdown()


def owner(key_id: str = "alice") -> Principal:
    return Principal(key_id=key_id, name=key_id, role="user", quotas=KeyQuotas())


async def run(session: Any, code: str) -> str:
    rec = session.submit(code)
    done = await asyncio.wait_for(rec.done, 60)
    assert done.status == "ok", done
    return "".join(getattr(p.event, "data", {}).get("text/plain", "") for p in rec.published if p.event is not None)


async def test_children_are_the_parent_s_neither_listed_nor_counted_and_bounded(
    manager: SessionManager, local_backend: LocalBackend
) -> None:
    parent = await manager.create(SessionOptions(), owner())
    child = await manager.create_child(parent, "python3")
    assert child.owner == parent.owner and child.parent is parent
    assert manager.list(owner()) == [parent] and len(manager) == 1  # the key's one session is still one
    other = await manager.create(SessionOptions(), owner("bob"))
    with pytest.raises(ChildNotFound):  # another session holds no such child
        manager.get_child(other, child.id)
    await manager.delete(other.id)
    with pytest.raises(KernelNotInImage, match="holds the python3 kernels, not deno"):
        await manager.create_child(parent, "deno")
    for _ in range(MAX_CHILDREN - 1):
        await manager.create_child(parent, "python3")
    with pytest.raises(SessionLimitReached, match=f"maximum of {MAX_CHILDREN} contexts"):
        await manager.create_child(parent, "python3")
    # a name is a default: asked again, the same child
    await manager.delete_child(parent, child.id)
    named = await manager.create_child(parent, "python3", name="default:python")
    assert await manager.create_child(parent, "python3", name="default:python") is named
    await manager.delete(parent.id)
    assert named.state == "closed" and not local_backend.running()


async def test_a_busy_child_keeps_its_parent_from_being_reaped(manager: SessionManager) -> None:
    parent = await manager.create(SessionOptions(), owner())
    child = await manager.create_child(parent, "python3")
    rec = child.submit("import time\nwhile True: time.sleep(0.05)")
    await until(_running(child, rec), "the child's cell to run")
    manager.settings.idle_timeout_s = 0
    parent.last_activity -= 10
    assert parent.id not in await manager.reap_idle()
    assert manager.list(owner()) == [parent]
    await child.interrupt()
    await asyncio.wait_for(rec.done, 30)
    assert parent.id in await manager.reap_idle()
    assert child.state == "closed"


def _running(child: Any, rec: Any) -> Any:
    async def check() -> bool:
        return bool(child.current_execution is rec)

    return check


async def test_a_child_s_cells_are_audited_as_its_parent_s(local_backend: LocalBackend, tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'history.db'}", gateway_name="unit", purge_interval_s=0)
    await store.start()
    manager = SessionManager(
        Settings(data_dir=tmp_path, pool_size=0, state_poll_s=0.1, on_shutdown="stop"), local_backend, store
    )
    try:
        parent = await manager.create(SessionOptions(), owner())
        child = await manager.create_child(parent, "python3")
        await run(child, "6 * 7")
        await child.restart("asked")
        rows = await audit.query(store, session_id=parent.id)
        execution = next(r for r in rows if r.kind == "execution")
        assert (execution.code, execution.key_id, execution.status) == ("6 * 7", "alice", "ok")
        assert execution.detail is not None and execution.detail.startswith(f"context {child.id}")
        restarted = next(r for r in rows if r.kind == "kernel_restarted")
        assert restarted.detail == f"context {child.id}: asked"
        assert not await audit.query(store, session_id=child.id)  # no session of its own in the store
    finally:
        await manager.shutdown()
        await store.close()
