"""E2B's SDK (sync and async, unchanged) drives ``sandbox.files`` against the envd
routes of a real gateway (uvicorn on loopback) whose kernels are host
subprocesses: the workspace helper runs for real on each kernel's workspace
directory. Fast, without an engine; tests/integration/e2b/test_files.py does
the same against containers."""

from __future__ import annotations

import asyncio
import gzip
import io
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from e2b import AsyncSandbox as BaseAsyncSandbox
from e2b import (
    FileType,
    InvalidArgumentException,
    NotEnoughSpaceException,
    NotFoundException,
    SandboxException,
)
from e2b import Sandbox as BaseSandbox
from e2b.exceptions import FileNotFoundException
from packaging.version import Version

from kernelgw.runtime.session import KernelSession
from kernelgw.server.e2b.models import ENVD_VERSION
from tests.support.local_backend import LocalBackend
from tests.unit.server.e2b.test_interpreter import Gateway, in_thread, serve

SDK = TypeVar("SDK", BaseSandbox, BaseAsyncSandbox)

QUOTA = 64 * 1024
"""The gateway's per-file limit here (the local backend's workspace is no tmpfs of
its own, so its workspace quota cannot be tried: tests/integration/e2b does)."""
BODY_CAP = 16 * 1024
"""The gateway's cap on request bodies, which file uploads are not held to."""


