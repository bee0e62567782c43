"""E2B's ``sandbox.files.watch_dir`` from PyPI's SDK, unchanged, against real
kernel containers (runc, and gVisor with KERNELGW_TEST_RUNTIME=runsc): the
sync SDK polls a watch, the async SDK streams one, and so does the JavaScript
SDK (``@e2b/code-interpreter`` from npm, in Node); changes made through
``sandbox.files``, by the code interpreter and by commands all reach it; bad
paths get E2B's errors; a watch ends with its sandbox's pause."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from e2b import (
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    SandboxException,
)
from e2b.exceptions import FileNotFoundException
from e2b_code_interpreter import AsyncSandbox, Sandbox

from kernelgw.server.e2b import envd_watch
from tests.integration.e2b.conftest import E2BGateway
from tests.support.waiting import until, wait_until

pytestmark = pytest.mark.integration

CREATE, WRITE, REMOVE, RENAME, CHMOD = (
    FilesystemEventType.CREATE,
    FilesystemEventType.WRITE,
    FilesystemEventType.REMOVE,
    FilesystemEventType.RENAME,
    FilesystemEventType.CHMOD,
)


def seen(events: list[FilesystemEvent]) -> list[tuple[str, FilesystemEventType]]:
    return [(e.name, e.type) for e in events]


def modes(sandbox_id: str) -> list[str]:
    """How this sandbox's watches watch (the gateway runs in this process)."""
    return [w.mode for r in list(envd_watch.REGISTRIES.values()) for w in r.watchers(sandbox_id)]


def collect(poll: Callable[[], list[FilesystemEvent]], events: list[FilesystemEvent]) -> Callable[[], bool]:
    def more() -> bool:
        events.extend(poll())
        return False

    return more


def test_a_polled_watch_sees_files_code_and_commands(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/data")
    handle = sbx.files.watch_dir("/home/user/data", include_entry=True, recursive=True)
    assert modes(sbx.sandbox_id) == ["inotify"]  # under runc and gVisor alike
    sbx.files.write("/home/user/data/up.txt", "uploaded")
    made = sbx.run_code("import os\nos.makedirs('data/sub')\nopen('data/sub/code.txt', 'w').write('by code')")
    assert made.error is None, made
    assert sbx.commands.run("chmod 600 data/up.txt && mv data/up.txt data/sub/moved.txt").exit_code == 0
    sbx.files.remove("/home/user/data/sub/code.txt")

    events: list[FilesystemEvent] = []
    wanted = [
        ("up.txt", CREATE),
        ("up.txt", WRITE),
        ("sub", CREATE),
        ("sub/code.txt", CREATE),
        ("sub/code.txt", WRITE),
        ("up.txt", CHMOD),
        ("up.txt", RENAME),
        ("sub/moved.txt", CREATE),
        ("sub/code.txt", REMOVE),
    ]

    def all_seen() -> bool:
        events.extend(handle.get_new_events())
        return all(w in seen(events) for w in wanted)

    wait_until(all_seen, f"the watch's events (so far {seen(events)})", timeout=30, interval=0.2)
    got = seen(events)
    firsts = [got.index(w) for w in wanted]
    assert firsts == sorted(firsts), got  # in the order they happened
    upload = next(e.entry for e in events if e.name == "up.txt" and e.type == WRITE)
    assert upload is not None
    assert (upload.path, upload.type, upload.size, upload.owner) == ("/home/user/data/up.txt", FileType.FILE, 8, "user")
    handle.stop()
    assert modes(sbx.sandbox_id) == []
    assert sbx.run_code("1 + 1").text == "2"


async def test_a_streamed_watch(e2b_env: E2BGateway) -> None:
    sbx = await AsyncSandbox.create(timeout=300)
    try:
        events: list[FilesystemEvent] = []
        ends: list[Exception | None] = []
        handle = await sbx.files.watch_dir("/home/user", events.append, on_exit=ends.append, timeout=0)
        await sbx.files.write("/home/user/a.txt", "a")
        await sbx.run_code("import os\nos.rename('a.txt', 'b.txt')\nos.remove('b.txt')")

        async def removed() -> bool:
            return ("b.txt", REMOVE) in seen(events)

        await until(removed, "the stream's events", timeout=30, interval=0.1)
        assert seen(events) == [
            ("a.txt", CREATE),
            ("a.txt", WRITE),
            ("a.txt", RENAME),
            ("b.txt", CREATE),
            ("b.txt", REMOVE),
        ]
        await handle.stop()
        assert ends == [None]
    finally:
        await sbx.kill()


def test_bad_watches_and_a_pause(sbx: Sandbox) -> None:
    assert sbx.run_code("import os\nos.symlink('/etc', 'etc')\nopen('f.txt', 'w').write('f')").error is None
    refusals: list[tuple[type[Exception], Callable[[], object], str]] = [
        (FileNotFoundException, lambda: sbx.files.watch_dir("/home/user/nope"), "nope"),
        (InvalidArgumentException, lambda: sbx.files.watch_dir("/home/user/f.txt"), "not a directory"),
        (InvalidArgumentException, lambda: sbx.files.watch_dir("/home/user/etc"), "symbolic link"),
        (SandboxException, lambda: sbx.files.watch_dir("/tmp"), "only /home/user"),
    ]
    for exc, call, words in refusals:
        with pytest.raises(exc) as info:
            call()
        assert words in str(info.value), (words, str(info.value))

    handle = sbx.files.watch_dir("/home/user")
    sbx.pause()
    with pytest.raises(SandboxException, match="paused"):
        wait_until(collect(handle.get_new_events, []), "the pause to end the watch", timeout=30, interval=0.2)
    assert modes(sbx.sandbox_id) == []
    assert sbx.files.read("/home/user/f.txt") == "f"  # woken; its files are back


NODE_DIR = Path(os.environ.get("KERNELGW_NODE_DIR", "/var/cache/kernelgw/node"))
JS_SCRIPT = Path(__file__).parents[1] / "node" / "e2b_watch.js"


def test_the_javascript_sdk_watches_and_writes_metadata(e2b_env: E2BGateway) -> None:
    """@e2b/code-interpreter from npm (scripts/ensure-node-clients.sh), in Node."""
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "@e2b" / "code-interpreter").is_dir():
        pytest.fail("No Node or @e2b/code-interpreter; run scripts/ensure-node-clients.sh", pytrace=False)
    env = {**os.environ, **e2b_env.env(), "NODE_PATH": str(NODE_DIR / "node_modules")}
    done = subprocess.run([node, str(JS_SCRIPT)], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["writtenMetadata"] == {"from": "js"} and seen["info"] == {"from": "js"}, seen
    for expected in [
        ["sub", "create"],
        ["sub/a.txt", "create"],
        ["sub/a.txt", "write"],
        ["z.txt", "create"],
        ["z.txt", "write"],
        ["z.txt", "remove"],
    ]:
        assert expected in seen["events"], (expected, seen["events"])
    assert seen["entry"] == {"path": "/home/user/w/sub/a.txt", "size": 2, "metadata": {"from": "js"}}, seen
    assert seen["zipped"] is False
