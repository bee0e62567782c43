"""E2B's SDK from PyPI (sync and async), unchanged, moves a sandbox's files
through kernelgw's envd face against real kernel containers, configured by
environment variables only: ``sandbox.files`` writes, reads, lists, stats,
makes directories, renames and removes in the workspace the code interpreter
sees as ``/home/user``, with E2B's file metadata; bad input (a path outside /home/user, traversal, a
link user code made, a missing file, an upload over the workspace quota) gets
E2B's exception with a clear message and leaves the sandbox working; another
sandbox's files are never reached."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest
from e2b import FileType, InvalidArgumentException, NotEnoughSpaceException, SandboxException, SandboxState
from e2b.exceptions import FileNotFoundException
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.integration.conftest import assert_nothing_left, gateway_settings, make_key, start_gateway
from tests.integration.e2b.conftest import E2BGateway

pytestmark = pytest.mark.integration

MiB = 1 << 20
QUOTA = 4 * MiB
"""The test gateway's workspace quota."""


@pytest.fixture(scope="module")
def files_gateway(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BGateway]:
    """A gateway with keys required and a small workspace quota."""
    data_dir: Path = tmp_path_factory.mktemp("e2b-files")
    name = f"e2bf{os.getpid()}"
    key = make_key(data_dir, name)
    settings = gateway_settings(gateway_name=name, data_dir=data_dir, auth="required", workspace_quota_bytes=QUOTA)
    gw = start_gateway(settings)
    try:
        yield E2BGateway(gw, key)
    finally:
        gw.stop()
    assert_nothing_left(docker_client, name)


@pytest.fixture
def e2b(files_gateway: E2BGateway, monkeypatch: pytest.MonkeyPatch) -> E2BGateway:
    """Only the environment variables a user sets to move to kernelgw."""
    files_gateway.use(monkeypatch)
    return files_gateway


@pytest.fixture
def sbx(e2b: E2BGateway) -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_files_round_trip_and_the_code_interpreter_sees_them(sbx: Sandbox) -> None:
    info = sbx.files.write("/home/user/data/table.csv", "a,b\n1,2\n3,4\n")
    assert (info.name, info.path, info.type) == ("table.csv", "/home/user/data/table.csv", FileType.FILE)
    # the kernel reads it where E2B's programs look for it, and writes one back
    run = sbx.run_code("import pandas as pd\nint(pd.read_csv('/home/user/data/table.csv')['b'].sum())")
    assert run.error is None and run.text == "6", run
    assert sbx.run_code("open('out.txt', 'w').write('from the kernel')").error is None
    assert sbx.files.read("/home/user/out.txt") == "from the kernel"
    assert sbx.files.read("out.txt", format="bytes") == bytearray(b"from the kernel")  # relative: /home/user
    with sbx.files.read("/home/user/data/table.csv", format="stream") as stream:
        assert b"".join(stream) == b"a,b\n1,2\n3,4\n"

    written = sbx.files.write_files(
        [{"path": "/home/user/many/1.txt", "data": "one"}, {"path": "many/2.bin", "data": b"\x00\xff"}]
    )
    assert [w.path for w in written] == ["/home/user/many/1.txt", "/home/user/many/2.bin"]
    assert sbx.files.make_dir("/home/user/many/sub")
    assert not sbx.files.make_dir("/home/user/many/sub")
    assert [(e.name, e.type) for e in sbx.files.list("/home/user/many")] == [
        ("1.txt", FileType.FILE),
        ("2.bin", FileType.FILE),
        ("sub", FileType.DIR),
    ]
    top = [e.path for e in sbx.files.list("/home/user")]
    assert "/home/user/many" in top and "/home/user/many/1.txt" not in top
    assert "/home/user/many/1.txt" in [e.path for e in sbx.files.list("/home/user", depth=2)]

    entry = sbx.files.get_info("/home/user/many/2.bin")
    assert (entry.type, entry.size, entry.path, entry.permissions) == (
        FileType.FILE,
        2,
        "/home/user/many/2.bin",
        "-rw-r--r--",
    )
    assert entry.owner == entry.group == "user" and entry.mode == 0o644  # the sandbox's user, as E2B names it
    assert sbx.files.exists("/home/user/many/2.bin") and not sbx.files.exists("/home/user/many/3.bin")

    moved = sbx.files.rename("/home/user/many/1.txt", "/home/user/moved/first.txt")
    assert (moved.path, moved.size) == ("/home/user/moved/first.txt", 3)
    assert sbx.run_code("open('/home/user/moved/first.txt').read()").text == "one"
    sbx.files.remove("/home/user/many")
    assert not sbx.files.exists("/home/user/many")
    assert sbx.run_code("import os\nos.path.exists('many')").text == "False"