@pytest.fixture(scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    backend = LocalBackend()
    tmp = tmp_path_factory.mktemp("envd")
    # the workspace "tmpfs" as large as the host's file system, whose use the helper counts as the workspace's
    whole_disk_mb = 2 * shutil.disk_usage(tmp).total // (1 << 20)
    try:
        limits = {"max_upload_bytes": QUOTA, "max_request_bytes": BODY_CAP, "workspace_size_mb": whole_disk_mb}
        async with serve(tmp, backend, **limits) as gateway:
            yield gateway
        assert not backend.running(), f"kernel processes left running: {backend.running()}"
    finally:
        await backend.kill_all()


def workspace(session: KernelSession) -> Path:
    """The kernel's workspace directory on this host (the local backend's)."""
    assert session.handle is not None
    return Path(session.handle.conn_dir) / "workspace"


def sdk(cls: type[SDK], gw: Gateway, session: KernelSession, token: str, envd: str = "0.2.4") -> SDK:
    """The SDK's sandbox (sync or async ``cls``) as ``Sandbox.connect`` makes it;
    ``envd``: the version the control plane reports (0.2.4: multipart uploads,
    ``username`` sent)."""
    return cls(
        sandbox_id=session.id,
        sandbox_domain=None,
        envd_version=Version(envd),
        envd_access_token=token,
        traffic_access_token=token,
        connection_config=gw.config(session, token),
    )


async def test_sync_write_read_list_stat_rename_remove(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    sbx = sdk(BaseSandbox, gw, *sandbox)
    info = await in_thread(lambda: sbx.files.write("/home/user/data/a.csv", "x,y\n1,2\n"))
    assert (info.name, info.path, info.type) == ("a.csv", "/home/user/data/a.csv", FileType.FILE)
    assert (workspace(sandbox[0]) / "data/a.csv").read_text() == "x,y\n1,2\n"
    assert await in_thread(lambda: sbx.files.read("data/a.csv")) == "x,y\n1,2\n"  # relative: from /home/user
    assert await in_thread(lambda: sbx.files.read("/workspace/data/a.csv", format="bytes")) == bytearray(b"x,y\n1,2\n")

    def streamed() -> bytes:
        with sbx.files.read("/home/user/data/a.csv", format="stream") as stream:
            return b"".join(stream)

    assert await in_thread(streamed) == b"x,y\n1,2\n"

    entry = await in_thread(lambda: sbx.files.get_info("/home/user/data/a.csv"))
    assert (entry.name, entry.type, entry.path, entry.size) == ("a.csv", FileType.FILE, "/home/user/data/a.csv", 8)
    assert entry.mode == 0o644 and entry.permissions == "-rw-r--r--" and entry.owner == entry.group == "user"
    assert entry.symlink_target is None and entry.modified_time.year >= 2024
    home = await in_thread(lambda: sbx.files.get_info("/home/user"))
    assert (home.type, home.path, home.name) == (FileType.DIR, "/home/user", "user")

    assert await in_thread(lambda: sbx.files.exists("/home/user/data/a.csv"))
    assert not await in_thread(lambda: sbx.files.exists("/home/user/nope"))
    assert await in_thread(lambda: sbx.files.make_dir("/home/user/data/sub/deeper"))
    assert not await in_thread(lambda: sbx.files.make_dir("/home/user/data/sub/deeper"))  # exists already

    listed = await in_thread(lambda: sbx.files.list("/home/user/data"))
    assert [(e.name, e.type, e.path) for e in listed] == [
        ("a.csv", FileType.FILE, "/home/user/data/a.csv"),
        ("sub", FileType.DIR, "/home/user/data/sub"),
    ]
    deep = await in_thread(lambda: sbx.files.list("/home/user/data", depth=3))
    assert [e.path for e in deep] == ["/home/user/data/a.csv", "/home/user/data/sub", "/home/user/data/sub/deeper"]

    moved = await in_thread(lambda: sbx.files.rename("/home/user/data/a.csv", "/home/user/moved/b.csv"))
    assert (moved.name, moved.path, moved.size) == ("b.csv", "/home/user/moved/b.csv", 8)
    assert not await in_thread(lambda: sbx.files.exists("/home/user/data/a.csv"))
    await in_thread(lambda: sbx.files.remove("/home/user/moved"))
    await in_thread(lambda: sbx.files.remove("/home/user/moved"))  # gone already: envd's Remove succeeds too
    assert sorted(p.name for p in workspace(sandbox[0]).iterdir()) == ["data"]


async def test_async_sdk_writes_many_files_and_reads_them(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    sbx = sdk(BaseAsyncSandbox, gw, *sandbox)
    infos = await sbx.files.write_files(
        [
            {"path": "/home/user/one.txt", "data": "1"},
            {"path": "two/2.bin", "data": b"\x00\x01\x02"},
            {"path": "/home/user/three.txt", "data": io.BytesIO(b"three")},
        ]
    )
    assert [i.path for i in infos] == ["/home/user/one.txt", "/home/user/two/2.bin", "/home/user/three.txt"]
    assert await sbx.files.read("/home/user/two/2.bin", format="bytes") == bytearray(b"\x00\x01\x02")
    assert await sbx.files.read("/home/user/three.txt") == "three"
    chunks = [chunk async for chunk in await sbx.files.read("/home/user/one.txt", format="stream")]
    assert b"".join(chunks) == b"1"
    assert await sbx.files.make_dir("/home/user/d")
    names = [e.name for e in await sbx.files.list("/home/user")]
    assert names == ["d", "one.txt", "three.txt", "two"]
    with pytest.raises(FileNotFoundException):
        await sbx.files.get_info("/home/user/missing")
    with pytest.raises(FileNotFoundException):  # the streaming call: its error ends the stream
        await sbx.files.watch_dir("/home/user/missing", on_event=lambda event: None)


@pytest.mark.parametrize("envd", ["0.2.4", "0.6.0"])
async def test_gzip_both_ways_and_octet_stream_uploads(
    gw: Gateway, sandbox: tuple[KernelSession, str], envd: str
) -> None:
    """0.6.0: the SDK uploads raw bodies (gzip-compressed when asked) and sends no user."""
    sbx = sdk(BaseSandbox, gw, *sandbox, envd=envd)
    data = b"kernelgw " * 5000
    await in_thread(lambda: sbx.files.write("/home/user/big.txt", data, gzip=True))
    await in_thread(lambda: sbx.files.write("/home/user/streamed.bin", io.BytesIO(b"a" * 1000 + b"b" * 1000)))
    assert (workspace(sandbox[0]) / "big.txt").read_bytes() == data
    assert (workspace(sandbox[0]) / "streamed.bin").read_bytes() == b"a" * 1000 + b"b" * 1000
    assert await in_thread(lambda: sbx.files.read("/home/user/big.txt", format="bytes", gzip=True)) == data


async def test_file_metadata_at_the_claimed_envd_version(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    """The version sandboxes claim: the SDK names no user, and keeps metadata on files
    (``user.e2b.*`` extended attributes, as envd keeps them)."""
    session, token = sandbox
    sbx = sdk(BaseSandbox, gw, session, token, envd=ENVD_VERSION)
    info = await in_thread(lambda: sbx.files.write("/home/user/m.txt", "m", metadata={"Owner": "ann", "k-2": "v 2"}))
    assert info.metadata == {"owner": "ann", "k-2": "v 2"}
    assert os.getxattr(workspace(session) / "m.txt", "user.e2b.owner") == b"ann"
    many = await in_thread(
        lambda: sbx.files.write_files(
            [{"path": "a/one.txt", "data": "1"}, {"path": "a/two.txt", "data": io.BytesIO(b"2")}],
            metadata={"batch": "7"},
        )
    )
    assert [i.metadata for i in many] == [{"batch": "7"}, {"batch": "7"}]
    assert (await in_thread(lambda: sbx.files.get_info("/home/user/m.txt"))).metadata == {"owner": "ann", "k-2": "v 2"}
    listed = {e.name: e.metadata for e in await in_thread(lambda: sbx.files.list("/home/user/a"))}
    assert listed == {"one.txt": {"batch": "7"}, "two.txt": {"batch": "7"}}
    moved = await in_thread(lambda: sbx.files.rename("/home/user/m.txt", "/home/user/n.txt"))
    assert moved.metadata == {"owner": "ann", "k-2": "v 2"}
    plain = await in_thread(lambda: sbx.files.write("/home/user/plain.txt", "p"))
    assert plain.metadata is None and (await in_thread(lambda: sbx.files.get_info("plain.txt"))).metadata is None
    headers = {**gw.headers(session, token, port=49983), "Content-Type": "application/octet-stream"}
    async with httpx.AsyncClient(base_url=gw.url, headers=headers) as http:
        refusals = [
            ({"X-Metadata-" + "k" * 250: "v"}, "not taken"),
            ({"X-Metadata-k": "caf\u00e9".encode("latin-1")}, "printable ASCII"),
            ({"X-Metadata-k": "v" * 2000}, "at most 1024"),
        ]
        for extra, words in refusals:
            refused = await http.post("/files", params={"path": "r.txt"}, content=b"r", headers=extra)
            assert refused.status_code == 400 and words in refused.json()["message"], refused.text
    assert not (workspace(session) / "r.txt").exists()


async def test_the_wire_gzip_is_real(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    session, token = sandbox
    (workspace(session) / "z.txt").write_bytes(b"z" * 10_000)
    headers = gw.headers(session, token, port=49983)
    async with httpx.AsyncClient(base_url=gw.url, headers=headers) as http:
        raw = await http.get("/files", params={"path": "/home/user/z.txt"}, headers={"Accept-Encoding": "gzip"})
        assert raw.headers["content-encoding"] == "gzip" and raw.content == b"z" * 10_000
        plain = await http.get("/files", params={"path": "z.txt"}, headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers and plain.headers["content-length"] == "10000"
        body = gzip.compress(b"compressed upload")
        sent = await http.post(
            "/files",
            params={"path": "/home/user/up.txt"},
            content=body,
            headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
        )
        assert sent.json() == [{"name": "up.txt", "type": "file", "path": "/home/user/up.txt"}]
        assert (workspace(session) / "up.txt").read_bytes() == b"compressed upload"
        cut = await http.post(
            "/files",
            params={"path": "/home/user/cut.txt"},
            content=body[:-10],
            headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
        )
        assert cut.status_code == 400 and "ended before" in cut.json()["message"]
        assert not (workspace(session) / "cut.txt").exists()


async def test_errors_are_e2bs(gw: Gateway, sandbox: tuple[KernelSession, str]) -> None:
    sbx = sdk(BaseSandbox, gw, *sandbox)
    (workspace(sandbox[0]) / "f.txt").write_text("f")
    (workspace(sandbox[0]) / "d").mkdir()
    (workspace(sandbox[0]) / "out").symlink_to("/etc")

    async def raises(exc: type[Exception], call: Callable[[], object], *words: str) -> None:
        with pytest.raises(exc) as info:
            await in_thread(call)
        for word in words:
            assert word in str(info.value), (word, str(info.value))

    checks = [
        (FileNotFoundException, lambda: sbx.files.read("/home/user/missing.txt"), ("missing.txt",)),
        (FileNotFoundException, lambda: sbx.files.list("/home/user/nodir"), ("nodir",)),
        (FileNotFoundException, lambda: sbx.files.rename("/home/user/nope", "/home/user/x"), ("nope",)),
        (SandboxException, lambda: sbx.files.read("/etc/passwd"), ("only /home/user",)),
        (SandboxException, lambda: sbx.files.list("/"), ("only /home/user",)),
        (SandboxException, lambda: sbx.files.write("/tmp/x", "x"), ("only /home/user",)),
        (InvalidArgumentException, lambda: sbx.files.read("/home/user/../etc/passwd"), ("'..'",)),
        (InvalidArgumentException, lambda: sbx.files.write("/home/user/a/../../x", "x"), ("'..'",)),
        (InvalidArgumentException, lambda: sbx.files.read("/home/user/out/passwd"), ("symbolic link",)),
        (InvalidArgumentException, lambda: sbx.files.list("/home/user/out"), ("symbolic link",)),
        (InvalidArgumentException, lambda: sbx.files.list("/home/user/f.txt"), ("not a directory",)),
        (InvalidArgumentException, lambda: sbx.files.read("/home/user/d"), ("directory",)),
        (InvalidArgumentException, lambda: sbx.files.make_dir("/home/user/f.txt"), ("not a directory",)),
        (InvalidArgumentException, lambda: sbx.files.remove("/home/user"), ("cannot be removed",)),
        (SandboxException, lambda: sbx.files.read("/home/user/f.txt", user="root"), ("one user",)),
        (InvalidArgumentException, lambda: sbx.files.watch_dir("/home/user/out"), ("symbolic link",)),
    ]
    for exc, call, words in checks:
        await raises(exc, call, *words)
    assert not (workspace(sandbox[0]) / "x").exists()
    link = await in_thread(lambda: sbx.files.get_info("/home/user/out"))
    assert (link.type, link.symlink_target, link.permissions[0]) == (FileType.SYMLINK, "/etc", "L")
    listed = {e.name: e for e in await in_thread(lambda: sbx.files.list("/home/user"))}
    assert listed["out"].type == FileType.SYMLINK and listed["out"].symlink_target == "/etc"


async def test_an_upload_over_the_quota_is_refused_and_leaves_nothing(
    gw: Gateway, sandbox: tuple[KernelSession, str]
) -> None:
    sbx = sdk(BaseSandbox, gw, *sandbox)
    with pytest.raises(NotEnoughSpaceException, match="per-file limit"):
        await in_thread(lambda: sbx.files.write("/home/user/huge.bin", b"x" * (QUOTA + 1)))
    with pytest.raises(NotEnoughSpaceException):
        await in_thread(lambda: sbx.files.write("/home/user/huge.bin", io.BytesIO(b"x" * (QUOTA + 1))))
    assert list(workspace(sandbox[0]).iterdir()) == []
    # the sandbox takes files again at once, larger than any other request body may be
    await in_thread(lambda: sbx.files.write("/home/user/fits.bin", b"f" * (BODY_CAP * 3)))
    await in_thread(lambda: sbx.files.write_files([{"path": f"{i}.bin", "data": b"m" * BODY_CAP} for i in range(3)]))
    assert (workspace(sandbox[0]) / "fits.bin").stat().st_size == BODY_CAP * 3


async def test_another_sandboxs_token_reaches_nothing(gw: Gateway) -> None:
    (mine, my_token), (other, other_token) = await gw.sandbox(), await gw.sandbox()
    try:
        (workspace(other) / "secret.txt").write_text("theirs")
        # this sandbox's id with the other's token, and the other way round: not found, as if gone
        for session, token in [(mine, other_token), (other, my_token)]:
            sbx = sdk(BaseSandbox, gw, session, token)
            with pytest.raises(SandboxException, match="not found"):
                await in_thread(lambda sbx=sbx: sbx.files.read("/home/user/secret.txt"))  # type: ignore[misc]
            with pytest.raises(SandboxException, match="not found"):
                await in_thread(lambda sbx=sbx: sbx.files.list("/home/user"))  # type: ignore[misc]
        # with its own token, a sandbox's paths are its own workspace only
        sbx = sdk(BaseSandbox, gw, mine, my_token)
        with pytest.raises(NotFoundException):
            await in_thread(lambda: sbx.files.read("/home/user/secret.txt"))
        assert await in_thread(lambda: sbx.files.list("/home/user")) == []
    finally:
        await asyncio.gather(gw.state.manager.delete(mine.id), gw.state.manager.delete(other.id))
