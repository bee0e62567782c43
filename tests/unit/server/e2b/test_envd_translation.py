"""The envd face's translation, without a gateway: the sandbox's paths to the
workspace's, entries to envd's ``EntryInfo`` as E2B's SDK parses it, kernelgw's
errors to Connect codes, and the streamed bodies (gzip, multipart)."""

from __future__ import annotations

import gzip
import json
import stat
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from e2b.envd.filesystem import filesystem_pb
from e2b.sandbox.filesystem.filesystem import FileType, map_entry_info
from starlette.requests import Request

from kernelgw.errors import (
    BackendError,
    BadRequest,
    FileNotFoundInWorkspace,
    Forbidden,
    InvalidPath,
    KernelDied,
    KernelGWError,
    QuotaExceeded,
    SessionBusy,
)
from kernelgw.runtime.workspace import EntryDetails
from kernelgw.server.e2b.connect import HTTP_STATUS, ConnectError, read_message, timeout_s
from kernelgw.server.e2b.envd import (
    ListDirRequest,
    basic_user,
    check_user,
    connect_error,
    depth_of,
    entry_info,
    link_target,
    permissions,
    sandbox_path,
    workspace_path,
)
from kernelgw.server.e2b.envd_files import accepts_gzip, form_file_name, gunzipped, multipart_parts


@pytest.mark.parametrize(
    "path, rel",
    [
        ("/home/user", ""),
        ("/home/user/", ""),
        ("/home/user/data.csv", "data.csv"),
        ("/home/user/a/b/", "a/b"),
        ("/workspace", ""),
        ("/workspace/a/b.txt", "a/b.txt"),
        ("data.csv", "data.csv"),
        ("sub/x", "sub/x"),
        ("", ""),
        ("~", ""),
        ("~/notes.md", "notes.md"),
    ],
)
def test_the_sandbox_paths_that_reach_the_workspace(path: str, rel: str) -> None:
    assert workspace_path(path) == rel


@pytest.mark.parametrize(
    "path", ["/", "/etc/passwd", "/home", "/home/username/x", "/home/user2", "/tmp/x", "/workspaces"]
)
def test_other_absolute_paths_are_outside(path: str) -> None:
    with pytest.raises(Forbidden, match="only /home/user"):
        workspace_path(path)


@pytest.mark.parametrize(
    "path, words",
    [
        ("/home/user/../etc/passwd", "'..'"),
        ("../x", "'..'"),
        ("/home/user/a/../../x", "'..'"),
        ("/home/user//etc", "absolute"),
        ("/home/user/a\x00b", "NUL"),
        ("/home/user/./a", "'.'"),
    ],
)
def test_traversal_and_odd_names_are_refused_naming_the_path(path: str, words: str) -> None:
    with pytest.raises(InvalidPath) as info:
        workspace_path(path)
    assert words in info.value.message and repr(path) in info.value.message


def test_paths_and_link_targets_as_the_sandbox_sees_them() -> None:
    assert (sandbox_path(""), sandbox_path("a/b")) == ("/home/user", "/home/user/a/b")
    assert link_target("/workspace/data") == "/home/user/data"
    assert link_target("/workspace") == "/home/user"
    assert (link_target("/etc"), link_target("rel/x"), link_target("/workspaces")) == ("/etc", "rel/x", "/workspaces")


def test_the_one_user() -> None:
    for user in (None, "", "user"):
        check_user(user)
    with pytest.raises(Forbidden, match="one user"):
        check_user("root")
    assert basic_user("Basic dXNlcjo=") == "user"  # base64("user:"), as the SDK sends it
    assert basic_user(None) is None and basic_user("Bearer abc") is None
    with pytest.raises(BadRequest):
        basic_user("Basic !!!")


