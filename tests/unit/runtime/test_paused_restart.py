"""A restart of a paused session, on real kernel processes without an engine: the
new kernel gets the snapshot's files, not its variables (with replay: what its
cells rebuild); the snapshot is removed and its bytes go back to the budget and
its gauge; the store no longer has the session paused; a restart that fails
leaves it paused, snapshot kept; and a fork or delete meeting a restart waits
for it (the session's lifecycle lock), whichever came first.

A pause copies files with ``tar`` in the container, which a kernel subprocess
has not: here the snapshot's workspace part is made and unpacked with Python's
tarfile from and to the kernel's own directory (`LocalBackend`), and unpacking
can be held at a gate. The variables are pickled by the image's helper in the
kernel, as in a container. tests/integration/test_pause.py runs the same on real
containers, through the faces."""

from __future__ import annotations

import asyncio
import shutil
import tarfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelgw.config import Settings
from kernelgw.errors import KernelStartFailed
from kernelgw.runtime import manager as manager_module
from kernelgw.runtime import pause
from kernelgw.runtime import session as session_module
from kernelgw.runtime.backends.base import Backend, KernelHandle
from kernelgw.runtime.manager import SessionManager, SessionOptions
from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.pause import SnapshotBudget
from kernelgw.runtime.session import KernelSession
from kernelgw.storage.store import Store
from tests.support.local_backend import LocalBackend
from tests.support.waiting import until
from tests.unit.runtime.test_session import run, stdout

ManagerFactory = Callable[..., SessionManager]
WORKSPACE_PART = "workspace.tar"
CHECK = "import os\nprint(globals().get('x'), open('kept.txt').read(), os.path.exists('.kernelgw-namespace'))"


class Gate:
    """Where a restore of a snapshot into a kernel waits (open unless closed)."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.entered = asyncio.Event()
        self.fail: Exception | None = None

    def close(self) -> None:
        self.open.clear()
        self.entered.clear()


def pack(workspace: Path, directory: Path) -> int:
    """The workspace into a fresh snapshot directory; returns its bytes."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o700)
    with tarfile.open(directory / WORKSPACE_PART, "w") as tar:
        tar.add(workspace, arcname=".")
    return (directory / WORKSPACE_PART).stat().st_size


def unpack(directory: Path, workspace: Path) -> int:
    with tarfile.open(directory / WORKSPACE_PART) as tar:
        tar.extractall(workspace, filter="data")
    return (directory / WORKSPACE_PART).stat().st_size


def copy(source: Path, target: Path) -> int:
    shutil.copytree(source, target, dirs_exist_ok=True)
    return sum(f.stat().st_size for f in target.rglob("*") if f.is_file())


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """Snapshots and forks through the kernels' workspace directories; the
    namespace file in the kernel's working directory (the workspace), where the
    container has it. Opened at the end, so a failed test's restart does not
    hold its manager."""
    gate = Gate()

    async def save_files(
        backend: Backend,
        handle: KernelHandle,
        directory: Path,
        timeout: float,
        caps: dict[str, int],
        budget: SnapshotBudget | None = None,
    ) -> int:
        size = await asyncio.to_thread(pack, handle.conn_dir / "workspace", directory)
        if budget is not None:
            budget.take(size)
        return size

    async def restore_files(backend: Backend, handle: KernelHandle, directory: Path, timeout: float) -> int:
        gate.entered.set()
        await gate.open.wait()
        if gate.fail is not None:
            raise gate.fail
        return await asyncio.to_thread(unpack, directory, handle.conn_dir / "workspace")

    async def copy_session_files(
        backend: Backend, source: KernelHandle, target: KernelHandle, timeout: float, caps: Any = None
    ) -> int:
        return await asyncio.to_thread(copy, source.conn_dir / "workspace", target.conn_dir / "workspace")

    monkeypatch.setattr(manager_module, "copy_session_files", copy_session_files)
    monkeypatch.setattr(session_module, "save_files", save_files)
    monkeypatch.setattr(session_module, "restore_files", restore_files)
    monkeypatch.setattr(pause, "NAMESPACE_FILE", ".kernelgw-namespace")
    yield gate
    gate.fail = None
    gate.open.set()


