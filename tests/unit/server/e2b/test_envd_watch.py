"""E2B's ``sandbox.files.watch_dir`` (the sync SDK polls: CreateWatcher,
GetWatcherEvents, RemoveWatcher; the async SDK streams: WatchDir) against a
real gateway whose kernels are host subprocesses: the image's watch helper runs
for real, with inotify, on each kernel's workspace directory. The same against
containers (runc and gVisor): tests/integration/e2b/test_watch.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from e2b import AsyncSandbox as BaseAsyncSandbox
from e2b import (
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
    SandboxException,
)
from e2b import Sandbox as BaseSandbox
from e2b.exceptions import FileNotFoundException

from kernelgw.runtime.session import KernelSession
from kernelgw.server.e2b import envd_watch
from kernelgw.server.e2b.envd_watch import WatcherRegistry, filesystem_event
from tests.support.local_backend import IMAGE_HELPERS, LocalBackend, image_helper
from tests.support.waiting import until
from tests.unit.server.e2b.test_envd_sdk import sdk, workspace
from tests.unit.server.e2b.test_interpreter import Gateway, in_thread, serve

CREATE, WRITE, REMOVE, RENAME, CHMOD = (
    FilesystemEventType.CREATE,
    FilesystemEventType.WRITE,
    FilesystemEventType.REMOVE,
    FilesystemEventType.RENAME,
    FilesystemEventType.CHMOD,
)


@pytest.fixture(scope="module")
def watch() -> Iterator[ModuleType]:
    with image_helper("watch") as module:
        yield module


@pytest.fixture(scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    backend = LocalBackend()
    tmp = tmp_path_factory.mktemp("watch")
    whole_disk_mb = 2 * shutil.disk_usage(tmp).total // (1 << 20)  # the host's disk counts as the workspace's
    try:
        async with serve(tmp, backend, workspace_size_mb=whole_disk_mb) as gateway:
            yield gateway
        assert not backend.running(), f"kernel processes left running: {backend.running()}"
    finally:
        await backend.kill_all()


@pytest.fixture
async def watchers(gw: Gateway) -> AsyncIterator[WatcherRegistry]:
    """The gateway's watches, with bounds a test can reach."""
    registry = envd_watch.REGISTRIES[gw.state] = WatcherRegistry(max_watchers=3, max_events=20, idle_s=2.0)
    yield registry
    await registry.close()
    del envd_watch.REGISTRIES[gw.state]


def seen(events: list[FilesystemEvent]) -> list[tuple[str, FilesystemEventType]]:
    return [(e.name, e.type) for e in events]


# ---------------------------------------------------------------- the helper's logic


def test_snapshot_changes_are_envds_events(watch: ModuleType, tmp_path: Any) -> None:
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "gone.txt").write_text("g")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        before = watch.snapshot(fd, False, False)
        (tmp_path / "gone.txt").unlink()
        (tmp_path / "a.txt").write_text("aa")
        (tmp_path / "a.txt").chmod(0o600)
        (tmp_path / "new.txt").write_text("n")
        (tmp_path / "empty").touch()
        after = watch.snapshot(fd, False, False)
    finally:
        os.close(fd)
    assert list(watch.changes(before, after)) == [
        ("remove", "gone.txt"),
        ("write", "a.txt"),
        ("chmod", "a.txt"),
        ("create", "empty"),
        ("create", "new.txt"),
        ("write", "new.txt"),  # made and written between two looks: as inotify would say it
    ]


def test_helper_lines_as_envds_events() -> None:
    entry = {
        "path": "d/a.txt",
        "type": "file",
        "size": 3,
        "mtime_ns": 1_700_000_000_000_000_000,
        "st_mode": stat.S_IFREG | 0o644,
        "owner": "1234",
        "group": "1234",
        "own_user": True,
        "own_group": True,
    }
    event = filesystem_event({"type": "write", "name": "a.txt", "entry": entry})
    assert event is not None
    assert event["type"] == "EVENT_TYPE_WRITE" and event["name"] == "a.txt"
    assert event["entry"]["path"] == "/home/user/d/a.txt" and event["entry"]["owner"] == "user"
    assert event["entry"]["size"] == "3" and event["entry"]["type"] == "FILE_TYPE_FILE"
    assert filesystem_event({"type": "remove", "name": "x\udcff"}) == {"name": "x\ufffd", "type": "EVENT_TYPE_REMOVE"}
    assert filesystem_event({"type": "open", "name": "x"}) is None