@pytest.mark.parametrize(
    "mode, text",
    [
        (stat.S_IFREG | 0o644, "-rw-r--r--"),
        (stat.S_IFDIR | 0o755, "drwxr-xr-x"),
        (stat.S_IFLNK | 0o777, "Lrwxrwxrwx"),
        (stat.S_IFIFO | 0o600, "prw-------"),
        (stat.S_IFSOCK | 0o700, "Srwx------"),
        (stat.S_IFCHR | 0o666, "Dcrw-rw-rw-"),
        (stat.S_IFREG | stat.S_ISUID | 0o755, "urwxr-xr-x"),
        (stat.S_IFDIR | stat.S_ISVTX | 0o777, "dtrwxrwxrwx"),
    ],
)
def test_permissions_are_spelled_as_envd_spells_them(mode: int, text: str) -> None:
    assert permissions(mode) == text


def parsed(entry: EntryDetails) -> object:
    """What E2B's SDK makes of our entry on the wire."""
    wire = entry_info(entry).model_dump_json(by_alias=True, exclude_none=True)
    response = filesystem_pb.StatResponse.from_json(json.dumps({"entry": json.loads(wire)}))
    assert response.entry is not None
    return map_entry_info(response.entry)


def test_entries_parse_as_the_sdks_entry_info() -> None:
    mtime = datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
    file = EntryDetails("data/a.csv", "file", 12, mtime, stat.S_IFREG | 0o640, "200004", "root", own_user=True)
    info = parsed(file)
    assert (info.name, info.type, info.path, info.size) == ("a.csv", FileType.FILE, "/home/user/data/a.csv", 12)  # type: ignore[attr-defined]
    # the kernel's user (a session's own uid, unnamed in the container) is E2B's "user"; others keep their names
    assert (info.mode, info.permissions, info.owner, info.group) == (0o640, "-rw-r-----", "user", "root")  # type: ignore[attr-defined]
    assert info.modified_time == mtime and info.symlink_target is None  # type: ignore[attr-defined]

    link = parsed(EntryDetails("l", "symlink", 4, mtime, stat.S_IFLNK | 0o777, "61000", "61000", "/workspace/x"))
    assert (link.type, link.symlink_target) == (FileType.SYMLINK, "/home/user/x")  # type: ignore[attr-defined]
    home = parsed(EntryDetails("", "directory", 80, mtime, stat.S_IFDIR | 0o700, "kernel", "kernel"))
    assert (home.name, home.path, home.type) == ("user", "/home/user", FileType.DIR)  # type: ignore[attr-defined]
    odd = entry_info(EntryDetails("caf\udce9", "other", 0, mtime, stat.S_IFIFO | 0o600, "k", "k"))
    assert (odd.name, odd.type) == ("caf\ufffd", "FILE_TYPE_UNSPECIFIED")


@pytest.mark.parametrize(
    "exc, code",
    [
        (Forbidden("x"), "permission_denied"),
        (FileNotFoundInWorkspace("x"), "not_found"),
        (InvalidPath("x"), "invalid_argument"),
        (BadRequest("x"), "invalid_argument"),
        (QuotaExceeded("x"), "failed_precondition"),
        (KernelDied("x"), "failed_precondition"),
        (SessionBusy("x"), "unavailable"),
        (BackendError("x"), "unavailable"),
        (KernelGWError("x"), "internal"),
    ],
)
def test_kernelgw_errors_as_connect_codes(exc: KernelGWError, code: str) -> None:
    error = connect_error(exc)
    assert (error.code, error.message) == (code, "x")


def test_connect_errors_unary_and_streamed() -> None:
    response = ConnectError("not_found", "gone").response()
    assert response.status_code == 404 and json.loads(bytes(response.body)) == {"code": "not_found", "message": "gone"}
    assert HTTP_STATUS["unimplemented"] == 501 and HTTP_STATUS["already_exists"] == 409
    stream = request(b"", {"content-type": "application/connect+json"})
    ended = ConnectError("unimplemented", "not served").response(stream)
    body = bytes(ended.body)
    assert ended.status_code == 200 and body[0] == 0x02 and int.from_bytes(body[1:5], "big") == len(body) - 5
    assert json.loads(body[5:]) == {"error": {"code": "unimplemented", "message": "not served"}}