@pytest.fixture
async def make_manager(local_backend: LocalBackend, store: Store, tmp_path: Path) -> AsyncIterator[ManagerFactory]:
    managers: list[SessionManager] = []

    def make(**overrides: Any) -> SessionManager:
        base = {"data_dir": tmp_path, "state_poll_s": 0.1, "pool_size": 0, "on_shutdown": "stop"}
        manager = SessionManager(Settings(**{**base, **overrides}), local_backend, recorder=store, metrics=Metrics())
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        await manager.shutdown()


def gauge(manager: SessionManager) -> float | None:
    assert manager.metrics is not None
    return manager.metrics.registry.get_sample_value("kernelgw_paused_snapshot_bytes")


async def stored_paused(store: Store, session: KernelSession, paused: bool) -> None:
    async def stored() -> bool:
        (row,) = [s for s in await store.open_sessions() if s.session_id == session.id]
        return row.paused is paused

    await until(stored, f"the store to have session {session.id} {'paused' if paused else 'running'}")


def status(events: list[dict[str, Any]]) -> str:
    return str(events[-1]["status"])


async def paused_session(manager: SessionManager, store: Store) -> KernelSession:
    """A session with a variable and a file, paused: its snapshot holds both."""
    await manager.start()
    session = await manager.create()
    assert status(await run(session, "open('kept.txt', 'w').write('mine')", replayable=False)) == "ok"
    assert status(await run(session, "x = 41\ny = open('kept.txt').read()")) == "ok"
    paused = await manager.pause(session)
    assert "x" in paused.namespace.done and paused.stored_bytes > 0
    assert manager.snapshots.used == paused.stored_bytes == gauge(manager)
    assert session.state == "paused" and session.handle is None
    await stored_paused(store, session, True)
    return session


async def test_a_restart_gives_the_new_kernel_the_snapshots_files_not_its_variables(
    make_manager: ManagerFactory, store: Store, local_backend: LocalBackend, gate: Gate
) -> None:
    manager = make_manager()
    session = await paused_session(manager, store)
    snapshot = manager.snapshot_dir(session.id)
    assert snapshot.is_dir()

    assert await session.restart() is None
    assert session.state == "idle" and session.handle is not None
    assert local_backend.running() == [session.handle.kernel_id]  # one kernel: the new one
    # nothing of the pause is left: its directory, its bytes, the store's "paused"
    assert not snapshot.exists() and manager.snapshots.used == 0 == gauge(manager)
    await stored_paused(store, session, False)
    assert await session.resume() is None  # not paused any more
    assert stdout(await run(session, CHECK)) == "None mine False\n"
    assert manager.metrics is not None
    assert manager.metrics.registry.get_sample_value("kernelgw_kernel_restarts_total", {"reason": "requested"}) == 1


async def test_a_restart_with_replay_runs_the_paused_cells_after_the_files(
    make_manager: ManagerFactory, store: Store, gate: Gate
) -> None:
    manager = make_manager()
    session = await paused_session(manager, store)
    report = await session.restart(replay=True)
    assert report is not None and report.trigger == "requested"
    assert report.complete and report.replayed == 1  # the cell that reads kept.txt found it
    # the replayed cell is the new kernel's lineage: a later restart replays it again
    assert [c.code for c in session.lineage] == ["x = 41\ny = open('kept.txt').read()"]
    assert stdout(await run(session, CHECK + "\nprint(y)")) == "41 mine False\nmine\n"


async def test_a_restart_that_fails_leaves_the_session_paused_with_its_snapshot(
    make_manager: ManagerFactory, store: Store, local_backend: LocalBackend, gate: Gate
) -> None:
    manager = make_manager()
    session = await paused_session(manager, store)
    held = manager.snapshots.used
    gate.fail = OSError("no room")
    with pytest.raises(KernelStartFailed, match="no room"):
        await session.restart()
    assert session.state == "paused" and session.handle is None and not local_backend.running()
    assert manager.snapshot_dir(session.id).is_dir() and manager.snapshots.used == held == gauge(manager)
    await stored_paused(store, session, True)
    # and it can be restarted (or resumed) again
    gate.fail = None
    await session.restart()
    assert stdout(await run(session, CHECK)) == "None mine False\n"
    assert manager.snapshots.used == 0 == gauge(manager)


