"""Workspace files on a real engine: upload, download, listing, delete, path
traversal, quotas; the SDK and `kernelgw run --upload`."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import docker
import httpx
import pytest

from kernelgw.client import AsyncClient, Client
from kernelgw.errors import ClientError
from tests.integration.conftest import RunningGateway, gateway_settings, run, start_gateway, stdout

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]


def files_url(sid: str, path: str = "") -> str:
    return f"/v1/sessions/{sid}/files/{path}" if path else f"/v1/sessions/{sid}/files"


def workspace_tree(http: httpx.Client, sid: str) -> list[tuple[str, int]]:
    """Everything in /workspace as the kernel sees it, hidden files included."""
    code = (
        "import os, json\n"
        "print(json.dumps(sorted((os.path.relpath(os.path.join(d, n), '/workspace'), "
        "os.lstat(os.path.join(d, n)).st_size if n in fs else -1) "
        "for d, ds, fs in os.walk('/workspace') for n in ds + fs)))"
    )
    return [tuple(x) for x in json.loads(stdout(run(http, sid, code)))]


def peak_rss_reset() -> None:
    """Reset this process's peak RSS (VmHWM) to its current RSS."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def csv_rows(n_bytes: int) -> Iterator[bytes]:
    """About ``n_bytes`` of CSV in 1 MiB pieces, never all in memory."""
    yield b"i,x,y\n"
    i = 0
    written = 0
    while written < n_bytes:
        block = "".join(f"{j},{j % 97},{(j * 7) % 1000}\n" for j in range(i, i + 40_000)).encode()
        i += 40_000
        written += len(block)
        yield block


@pytest.fixture
def big_session(http: httpx.Client) -> Iterator[str]:
    resp = http.post("/v1/sessions", json={"memory_mb": 1024})
    assert resp.status_code == 201, resp.text
    sid = resp.json()["id"]
    yield sid
    http.delete(f"/v1/sessions/{sid}")


@pytest.mark.timeout(300)
def test_50mb_csv_streams_in_reads_with_pandas_and_streams_out(
    http: httpx.Client, big_session: str, output_dir: Path
) -> None:
    size = 0
    rows = 0
    digest = hashlib.sha256()
    for block in csv_rows(50 * MiB):
        size += len(block)
        rows += block.count(b"\n")
        digest.update(block)
    rows -= 1  # header

    peak_rss_reset()
    base = peak_rss()
    t0 = time.perf_counter()
    resp = http.put(files_url(big_session, "data/big.csv"), content=csv_rows(50 * MiB))
    up_s = time.perf_counter() - t0
    grew = peak_rss() - base
    assert resp.status_code == 201, resp.text
    assert resp.json()["size"] == size and resp.json()["mime_type"] == "text/csv"
    # The gateway runs in this process: a buffered upload would raise the peak by 50 MiB.
    assert grew < 20 * MiB, f"peak RSS grew by {grew / MiB:.1f} MiB during a {size / MiB:.0f} MiB upload"

    result = run(
        http, big_session, "import pandas as pd\ndf = pd.read_csv('data/big.csv')\nprint(len(df), int(df.x.sum()))"
    )
    assert result["status"] == "ok", result
    n, xsum = map(int, stdout(result).split())
    assert n == rows and xsum == sum(j % 97 for j in range(rows))

    peak_rss_reset()
    base = peak_rss()
    t0 = time.perf_counter()
    got = hashlib.sha256()
    received = 0
    with http.stream("GET", files_url(big_session, "data/big.csv")) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/csv")
        assert r.headers["content-length"] == str(size)
        assert r.headers["content-disposition"] == "attachment; filename*=UTF-8''big.csv"
        assert r.headers["x-content-type-options"] == "nosniff"
        for chunk in r.iter_bytes():
            received += len(chunk)
            got.update(chunk)
    down_s = time.perf_counter() - t0
    assert peak_rss() - base < 20 * MiB
    assert received == size and got.hexdigest() == digest.hexdigest()
    (output_dir / "files-throughput.json").write_text(
        json.dumps({"bytes": size, "upload_MBps": size / up_s / 1e6, "download_MBps": size / down_s / 1e6})
    )