def request(body: bytes, headers: dict[str, str]) -> Request:
    sent = False

    async def receive() -> dict[str, object]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw}, receive)


async def test_request_messages() -> None:
    json_headers = {"content-type": "application/json"}
    msg = await read_message(
        request(b'{"path": "/home/user", "depth": "3", "unknown": 1}', json_headers), ListDirRequest
    )
    assert (msg.path, depth_of(msg.depth)) == ("/home/user", 3)
    zipped = {**json_headers, "content-encoding": "gzip"}
    msg = await read_message(request(gzip.compress(b'{"path": "x", "depth": null}'), zipped), ListDirRequest)
    assert (msg.path, depth_of(msg.depth)) == ("x", 1)
    refused = [
        (b'{"path": 1}', json_headers, "invalid_argument"),
        (b"[1]", json_headers, "invalid_argument"),
        (b"{", json_headers, "invalid_argument"),
        (b"\x0a\x01x", {"content-type": "application/proto"}, "unimplemented"),
    ]
    for body, headers, code in refused:
        with pytest.raises(ConnectError) as info:
            await read_message(request(body, headers), ListDirRequest)
        assert info.value.code == code, body
    with pytest.raises(ConnectError, match="uint32"):
        depth_of(-1)
    assert timeout_s(request(b"", {"connect-timeout-ms": "2500"})) == 2.5
    assert timeout_s(request(b"", {"connect-timeout-ms": "soon"})) is None


def test_accept_encoding() -> None:
    assert accepts_gzip("gzip") and accepts_gzip("br, gzip;q=0.5") and accepts_gzip("identity, x-gzip")
    assert not accepts_gzip("") and not accepts_gzip("identity") and not accepts_gzip("gzip;q=0")


async def chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def test_gzip_bodies_inflate_in_bounded_pieces() -> None:
    data = b"0123456789" * 300_000  # 3 MB of very compressible bytes
    pieces = [piece async for piece in gunzipped(chunks(gzip.compress(data), 1000))]
    assert b"".join(pieces) == data and max(len(p) for p in pieces) <= 1 << 20
    with pytest.raises(BadRequest, match="ended before"):
        _ = [piece async for piece in gunzipped(chunks(gzip.compress(data)[:-20], 1000))]
    with pytest.raises(BadRequest, match="not valid gzip"):
        _ = [piece async for piece in gunzipped(chunks(b"not gzip at all", 4))]


def multipart(files: list[tuple[str, bytes]]) -> tuple[bytes, bytes]:
    """The body and boundary httpx (the SDK's client) makes of these files."""
    req = httpx.Request("POST", "http://x/files", files=[("file", (name, data)) for name, data in files])
    boundary = req.headers["content-type"].split("boundary=")[1].encode()
    return req.read(), boundary


async def test_multipart_parts_stream_with_their_names() -> None:
    body, boundary = multipart([("/home/user/a.txt", b"A" * 100_000), ('we"ird/b.bin', b"\r\n--\r\nB"), ("c", b"")])
    seen = []
    async for part in multipart_parts(chunks(body, 777), boundary):
        seen.append((part.name, part.filename, b"".join([c async for c in part.data])))
    assert seen == [
        ("file", "/home/user/a.txt", b"A" * 100_000),
        ("file", 'we"ird/b.bin', b"\r\n--\r\nB"),
        ("file", "c", b""),
    ]
    # a part left unread is skipped over
    names = [part.filename async for part in multipart_parts(chunks(body, 500), boundary)]
    assert names == ["/home/user/a.txt", 'we"ird/b.bin', "c"]


async def test_a_cut_multipart_body_is_refused() -> None:
    body, boundary = multipart([("a.txt", b"A" * 1000)])
    with pytest.raises(BadRequest, match="ended inside a part"):
        async for part in multipart_parts(chunks(body[:600], 100), boundary):
            _ = [c async for c in part.data]
    with pytest.raises(BadRequest, match="closing boundary"):
        _ = [p async for p in multipart_parts(chunks(b"", 1), boundary)]
    assert form_file_name(b"a%22b") == 'a"b'