@pytest.mark.parametrize("mode", ["inotify", "poll"])
async def test_the_helper_watches_a_tree_until_it_goes(tmp_path: Path, mode: str) -> None:
    """The image's helper as the gateway runs it (a process; its stdin kept open),
    by inotify and by polling (where inotify is missing)."""
    (tmp_path / "d" / "old").mkdir(parents=True)
    (tmp_path / "d" / "old" / "f.txt").write_text("f")
    boot = f"import sys; sys.path.insert(0, {str(IMAGE_HELPERS)!r}); from kernelgw_kernel.watch import main; main()"
    args = ["--root", str(tmp_path), "--recursive", *(["--poll"] if mode == "poll" else []), "d"]
    helper = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", boot, *args, stdin=PIPE, stdout=PIPE, stderr=PIPE
    )
    assert helper.stdout is not None and helper.stdin is not None

    async def line() -> dict[str, Any]:
        async with asyncio.timeout(30):
            return dict(json.loads(await helper.stdout.readline()))  # type: ignore[union-attr]

    try:
        assert (await line())["mode"] == mode
        (tmp_path / "d" / "new").mkdir()
        (tmp_path / "d" / "new" / "n.txt").write_text("n")
        (tmp_path / "d" / "old" / "f.txt").unlink()
        (tmp_path / ".kernelgw-upload-x").write_text("not in the watched directory")
        events: list[tuple[str, str]] = []
        while ("old/f.txt", "remove") not in events or ("new/n.txt", "write") not in events:
            event = await line()
            events.append((event["name"], event["type"]))
        assert ("new", "create") in events and ("new/n.txt", "create") in events
        shutil.rmtree(tmp_path / "d")
        while "ok" not in (event := await line()):
            pass
        assert event == {"ok": False, "error": "gone", "message": event["message"]}
        assert "removed" in event["message"]
        assert await asyncio.wait_for(helper.wait(), 30) == 1
    finally:
        if helper.returncode is None:
            helper.kill()
            await helper.wait()


async def test_the_helper_exits_when_the_gateway_goes(tmp_path: Path) -> None:
    boot = f"import sys; sys.path.insert(0, {str(IMAGE_HELPERS)!r}); from kernelgw_kernel.watch import main; main()"
    helper = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", boot, "--root", str(tmp_path), "", stdin=PIPE, stdout=PIPE, stderr=PIPE
    )
    assert helper.stdout is not None and helper.stdin is not None
    assert json.loads(await asyncio.wait_for(helper.stdout.readline(), 30))["ok"] is True
    helper.stdin.close()  # what the engine does when the gateway drops the exec's connection
    assert await asyncio.wait_for(helper.wait(), 30) == 0


# ---------------------------------------------------------------- the SDKs


async def test_sync_sdk_polls_a_watch(
    gw: Gateway, sandbox: tuple[KernelSession, str], watchers: WatcherRegistry
) -> None:
    session, token = sandbox
    sbx = sdk(BaseSandbox, gw, session, token, envd="0.6.4")
    (workspace(session) / "data").mkdir()
    handle = await in_thread(lambda: sbx.files.watch_dir("/home/user/data", include_entry=True))
    assert len(watchers.watchers(session.id)) == 1
    await in_thread(lambda: sbx.files.write("/home/user/data/a.txt", "hello"))
    (workspace(session) / "data" / "b.txt").write_text("b")
    (workspace(session) / "data" / "b.txt").chmod(0o600)
    (workspace(session) / "data" / "sub").mkdir()
    (workspace(session) / "data" / "sub" / "deep.txt").write_text("not watched: not recursive")
    (workspace(session) / "data" / "b.txt").rename(workspace(session) / "data" / "c.txt")
    (workspace(session) / "data" / "c.txt").unlink()

    events: list[FilesystemEvent] = []
    wanted = [
        ("a.txt", CREATE),
        ("a.txt", WRITE),  # an upload: made and written, as envd reports its writes
        ("b.txt", CREATE),
        ("b.txt", WRITE),
        ("b.txt", CHMOD),
        ("sub", CREATE),
        ("b.txt", RENAME),
        ("c.txt", CREATE),
        ("c.txt", REMOVE),
    ]

    async def all_seen() -> bool:
        events.extend(await in_thread(handle.get_new_events))
        return len(events) >= len(wanted)

    await until(all_seen, "the watch's events")
    assert seen(events) == wanted
    first = events[0].entry
    assert first is not None and (first.path, first.size, first.type) == ("/home/user/data/a.txt", 5, FileType.FILE)
    assert events[6].entry is None and events[-1].entry is None  # what is gone is not described
    assert await in_thread(handle.get_new_events) == []
    await in_thread(handle.stop)
    assert watchers.watchers(session.id) == []
    with pytest.raises(SandboxException, match="already stopped"):
        await in_thread(handle.get_new_events)