def test_listing_shows_type_size_and_mtime(http: httpx.Client, session_id: str) -> None:
    before = datetime.now(UTC)
    assert http.put(files_url(session_id, "a.txt"), content=b"hello").status_code == 201
    assert http.put(files_url(session_id, "sub/deep/b.json"), content=b"{}").status_code == 201
    run(http, session_id, "import os; os.symlink('/etc/passwd', 'link')")

    top = http.get(files_url(session_id)).json()
    assert top["path"] == "" and top["truncated"] is False
    entries = {e["path"]: e for e in top["entries"]}
    assert set(entries) == {"a.txt", "sub", "link"}
    assert entries["a.txt"]["type"] == "file" and entries["a.txt"]["size"] == 5
    assert entries["a.txt"]["mime_type"] == "text/plain"
    assert entries["sub"]["type"] == "directory" and entries["link"]["type"] == "symlink"
    mtime = datetime.fromisoformat(entries["a.txt"]["mtime"])
    assert abs((mtime - before).total_seconds()) < 30

    deep = http.get(files_url(session_id), params={"path": "sub", "recursive": "true"}).json()
    assert [(e["path"], e["type"], e["size"]) for e in deep["entries"]][1:] == [("sub/deep/b.json", "file", 2)]
    one = http.get(files_url(session_id), params={"path": "a.txt"}).json()
    assert [e["path"] for e in one["entries"]] == ["a.txt"]

    # replacing answers 200 and keeps one file
    resp = http.put(files_url(session_id, "a.txt"), content=b"bye")
    assert resp.status_code == 200 and resp.json()["created"] is False
    assert http.get(files_url(session_id, "a.txt")).content == b"bye"


def test_missing_file_is_404_and_directories_are_400(http: httpx.Client, session_id: str) -> None:
    resp = http.get(files_url(session_id, "nope.csv"))
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "file_not_found"
    assert "nope.csv" in resp.json()["error"]["message"]
    assert http.get(files_url(session_id), params={"path": "nodir"}).status_code == 404
    assert http.delete(files_url(session_id, "nope.csv")).status_code == 404
    http.put(files_url(session_id, "d/x"), content=b"1")
    resp = http.get(files_url(session_id, "d"))
    assert resp.status_code == 400 and "directory" in resp.json()["error"]["message"]
    assert http.put(files_url(session_id, "d"), content=b"1").status_code == 400
    assert http.get(files_url("nosuchsession", "x")).status_code == 404


def test_delete_file_directory_and_symlink(http: httpx.Client, session_id: str) -> None:
    http.put(files_url(session_id, "keep.txt"), content=b"k")
    http.put(files_url(session_id, "tmp/a/b.txt"), content=b"b")
    run(http, session_id, "import os; os.symlink('/etc', 'etc')")
    assert http.delete(files_url(session_id, "tmp")).status_code == 204
    assert http.delete(files_url(session_id, "etc")).status_code == 204  # the link, not /etc
    assert workspace_tree(http, session_id) == [("keep.txt", 1)]
    assert stdout(run(http, session_id, "import os; print(os.path.exists('/etc/passwd'))")).strip() == "True"


TRAVERSALS = [
    "..%2Fetc%2Fpasswd",
    "%2E%2E/%2E%2E/etc/passwd",
    "%2Fetc%2Fpasswd",
    "/etc/passwd",
    "sub/..%2F..%2Fetc%2Fpasswd",
    "a%00b",
    "x%00%2F..%2F..%2Fetc%2Fpasswd",
]


def test_traversal_is_refused_and_touches_nothing(http: httpx.Client, session_id: str) -> None:
    http.put(files_url(session_id, "sub/keep.txt"), content=b"keep")
    before = workspace_tree(http, session_id)
    for path in TRAVERSALS:
        for method in ("GET", "PUT", "DELETE"):
            resp = http.request(method, f"/v1/sessions/{session_id}/files/{path}", content=b"evil")
            assert resp.status_code == 400, (method, path, resp.text)
            assert resp.json()["error"]["code"] == "invalid_path"
    for path in ["../etc", "/etc", "a\x00b"]:
        resp = http.get(files_url(session_id), params={"path": path})
        assert resp.status_code == 400, path
    assert workspace_tree(http, session_id) == before