async def test_async_files_with_gzip(e2b: E2BGateway) -> None:
    sbx = await AsyncSandbox.create()
    try:
        data = b"kernelgw and E2B\n" * 20_000
        await sbx.files.write("/home/user/big.txt", io.BytesIO(data))
        assert await sbx.files.read("/home/user/big.txt", format="bytes", gzip=True) == bytearray(data)
        chunks = [c async for c in await sbx.files.read("/home/user/big.txt", format="stream")]
        assert b"".join(chunks) == data
        assert (await sbx.files.get_info("/home/user/big.txt")).size == len(data)
        assert await sbx.files.make_dir("/home/user/d")
        assert [e.name for e in await sbx.files.list("/home/user")] == ["big.txt", "d"]
        await sbx.files.rename("/home/user/big.txt", "/home/user/d/big.txt")
        assert [e.path for e in await sbx.files.list("/home/user/d")] == ["/home/user/d/big.txt"]
        with pytest.raises(FileNotFoundException):
            await sbx.files.read("/home/user/big.txt")
    finally:
        await sbx.kill()


def test_file_metadata_is_kept_as_envd_keeps_it(sbx: Sandbox) -> None:
    """envd 0.6.2's metadata: user.e2b.* extended attributes of the file, which code sees too."""
    info = sbx.files.write("/home/user/m.csv", "a,b\n", metadata={"Source": "upload", "run": "7"})
    assert info.metadata == {"source": "upload", "run": "7"}
    streamed = sbx.files.write("/home/user/s.bin", io.BytesIO(b"s" * 1000), metadata={"k": "v"}, gzip=True)
    assert streamed.metadata == {"k": "v"}
    assert sbx.files.get_info("/home/user/m.csv").metadata == {"source": "upload", "run": "7"}
    assert {e.name: e.metadata for e in sbx.files.list("/home/user")} == {"m.csv": info.metadata, "s.bin": {"k": "v"}}
    seen = sbx.run_code("import os\nos.getxattr('m.csv', 'user.e2b.source').decode()").text
    assert seen == "upload", seen
    assert sbx.run_code("os.setxattr('m.csv', 'user.e2b.by_code', b'yes')").error is None
    assert sbx.files.get_info("/home/user/m.csv").metadata == {"source": "upload", "run": "7", "by_code": "yes"}


def test_bad_input_gets_e2bs_errors_and_leaves_the_sandbox_working(sbx: Sandbox) -> None:
    made = sbx.run_code(
        "import os\nos.symlink('/etc', 'etc')\nos.symlink('/etc/passwd', 'pw')\nopen('f.txt', 'w').write('f')"
    )
    assert made.error is None, made
    refusals = [
        (FileNotFoundException, lambda: sbx.files.read("/home/user/missing.txt"), "missing.txt"),
        (FileNotFoundException, lambda: sbx.files.list("/home/user/nodir"), "nodir"),
        (FileNotFoundException, lambda: sbx.files.get_info("/home/user/nothing"), "nothing"),
        (SandboxException, lambda: sbx.files.read("/etc/passwd"), "only /home/user"),
        (SandboxException, lambda: sbx.files.list("/"), "only /home/user"),
        (SandboxException, lambda: sbx.files.write("/tmp/evil", "x"), "only /home/user"),
        (InvalidArgumentException, lambda: sbx.files.read("/home/user/../../etc/passwd"), "'..'"),
        (InvalidArgumentException, lambda: sbx.files.write("../outside.txt", "x"), "'..'"),
        (InvalidArgumentException, lambda: sbx.files.read("/home/user/etc/passwd"), "symbolic link"),
        (InvalidArgumentException, lambda: sbx.files.read("/home/user/pw"), "symbolic link"),
        (InvalidArgumentException, lambda: sbx.files.write("/home/user/etc/evil", "x"), "symbolic link"),
        (InvalidArgumentException, lambda: sbx.files.list("/home/user/etc"), "symbolic link"),
        (InvalidArgumentException, lambda: sbx.files.list("/home/user/f.txt"), "not a directory"),
        (InvalidArgumentException, lambda: sbx.files.rename("/home/user/etc/passwd", "/home/user/p"), "symbolic link"),
        (SandboxException, lambda: sbx.files.write("/home/user/x.txt", "x", user="root"), "one user"),
        (InvalidArgumentException, lambda: sbx.files.watch_dir("/home/user/etc"), "symbolic link"),
        (SandboxException, lambda: sbx.files.watch_dir("/etc"), "only /home/user"),
    ]
    for exc, call, words in refusals:
        with pytest.raises(exc) as info:
            call()
        assert words in str(info.value), (words, str(info.value))
    link = sbx.files.get_info("/home/user/etc")  # described, not followed
    assert (link.type, link.symlink_target) == (FileType.SYMLINK, "/etc")
    sbx.files.remove("/home/user/pw")  # the link goes; what it points to stays
    assert sbx.run_code("import os\n(os.path.lexists('pw'), os.path.exists('/etc/passwd'))").text == "(False, True)"
    listing = sbx.run_code("import os\nsorted(os.listdir('/home/user'))").text
    assert listing == "['etc', 'f.txt']", listing
    assert sbx.run_code("1 + 1").text == "2"