async def test_async_sdk_streams_a_recursive_watch(
    gw: Gateway, sandbox: tuple[KernelSession, str], watchers: WatcherRegistry
) -> None:
    session, token = sandbox
    sbx = sdk(BaseAsyncSandbox, gw, session, token, envd="0.6.4")
    events: list[FilesystemEvent] = []
    ends: list[Exception | None] = []
    handle = await sbx.files.watch_dir("/home/user", events.append, on_exit=ends.append, recursive=True)
    assert len(watchers.watchers(session.id)) == 1
    await sbx.files.make_dir("/home/user/a/b")
    await sbx.files.write("/home/user/a/b/c.txt", "c")
    await sbx.files.rename("/home/user/a", "/home/user/moved")
    await sbx.files.write("/home/user/moved/b/d.txt", "d")  # the renamed tree is still watched, by its new name
    await sbx.files.remove("/home/user/moved")

    async def removed() -> bool:
        return ("moved", REMOVE) in seen(events)

    await until(removed, "the tree's removal")
    got = seen(events)
    for expected in [
        ("a", CREATE),
        ("a/b", CREATE),
        ("a/b/c.txt", CREATE),
        ("a/b/c.txt", WRITE),
        ("a", RENAME),
        ("moved", CREATE),
        ("moved/b/d.txt", CREATE),
        ("moved/b/d.txt", WRITE),
        ("moved/b/d.txt", REMOVE),
        ("moved/b", REMOVE),
    ]:
        assert expected in got, (expected, got)
    assert not any(name.startswith(".kernelgw-upload") for name, _ in got)  # uploads' temporary files are not told
    await handle.stop()
    assert ends == [None]

    async def gone() -> bool:
        return watchers.watchers(session.id) == []

    await until(gone, "the stream's watch to end")


async def test_bad_watches_get_e2bs_errors(
    gw: Gateway, sandbox: tuple[KernelSession, str], watchers: WatcherRegistry
) -> None:
    session, token = sandbox
    sbx = sdk(BaseSandbox, gw, session, token, envd="0.6.4")
    (workspace(session) / "f.txt").write_text("f")
    (workspace(session) / "out").symlink_to("/etc")
    refusals: list[tuple[type[Exception], Any, str]] = [
        (FileNotFoundException, lambda: sbx.files.watch_dir("/home/user/nope"), "nope"),
        (InvalidArgumentException, lambda: sbx.files.watch_dir("/home/user/f.txt"), "not a directory"),
        (InvalidArgumentException, lambda: sbx.files.watch_dir("/home/user/out"), "symbolic link"),
        (InvalidArgumentException, lambda: sbx.files.watch_dir("/home/user/../etc"), "'..'"),
        (SandboxException, lambda: sbx.files.watch_dir("/etc"), "only /home/user"),
        (SandboxException, lambda: sbx.files.watch_dir("/home/user", user="root"), "one user"),
    ]
    for exc, call, words in refusals:
        with pytest.raises(exc) as info:
            await in_thread(call)
        assert words in str(info.value), (words, str(info.value))
    for i in range(1000):  # with the directory itself, one more than a recursive watch takes
        (workspace(session) / "many" / str(i)).mkdir(parents=True)
    with pytest.raises(InvalidArgumentException, match="more than 1000 directories"):
        await in_thread(lambda: sbx.files.watch_dir("/home/user/many", recursive=True))
    asbx = sdk(BaseAsyncSandbox, gw, session, token, envd="0.6.4")
    with pytest.raises(FileNotFoundException, match="nope"):  # the stream's error, before its start
        await asbx.files.watch_dir("/home/user/nope", lambda event: None)
    assert watchers.watchers(session.id) == []

    handles = [await in_thread(lambda: sbx.files.watch_dir("/home/user")) for _ in range(3)]
    with pytest.raises(RateLimitException, match="the most it may"):
        await in_thread(lambda: sbx.files.watch_dir("/home/user"))
    await in_thread(handles[0].stop)
    other, other_token = await gw.sandbox()
    try:  # another sandbox's token reaches none of this sandbox's watchers
        headers = gw.headers(other, other_token, port=49983)
        async with httpx.AsyncClient(base_url=gw.url, headers=headers) as http:
            for method in ("GetWatcherEvents", "RemoveWatcher"):
                answer = await http.post(f"/filesystem.Filesystem/{method}", json={"watcherId": handles[1]._watcher_id})
                assert answer.status_code == 404 and answer.json()["code"] == "not_found", answer.text
    finally:
        await gw.state.manager.delete(other.id)
    assert len(watchers.watchers(session.id)) == 2
    again = await in_thread(lambda: sbx.files.watch_dir("/home/user"))  # room again
    await in_thread(again.stop)
    with pytest.raises(NotFoundException, match="not found"):
        await in_thread(handles[0].stop)  # stopped already
    for handle in handles[1:]:
        await in_thread(handle.stop)