@pytest.mark.parametrize("how", ["restart", "resume"])
async def test_a_failed_restart_or_resume_keeps_the_paused_lineage(
    make_manager: ManagerFactory, store: Store, gate: Gate, how: str
) -> None:
    """The kernel that failed is no part of the session's lineage: the stored
    cells stay those of the kernels the session was paused from, and a replay
    after the failure still finds them."""
    manager = make_manager()
    session = await paused_session(manager, store)
    kernels = session.lineage_kernels
    gate.fail = OSError("no room")
    with pytest.raises(KernelStartFailed, match="no room"):
        await (session.restart() if how == "restart" else session.resume())
    assert session.lineage_kernels == kernels
    gate.fail = None
    report = await session.restart(replay=True)
    assert report is not None and report.replayed == 1


async def test_a_delete_during_the_restart_waits_for_it_then_leaves_nothing(
    make_manager: ManagerFactory, store: Store, local_backend: LocalBackend, gate: Gate
) -> None:
    manager = make_manager()
    session = await paused_session(manager, store)
    gate.close()
    restart = asyncio.create_task(session.restart())
    await gate.entered.wait()  # the restart holds the session, its files on their way
    delete = asyncio.create_task(manager.delete(session.id))
    await asyncio.sleep(0.2)
    assert not delete.done()
    gate.open.set()
    await restart
    await delete
    assert session.state == "closed" and not local_backend.running()
    assert not manager.snapshot_dir(session.id).exists() and manager.snapshots.used == 0 == gauge(manager)
    assert manager.list() == []


async def test_a_fork_during_the_restart_waits_for_it_and_forks_the_restarted_session(
    make_manager: ManagerFactory, store: Store, local_backend: LocalBackend, gate: Gate
) -> None:
    manager = make_manager()
    session = await paused_session(manager, store)
    gate.close()
    restart = asyncio.create_task(session.restart())
    await gate.entered.wait()  # the new kernel is the session's, its files not back yet
    assert session.state == "idle" and session.handle is not None
    fork = asyncio.create_task(manager.fork(session, SessionOptions()))
    # time enough for a fork that would not wait to copy the workspace as it is now
    done, _ = await asyncio.wait({fork}, timeout=3)
    assert not done and manager.list() == [session]
    gate.open.set()
    await restart
    # a fork of the restarted session: its files, copied once they were back; no variables
    child, report = await fork
    assert report.namespace is None and report.copied_bytes > 0 and report.replay.cells == []
    assert stdout(await run(child, CHECK)) == "None mine False\n"
    assert manager.snapshots.used == 0 == gauge(manager)
    assert sorted(local_backend.running()) == sorted(s.handle.kernel_id for s in (session, child) if s.handle)


async def test_a_restart_during_a_fork_of_the_paused_session_waits_for_it(
    make_manager: ManagerFactory, store: Store, local_backend: LocalBackend, gate: Gate
) -> None:
    manager = make_manager()
    session = await paused_session(manager, store)
    gate.close()
    fork = asyncio.create_task(manager.fork(session, SessionOptions()))
    await gate.entered.wait()  # the fork reads the snapshot, holding the source
    restart = asyncio.create_task(session.restart())
    await asyncio.sleep(0.2)
    assert not restart.done() and session.state == "paused"
    gate.open.set()
    child, report = await fork
    await restart
    # the fork got the paused state whole (variables too); the source restarted after it
    assert stdout(await run(child, CHECK)) == "41 mine False\n"
    assert report.namespace is not None and "x" in report.namespace.done
    assert stdout(await run(session, CHECK)) == "None mine False\n"
    assert manager.snapshots.used == 0 == gauge(manager)
    assert sorted(local_backend.running()) == sorted(s.handle.kernel_id for s in (session, child) if s.handle)