def test_an_upload_over_the_workspace_quota_is_refused_and_writes_nothing(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/kept.bin", b"k" * (3 * MiB))
    with pytest.raises(NotEnoughSpaceException, match="workspace quota"):
        sbx.files.write("/home/user/over.bin", b"o" * (2 * MiB))
    with pytest.raises(NotEnoughSpaceException, match="workspace quota"):
        sbx.files.write("/home/user/streamed.bin", io.BytesIO(b"s" * (2 * MiB)))
    assert [e.name for e in sbx.files.list("/home/user")] == ["kept.bin"]
    sbx.files.remove("/home/user/kept.bin")
    sbx.files.write("/home/user/over.bin", b"o" * (2 * MiB))  # room again
    assert sbx.files.get_info("/home/user/over.bin").size == 2 * MiB


def test_files_of_a_paused_sandbox_wake_it(sbx: Sandbox) -> None:
    """E2B's auto-resume: a read reaches a paused sandbox's files, and it runs again."""
    sbx.files.write("/home/user/kept.txt", "kept through a pause")
    assert sbx.run_code("x = 41").error is None
    sbx.pause()
    assert sbx.get_info().state == SandboxState.PAUSED
    assert sbx.files.read("/home/user/kept.txt") == "kept through a pause"
    assert sbx.get_info().state == SandboxState.RUNNING
    assert sbx.run_code("x + 1").text == "42"


def test_another_sandboxs_files_are_never_reached(e2b: E2BGateway) -> None:
    mine, theirs = Sandbox.create(), Sandbox.create()
    try:
        theirs.files.write("/home/user/secret.txt", "theirs")
        # with its own token a sandbox's paths are its own workspace
        with pytest.raises(FileNotFoundException):
            mine.files.read("/home/user/secret.txt")
        assert mine.files.list("/home/user") == []
        # its id with this sandbox's token: as if there were no such sandbox, for every envd route
        headers = {"E2b-Sandbox-Id": theirs.sandbox_id, "E2b-Sandbox-Port": "49983"}
        headers["X-Access-Token"] = mine._envd_access_token or ""
        with httpx.Client(base_url=e2b.url, headers=headers, timeout=30) as http:
            answers = [
                http.get("/files", params={"path": "/home/user/secret.txt"}),
                http.post("/files", params={"path": "/home/user/secret.txt"}, files={"file": ("x", b"overwritten")}),
                http.post("/filesystem.Filesystem/ListDir", json={"path": "/home/user"}),
                http.post("/filesystem.Filesystem/Remove", json={"path": "/home/user/secret.txt"}),
            ]
        for answer in answers:
            assert answer.status_code == 502 and "was not found" in answer.json()["message"], answer.text
        assert theirs.files.read("/home/user/secret.txt") == "theirs"
    finally:
        mine.kill()
        theirs.kill()