def test_symlinks_made_by_user_code_are_refused(http: httpx.Client, session_id: str) -> None:
    code = (
        "import os\n"
        "os.symlink('/etc', 'etc')\n"
        "os.symlink('/etc/passwd', 'pw')\n"
        "os.makedirs('d')\n"
        "os.symlink('/', 'd/root')\n"
        "os.symlink('d', 'alias')  # even a link that stays inside\n"
        "open('d/inside.txt', 'w').write('i')\n"
    )
    assert run(http, session_id, code)["status"] == "ok"
    before = workspace_tree(http, session_id)
    for method, path in [
        ("GET", "etc/passwd"),
        ("GET", "pw"),
        ("GET", "d/root/etc/passwd"),
        ("GET", "alias/inside.txt"),
        ("PUT", "etc/evil"),
        ("PUT", "pw"),
        ("PUT", "d/root/tmp/evil"),
        ("DELETE", "etc/passwd"),
        ("DELETE", "d/root/etc"),
    ]:
        resp = http.request(method, files_url(session_id, path), content=b"evil")
        assert resp.status_code == 400, (method, path, resp.text)
        assert "symbolic link" in resp.json()["error"]["message"]
    for path in ["etc", "d/root"]:
        assert http.get(files_url(session_id), params={"path": path}).status_code == 400
    assert workspace_tree(http, session_id) == before
    check = "print(open('/etc/passwd').read().count('evil'), os.path.exists('/tmp/evil'))"
    assert stdout(run(http, session_id, "import os\n" + check)).split() == ["0", "False"]
    # the session and the gateway carry on
    assert http.get(files_url(session_id, "d/inside.txt")).content == b"i"
    assert run(http, session_id, "1+1")["status"] == "ok"


def test_symlink_swapped_in_during_an_upload_is_refused(http: httpx.Client, session_id: str) -> None:
    """The helper refuses links when it meets them, so a link planted while an
    upload streams (the classic check-then-use race) still fails the upload."""
    http.put(files_url(session_id, "target/placeholder"), content=b"p")

    def body() -> Iterator[bytes]:
        yield b"x" * 1000
        # while the upload is open: replace the target directory with a link to /tmp
        with httpx.Client(base_url=str(http.base_url), timeout=60) as other:
            code = "import shutil, os\nshutil.rmtree('target')\nos.symlink('/tmp', 'target')"
            assert other.post(f"/v1/sessions/{session_id}/execute", json={"code": code}).json()["status"] == "ok"
        yield b"y" * 1000

    resp = http.put(files_url(session_id, "target/evil.txt"), content=body())
    assert resp.status_code == 400 and "symbolic link" in resp.json()["error"]["message"]
    assert stdout(run(http, session_id, "import os; print(os.listdir('/tmp'))")).count("evil") == 0
    assert stdout(run(http, session_id, "import os; print(sorted(os.listdir('.')))")).strip() == "['target']"


def test_deleting_a_tree_removes_the_links_in_it_not_what_they_point_to(http: httpx.Client, session_id: str) -> None:
    code = (
        "import os, socket\n"
        "deep = 'tree'\n"
        "os.mkdir(deep)\n"
        "for _ in range(1200):\n"  # deeper than Python's recursion limit (os.makedirs recurses too)
        "    deep += '/n'\n"
        "    os.mkdir(deep)\n"
        "open(deep + '/f.txt', 'w').write('f')\n"
        "os.symlink('/tmp', deep + '/tmp')\n"
        "os.symlink('/', 'tree/root')\n"
        "os.symlink('/workspace', 'tree/ws')\n"
        "os.mkfifo('tree/pipe')\n"
        "socket.socket(socket.AF_UNIX).bind('/workspace/tree/sock')\n"
        "open('keep.txt', 'w').write('k')\n"
        "open('/tmp/outside.txt', 'w').write('o')\n"
    )
    assert run(http, session_id, code)["status"] == "ok"
    resp = http.delete(files_url(session_id, "tree"))
    assert resp.status_code == 204, resp.text
    assert workspace_tree(http, session_id) == [("keep.txt", 1)]
    check = "import os\nprint(os.path.exists('/tmp/outside.txt'), os.path.isdir('/tmp/.ipython'), os.path.exists('/etc/passwd'))"
    assert stdout(run(http, session_id, check)).split() == ["True", "True", "True"]