async def test_a_watch_that_falls_behind_ends_saying_so_and_one_nobody_polls_goes(
    gw: Gateway, sandbox: tuple[KernelSession, str], watchers: WatcherRegistry
) -> None:
    session, token = sandbox
    sbx = sdk(BaseSandbox, gw, session, token, envd="0.6.4")
    handle = await in_thread(lambda: sbx.files.watch_dir("/home/user"))
    for i in range(30):  # 30 creates and 30 writes: past the 20 kept
        (workspace(session) / f"f{i}.txt").write_text("x")

    async def ended() -> bool:
        return all(w.ended for w in watchers.watchers(session.id))

    await until(ended, "the watch to fall behind")
    events = await in_thread(handle.get_new_events)
    assert len(events) == 20  # what it kept comes first
    with pytest.raises(SandboxException, match="More than 20 changes"):
        await in_thread(handle.get_new_events)
    with pytest.raises(NotFoundException):  # and then it is gone
        await in_thread(handle.get_new_events)

    idle = await in_thread(lambda: sbx.files.watch_dir("/home/user"))

    async def reaped() -> bool:
        return watchers.watchers(session.id) == []

    await until(reaped, "the unpolled watcher to go")
    with pytest.raises(NotFoundException, match="not found"):
        await in_thread(idle.get_new_events)


async def test_watches_end_with_their_sandbox(
    gw: Gateway, sandbox: tuple[KernelSession, str], watchers: WatcherRegistry
) -> None:
    session, token = sandbox
    ends: list[Exception | None] = []
    asbx = sdk(BaseAsyncSandbox, gw, session, token, envd="0.6.4")
    await asbx.files.watch_dir("/home/user", lambda event: None, on_exit=ends.append, timeout=0)
    polled = await in_thread(lambda: sdk(BaseSandbox, gw, session, token, envd="0.6.4").files.watch_dir("/home/user"))
    helpers = [w.watch.process.pid for w in watchers.watchers(session.id)]
    assert len(helpers) == 2
    await gw.state.manager.delete(session.id)

    async def ended() -> bool:
        return len(ends) == 1 and all(w.ended for w in watchers.watchers(session.id))

    await until(ended, "the watches to end with the sandbox")
    assert isinstance(ends[0], Exception) and "ended" in str(ends[0])
    for pid in helpers:  # the helpers are gone too
        await until(_gone(pid), f"watch helper {pid} to exit")
    with pytest.raises(SandboxException):
        await in_thread(polled.get_new_events)


def _gone(pid: int) -> Any:
    async def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    return gone


async def test_watches_started_at_once_keep_to_the_limit(
    gw: Gateway, sandbox: tuple[KernelSession, str], watchers: WatcherRegistry
) -> None:
    session, token = sandbox
    sbx = sdk(BaseAsyncSandbox, gw, session, token, envd="0.6.4")
    started = await asyncio.gather(
        *(sbx.files.watch_dir("/home/user", lambda event: None, timeout=0) for _ in range(6)), return_exceptions=True
    )
    handles = [h for h in started if not isinstance(h, BaseException)]
    refused = [e for e in started if isinstance(e, BaseException)]
    assert len(handles) == 3 and len(watchers.watchers(session.id)) == 3, started
    assert all(isinstance(e, RateLimitException) for e in refused), refused
    for handle in handles:
        await handle.stop()  # type: ignore[union-attr]