@pytest.mark.parametrize("how", ["restart", "resume"])
async def test_the_files_handle_waits_for_the_files_to_be_back(
    make_manager: ManagerFactory, store: Store, gate: Gate, how: str
) -> None:
    """The file routes' kernel (`KernelSession.files_handle`): during a restart or
    resume of a paused session the new kernel is the session's before the
    snapshot's files are back; a file read or written then would miss them or be
    overwritten by them. It waits; and a paused session is resumed by it."""
    manager = make_manager()
    session = await paused_session(manager, store)
    gate.close()
    lifecycle = asyncio.create_task(session.restart() if how == "restart" else session.resume())
    await gate.entered.wait()
    assert session.handle is not None  # the new kernel, its workspace still empty
    waiting = asyncio.create_task(session.files_handle())
    done, _ = await asyncio.wait({waiting}, timeout=1)
    assert not done
    gate.open.set()
    await lifecycle
    handle = await waiting
    assert handle is not None and handle == session.handle
    assert (handle.conn_dir / "workspace" / "kept.txt").read_text() == "mine"
    # paused again: the handle resumes it
    await manager.pause(session)
    assert session.state == "paused"
    again = await session.files_handle()
    assert again is not None and session.state != "paused"
    assert (again.conn_dir / "workspace" / "kept.txt").read_text() == "mine"


async def test_a_fork_during_a_restarts_replay_waits_for_the_replay(
    make_manager: ManagerFactory, store: Store, gate: Gate
) -> None:
    """A restart with replay queues its cells after the lifecycle lock: a fork
    that came meanwhile copied the lineage the replay had rebuilt so far, and got
    the files but not every variable. It waits for the replay."""
    manager = make_manager()
    await manager.start()
    session = await manager.create()
    assert status(await run(session, "import time\ntime.sleep(1.5)\nx = 41")) == "ok"
    restart = asyncio.create_task(session.restart(replay=True))

    async def replaying() -> bool:  # the lock is free, the replay queued behind it not done
        job = session._replay
        return job is not None and not job.report.done() and not session._lifecycle.locked()

    await until(replaying, "the restart's replay to run in the new kernel")
    child, report = await manager.fork(session, SessionOptions())
    assert report.replay.replayed == 1  # the cell the restart replayed, replayed again in the fork
    assert stdout(await run(child, "print(x + 1)")) == "42\n"
    replayed = await restart
    assert replayed is not None and replayed.complete and replayed.replayed == 1


async def test_a_state_fork_copies_the_variables_themselves_and_leaves_the_source_as_it_was(
    make_manager: ManagerFactory, gate: Gate, tmp_path: Path
) -> None:
    """`SessionManager.fork` with ``copy_state`` (E2B's snapshots): a value no replay would
    give again (a random draw) is the same in the fork; nothing is replayed; the
    source runs on without the pickle in its workspace, and no copy is left on disk."""
    manager = make_manager()
    await manager.start()
    source = await manager.create()
    assert status(await run(source, "open('kept.txt', 'w').write('mine')")) == "ok"
    assert status(await run(source, "import random\nx = random.random()\nprint(repr(x))")) == "ok"
    drawn = stdout(await run(source, "print(repr(x))"))
    fork, report = await manager.fork(source, SessionOptions(), copy_state=True)
    assert report.replay.replayed == 0 and "x" in (report.namespace.done if report.namespace else [])
    assert stdout(await run(fork, "print(repr(x))")) == drawn
    assert stdout(await run(fork, CHECK.replace("globals().get('x')", "'x' in globals()"))) == "True mine False\n"
    assert stdout(await run(source, CHECK.replace("globals().get('x')", "'x' in globals()"))) == "True mine False\n"
    assert not list((tmp_path / "paused").glob("*.copy"))


async def test_a_state_fork_of_a_busy_session_replays_its_cells_instead(
    make_manager: ManagerFactory, gate: Gate
) -> None:
    manager = make_manager()
    await manager.start()
    source = await manager.create()
    assert status(await run(source, "x = 41")) == "ok"
    busy = source.submit("import time\ntime.sleep(1.5)")

    async def running() -> bool:
        return source.current_execution is busy

    await until(running, "the slow cell to run")
    fork, report = await manager.fork(source, SessionOptions(), copy_state=True)
    assert report.replay.replayed == 1 and report.namespace is None
    assert stdout(await run(fork, "print(x)")) == "41\n"
    await busy.done