def test_special_files_and_files_used_as_directories_are_refused(http: httpx.Client, session_id: str) -> None:
    """FIFOs and sockets deeper in the workspace: never opened (a FIFO would
    block), refused as files and as directories, listed and deleted."""
    code = (
        "import os, socket\n"
        "os.makedirs('sub')\n"
        "os.mkfifo('sub/pipe')\n"
        "socket.socket(socket.AF_UNIX).bind('/workspace/sub/sock')\n"
        "open('sub/f.txt', 'w').write('f')\n"
    )
    assert run(http, session_id, code)["status"] == "ok"
    for method, path in [
        ("GET", "sub/pipe"),
        ("GET", "sub/sock"),
        ("PUT", "sub/pipe"),
        ("PUT", "sub/sock"),
        ("GET", "sub/pipe/x"),
        ("GET", "sub/sock/x"),
        ("GET", "sub/f.txt/x"),
        ("PUT", "sub/pipe/x"),
        ("PUT", "sub/f.txt/x"),
        ("DELETE", "sub/sock/x"),
    ]:
        resp = http.request(method, files_url(session_id, path), content=b"x", timeout=15)
        assert resp.status_code == 400, (method, path, resp.text)
        assert resp.json()["error"]["code"] == "invalid_path", (method, path)
    listing = http.get(files_url(session_id), params={"path": "sub"}).json()
    assert {e["path"]: e["type"] for e in listing["entries"]} == {
        "sub/f.txt": "file",
        "sub/pipe": "other",
        "sub/sock": "other",
    }
    one = http.get(files_url(session_id), params={"path": "sub/sock"}).json()
    assert [(e["path"], e["type"]) for e in one["entries"]] == [("sub/sock", "other")]
    for path in ("sub/pipe", "sub/sock"):
        assert http.delete(files_url(session_id, path)).status_code == 204
    assert workspace_tree(http, session_id) == [("sub", -1), ("sub/f.txt", 1)]


@pytest.fixture(scope="module")
def small_gateway(gateway: RunningGateway) -> Iterator[RunningGateway]:
    gw = start_gateway(
        gateway_settings(
            gateway_name=f"{gateway.settings.gateway_name}q",
            max_upload_bytes=1 * MiB,
            workspace_quota_bytes=2 * MiB,
            workspace_size_mb=8,  # small enough to fill without reaching the memory limit
        )
    )
    yield gw
    gw.stop()


def refused(resp: httpx.Response, words: str) -> None:
    assert resp.status_code == 413, resp.text
    assert resp.json()["error"]["code"] == "quota_exceeded"
    assert words in resp.json()["error"]["message"], resp.json()["error"]["message"]


def test_quotas_give_413_and_leave_the_workspace_unchanged(small_gateway: RunningGateway) -> None:
    with httpx.Client(base_url=small_gateway.url, timeout=120) as http:
        sid = http.post("/v1/sessions", json={}).json()["id"]
        try:
            # per file: declared, and streamed without a length
            refused(http.put(files_url(sid, "new/big.bin"), content=b"x" * (2 * MiB)), "per-file limit of 1048576")
            chunks = (b"x" * 65536 for _ in range(40))
            refused(http.put(files_url(sid, "new/big.bin"), content=chunks), "per-file limit")
            assert workspace_tree(http, sid) == []

            for name in ("a.bin", "b.bin"):
                assert http.put(files_url(sid, name), content=b"a" * (900 * 1024)).status_code == 201
            before = workspace_tree(http, sid)
            # the workspace: 1.8 MiB of 2 MiB used
            refused(http.put(files_url(sid, "c.bin"), content=b"c" * 500_000), "workspace quota of 2097152")
            chunks = (b"c" * 100_000 for _ in range(5))
            refused(http.put(files_url(sid, "sub/c.bin"), content=chunks), "workspace quota")
            assert workspace_tree(http, sid) == before  # no partial, temporary or new directory

            # replacing a file needs room only for the difference
            assert http.put(files_url(sid, "a.bin"), content=b"A" * (900 * 1024)).status_code == 200
            # files the kernel writes count too; deleting makes room
            run(http, sid, "open('k.bin', 'wb').write(b'k' * 1_000_000)")
            before = workspace_tree(http, sid)
            refused(http.put(files_url(sid, "d.bin"), content=b"d" * 200_000), "workspace quota")
            assert workspace_tree(http, sid) == before
            assert http.delete(files_url(sid, "k.bin")).status_code == 204
            assert http.put(files_url(sid, "d.bin"), content=b"d" * 200_000).status_code == 201
            assert run(http, sid, "1+1")["status"] == "ok"
        finally:
            http.delete(f"/v1/sessions/{sid}")


def test_tmpfs_filling_up_during_an_upload_gives_413(small_gateway: RunningGateway) -> None:
    """ENOSPC from the tmpfs itself (here: user code fills it while an upload
    streams) is a 413 too, and the partial upload is gone."""
    with httpx.Client(base_url=small_gateway.url, timeout=120) as http:
        session_id = http.post("/v1/sessions", json={}).json()["id"]
        try:
            _fill_during_upload(http, session_id)
        finally:
            http.delete(f"/v1/sessions/{session_id}")


def _fill_during_upload(http: httpx.Client, session_id: str) -> None:
    def body() -> Iterator[bytes]:
        yield b"x" * 100_000
        with httpx.Client(base_url=str(http.base_url), timeout=120) as other:
            code = (
                "import os, time\n"
                "while not any(n.startswith('.kernelgw-upload-') for n in os.listdir('.')):\n"
                "    time.sleep(0.01)  # the upload has started and measured the free space\n"
                "f = open('fill.bin', 'wb')\n"
                "try:\n"
                "    while True:\n"
                "        f.write(b'f' * (1 << 20)); f.flush()\n"
                "except OSError as e:\n"
                "    print(e.errno)\n"
                "f.close()"
            )
            out = other.post(f"/v1/sessions/{session_id}/execute", json={"code": code}).json()
            assert stdout(out).strip() == "28", out  # ENOSPC
        yield b"y" * 500_000

    refused(http.put(files_url(session_id, "up.bin"), content=body()), "full")
    assert [name for name, _ in workspace_tree(http, session_id)] == ["fill.bin"]
    assert http.delete(files_url(session_id, "fill.bin")).status_code == 204
    assert http.put(files_url(session_id, "up.bin"), content=b"ok").status_code == 201


# Command lines of the container's processes, read from its own /proc: `docker
# top` cannot be used, under gVisor (runsc) it lists unrelated host processes.
LIST_PROCESSES = (
    "import os\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        print(open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ').decode().strip())\n"
    "    except OSError:\n"
    "        pass\n"
)


def container_processes(container: docker.models.containers.Container) -> list[str]:
    code, out = container.exec_run(["/opt/kernel/bin/python", "-I", "-c", LIST_PROCESSES])
    assert code == 0, out
    return out.decode().splitlines()  # type: ignore[no-any-return]


def test_transfers_cut_off_by_the_client_leave_no_helper_or_partial_file(
    http: httpx.Client, session_id: str, docker_client: docker.DockerClient
) -> None:
    run(http, session_id, "open('big.bin', 'wb').write(b'x' * (40 << 20))")
    (container,) = docker_client.containers.list(filters={"label": f"kernelgw.session={session_id}"})

    def cut_upload() -> Iterator[bytes]:
        yield b"y" * (3 * MiB)
        raise RuntimeError("the client gives up")

    for _ in range(3):
        with http.stream("GET", files_url(session_id, "big.bin")) as r:
            next(r.iter_bytes())  # read a little, then hang up
        with pytest.raises(RuntimeError):
            http.put(files_url(session_id, "up.bin"), content=cut_upload())
    # the engine may start the last helper after its client is gone: it then finds
    # its stdin closed and removes its temporary file, which a listing made in
    # between still shows
    deadline = time.monotonic() + 10
    while True:
        processes = container_processes(container)
        assert any("kernelgw_kernel.launcher" in p for p in processes), processes  # the listing sees the kernel
        helpers = [p for p in processes if "kernelgw_kernel" in p and "--ext" not in p]
        tree = workspace_tree(http, session_id)
        if (not helpers and tree == [("big.bin", 40 << 20)]) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert helpers == []
    assert tree == [("big.bin", 40 << 20)]


def test_other_sessions_keep_working_during_and_after_refusals(http: httpx.Client, session_id: str) -> None:
    other = http.post("/v1/sessions", json={}).json()["id"]
    try:
        run(http, other, "x = 41")
        for path in TRAVERSALS:
            http.get(f"/v1/sessions/{session_id}/files/{path}")
        http.get(files_url(session_id, "missing"))
        assert stdout(run(http, other, "print(x + 1)")).strip() == "42"
        assert http.put(files_url(other, "f.txt"), content=b"fine").status_code == 201
        assert http.get(files_url(other, "f.txt")).content == b"fine"
        assert http.get("/healthz").status_code == 200
    finally:
        http.delete(f"/v1/sessions/{other}")


# ------------------------------------------------------------------ SDK and CLI


def test_sdk_upload_download_files_delete(gateway_url: str, tmp_path: Path) -> None:
    local = tmp_path / "data.csv"
    local.write_bytes(b"a,b\n1,2\n3,4\n")
    with Client(gateway_url) as client, client.session() as session:
        up = session.upload(local)
        assert up.path == "data.csv" and up.size == local.stat().st_size and up.created
        assert session.upload(b"\x00\x01binary", "raw/blob.bin").size == 8
        assert session.upload("ünï".encode(), "ünïcode dir/名前 #1?.txt").path == "ünïcode dir/名前 #1?.txt"
        assert session.download("ünïcode dir/名前 #1?.txt") == "ünï".encode()
        session.delete_file("ünïcode dir")
        assert session.run("import pandas as pd; print(pd.read_csv('data.csv').b.sum())").stdout.strip() == "6"
        assert session.download("raw/blob.bin") == b"\x00\x01binary"
        out = session.download("data.csv", tmp_path / "copy.csv")
        assert out == tmp_path / "copy.csv" and out.read_bytes() == local.read_bytes()
        assert [(f.path, f.type) for f in session.files()] == [("data.csv", "file"), ("raw", "directory")]
        assert [f.path for f in session.files("raw")] == ["raw/blob.bin"]
        session.delete_file("raw")
        assert [f.path for f in session.files()] == ["data.csv"]
        with pytest.raises(ClientError) as info:
            session.download("nope.txt", tmp_path / "nope.txt")
        assert info.value.status_code == 404 and not (tmp_path / "nope.txt").exists()
        for bad in ["../etc/passwd", "/etc/passwd", "a/./b"]:
            with pytest.raises(ClientError) as info:
                session.download(bad)
            assert info.value.status_code == 400 and info.value.code == "invalid_path", bad
        with pytest.raises(ValueError):
            session.upload(b"bytes need a name")


async def test_async_sdk_files(gateway_url: str, tmp_path: Path) -> None:
    local = tmp_path / "in.txt"
    local.write_bytes(b"x" * 3_000_000)
    async with AsyncClient(gateway_url) as client, client.session() as session:
        assert (await session.upload(local, "dir/in.txt")).size == 3_000_000
        assert await session.download("dir/in.txt") == local.read_bytes()
        path = await session.download("dir/in.txt", tmp_path / "out.txt")
        assert isinstance(path, Path) and path.read_bytes() == local.read_bytes()
        assert [f.path for f in await session.files(recursive=True)] == ["dir", "dir/in.txt"]
        await session.delete_file("dir/in.txt")
        assert [f.path for f in await session.files("dir")] == []


def test_cli_run_uploads_then_runs_and_saves_artifacts(gateway_url: str, tmp_path: Path) -> None:
    data = tmp_path / "data.csv"
    data.write_text("x\n1\n2\n3\n")
    out = tmp_path / "artifacts"
    code = "import pandas as pd\ndf = pd.read_csv('data.csv')\nprint(df.x.sum())\ndf.describe().to_csv('summary/stats.csv')"
    code = "import os; os.makedirs('summary', exist_ok=True)\n" + code
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelgw",
            "run",
            "--server",
            gateway_url,
            "--upload",
            str(data),
            "--save-artifacts",
            str(out),
            code,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "6"
    assert "[created: summary/stats.csv" in proc.stderr and "data.csv" not in proc.stderr.replace("stats.csv", "")
    assert (out / "summary" / "stats.csv").read_text().startswith(",x\ncount,3.0")
