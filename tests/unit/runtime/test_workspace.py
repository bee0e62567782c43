"""Workspace path rules, MIME types and helper answers (kernelgw.workspace), and
the in-kernel helper (images/python/kernelgw_kernel) run on this machine's file
system: the same code the container runs, on a temporary directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from kernelgw.errors import BadRequest, FileNotFoundInWorkspace, InvalidPath, KernelGWError, QuotaExceeded
from kernelgw.paths import validate_path
from kernelgw.runtime.workspace import (
    ENCODING_MIME_TYPES,
    EXTRA_MIME_TYPES,
    guess_mime,
    quota_message,
    raise_for_answer,
)

IMAGE_DIR = Path(__file__).resolve().parents[3] / "images" / "python"


@pytest.fixture(scope="module")
def kernel_module() -> Iterator[ModuleType]:
    sys.path.insert(0, str(IMAGE_DIR))
    try:
        import kernelgw_kernel

        yield kernelgw_kernel
    finally:
        sys.path.remove(str(IMAGE_DIR))


# ------------------------------------------------------------------ path rules


@pytest.mark.parametrize(
    "path, expected",
    [
        ("data.csv", "data.csv"),
        ("sub/dir/out.xlsx", "sub/dir/out.xlsx"),
        ("sub/", "sub"),
        (".hidden", ".hidden"),
        ("..data", "..data"),
        ("a..b/c", "a..b/c"),
        ("-h", "-h"),
        ("--root=/etc", "--root=/etc"),
        ("名前 with spaces.txt", "名前 with spaces.txt"),
    ],
)
def test_valid_paths(path: str, expected: str) -> None:
    assert validate_path(path) == expected


@pytest.mark.parametrize(
    "path, words",
    [
        ("../etc/passwd", "'..'"),
        ("a/../../etc", "'..'"),
        ("..", "'..'"),
        ("/etc/passwd", "absolute"),
        ("//etc", "absolute"),
        ("a\x00b", "NUL"),
        ("a//b", "empty"),
        ("./a", "'.'"),
        ("a/./b", "'.'"),
        ("..\\etc", "backslash"),
        ("", "empty"),
        ("x" * 256, "255"),
        ("a/" * 2100 + "b", "4096"),
    ],
)
def test_refused_paths(path: str, words: str) -> None:
    with pytest.raises(InvalidPath) as info:
        validate_path(path)
    assert words in info.value.message
    assert info.value.status_code == 400 and info.value.code == "invalid_path"


def test_root_only_where_allowed() -> None:
    assert validate_path("", allow_root=True) == ""
    with pytest.raises(InvalidPath):
        validate_path("/", allow_root=True)


# ------------------------------------------------------------------ MIME types


@pytest.mark.parametrize(
    "name, mime",
    [
        ("out.xlsx", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"),
        ("plot.png", "image/png"),
        ("data.csv", "text/csv"),
        ("DATA.CSV", "text/csv"),
        ("notes.md", "text/markdown"),
        ("t.parquet", "application/vnd.apache.parquet"),
        ("data.csv.gz", "application/gzip"),
        ("chart.svg", "image/svg+xml"),
        ("noextension", "application/octet-stream"),
        ("weird.zzz", "application/octet-stream"),
        (".bashrc", "application/octet-stream"),
    ],
)
def test_guess_mime(name: str, mime: str) -> None:
    assert guess_mime(name) == mime


def test_kernel_and_gateway_agree_on_mime_types(kernel_module: ModuleType) -> None:
    """Artifacts (typed in the kernel) and downloads (typed by the gateway) match."""
    assert kernel_module.EXTRA_MIME_TYPES == EXTRA_MIME_TYPES
    assert kernel_module.ENCODING_MIME_TYPES == ENCODING_MIME_TYPES
    for name in ["a.xlsx", "b.png", "c.csv.gz", "d", "e.json", "f.PDF", "g.tar.bz2", "h.html"]:
        assert kernel_module.guess_mime(name) == guess_mime(name), name


# ------------------------------------------------------------------ helper answers


def test_helper_errors_map_to_statuses() -> None:
    assert raise_for_answer({"ok": True, "x": 1}) == {"ok": True, "x": 1}
    cases = {
        "invalid_path": InvalidPath,
        "symlink": InvalidPath,
        "is_directory": InvalidPath,
        "not_directory": InvalidPath,
        "not_found": FileNotFoundInWorkspace,
        "quota": QuotaExceeded,
        "no_space": QuotaExceeded,
        "aborted": BadRequest,
    }
    for code, cls in cases.items():
        with pytest.raises(cls) as info:
            raise_for_answer({"ok": False, "error": code, "message": "it went wrong"})
        assert info.value.message == "It went wrong."
    with pytest.raises(KernelGWError) as info:
        raise_for_answer({"ok": False, "error": "io_error", "message": "disk on fire"})
    assert info.value.status_code == 500 and "Disk on fire" in info.value.message


def test_quota_messages_name_the_binding_limit() -> None:
    base = {"max_bytes": 1000, "quota": 10_000, "used": 2000, "free": 50_000, "existing": 0}
    assert "per-file limit of 1000 bytes" in quota_message(base, 5000)
    quota = dict(base, max_bytes=100_000, used=9_500)
    msg = quota_message(quota, 5000)
    assert (
        "workspace quota of 10000 bytes" in msg
        and "at most 500 bytes fit" in msg
        and "Delete files from the workspace" in msg
    )
    full = dict(base, max_bytes=100_000, quota=100_000, free=300)
    assert "only 300 bytes free" in quota_message(full, None)


# ------------------------------------------------------------------ the helper itself


def fs(root: Path, *args: str, stdin: bytes = b"") -> tuple[list[dict], bytes, int]:
    """Run kernelgw_kernel.fs like the gateway does (``python -I``), on ``root``."""
    code = f"import sys; sys.path.insert(0, {str(IMAGE_DIR)!r}); from kernelgw_kernel.fs import main; main()"
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code, "--root", str(root), *args],
        input=stdin,
        capture_output=True,
        timeout=60,
    )
    answers, rest = [], proc.stdout
    while rest.startswith(b"{"):
        line, _, rest = rest.partition(b"\n")
        answers.append(json.loads(line))
    return answers, rest, proc.returncode


def frames(*chunks: bytes, commit: bool = True) -> bytes:
    out = b"".join(len(c).to_bytes(4, "big") + c for c in chunks)
    return out + (b"\0\0\0\0" if commit else b"")


def put(root: Path, path: str, *chunks: bytes, commit: bool = True, max_bytes: int = 1 << 30) -> list[dict]:
    args = ("put", "--max-bytes", str(max_bytes), "--quota", str(1 << 60), "--", path)
    return fs(root, *args, stdin=frames(*chunks, commit=commit))[0]


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_put_get_list_delete_roundtrip(tmp_path: Path) -> None:
    ready, done = put(tmp_path, "sub/dir/data.csv", b"a,b\n", b"1,2\n")
    assert ready["ok"] and ready["limit"] > 0
    assert done["ok"] and done["created"] and done["size"] == 8 and done["type"] == "file"
    assert (tmp_path / "sub/dir/data.csv").read_bytes() == b"a,b\n1,2\n"

    (header,), body, code = fs(tmp_path, "get", "--", "sub/dir/data.csv")
    assert code == 0 and header["size"] == 8 and body == b"a,b\n1,2\n"

    (listing,), _, _ = fs(tmp_path, "list", "--recursive", "--", "")
    assert [(e["path"], e["type"]) for e in listing["entries"]] == [
        ("sub", "directory"),
        ("sub/dir", "directory"),
        ("sub/dir/data.csv", "file"),
    ]
    (flat,), _, _ = fs(tmp_path, "list", "--", "sub")
    assert [e["path"] for e in flat["entries"]] == ["sub/dir"]

    _, done = put(tmp_path, "sub/dir/data.csv", b"replaced")
    assert done["created"] is False and done["size"] == 8

    (deleted,), _, code = fs(tmp_path, "delete", "--", "sub")
    assert code == 0 and deleted["type"] == "directory" and tree(tmp_path) == []


def test_upload_without_commit_or_over_limit_leaves_nothing(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_bytes(b"old")
    before = tree(tmp_path)
    ready, cut = put(tmp_path, "new/dir/file.bin", b"x" * 100, commit=False)
    assert cut == {"ok": False, "error": "aborted", "message": "the upload was cut off before it ended"}
    ready, over = put(tmp_path, "keep.txt", b"x" * 100, b"y" * 100, max_bytes=150)
    assert ready["limit"] == 150 and over["error"] == "quota"
    assert tree(tmp_path) == before and (tmp_path / "keep.txt").read_bytes() == b"old"


def test_symlinks_are_refused_anywhere_and_nothing_is_touched(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    root = tmp_path / "ws"
    root.mkdir()
    (root / "etc").symlink_to("/etc")
    (root / "out").symlink_to(outside)
    (root / "pw").symlink_to("/etc/passwd")
    (root / "inside").symlink_to(root / "etc")
    for path in ["etc/passwd", "out/secret", "pw", "inside/passwd"]:
        (answer,), body, code = fs(root, "get", "--", path)
        assert code == 1 and answer["error"] == "symlink" and body == b"", path
    for path in ["etc/evil", "out/secret", "pw", "out/new/dir/x"]:
        answers = put(root, path, b"evil")
        assert answers[-1]["error"] == "symlink", path
    for path in ["etc", "out"]:
        (answer,), _, _ = fs(root, "list", "--", path)
        assert answer["error"] == "symlink"
    (answer,), _, _ = fs(root, "delete", "--", "out/secret")
    assert answer["error"] == "symlink"
    assert (outside / "secret").read_text() == "s" and sorted(os.listdir(outside)) == ["secret"]
    # the link itself may be removed; what it points to stays
    (answer,), _, code = fs(root, "delete", "--", "out")
    assert code == 0 and answer["type"] == "symlink" and (outside / "secret").exists()


def test_helper_refuses_bad_paths_itself(tmp_path: Path) -> None:
    for path in ["../x", "/etc/passwd", "a//b", "a/./b", ""]:
        (answer,), _, code = fs(tmp_path, "get", "--", path)
        assert code == 1 and answer["error"] == "invalid_path", path


def test_option_like_names_are_paths_not_options(tmp_path: Path) -> None:
    _, done = put(tmp_path, "--root=x", b"1")
    assert done["ok"] and (tmp_path / "--root=x").read_bytes() == b"1"
    (_answer,), body, _ = fs(tmp_path, "get", "--", "--root=x")
    assert body == b"1"


def test_missing_and_wrong_kinds(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    expect = {
        ("get", "nope"): "not_found",
        ("get", "d"): "is_directory",
        ("get", "f/x"): "not_directory",
        ("get", "fifo"): "not_regular",
        ("delete", "nope"): "not_found",
        ("list", "nope"): "not_found",
    }
    for (cmd, path), error in expect.items():
        (answer,), _, _ = fs(tmp_path, cmd, "--", path)
        assert answer["error"] == error, (cmd, path)
    assert put(tmp_path, "d", b"x")[-1]["error"] == "is_directory"


# ------------------------------------------------------------------ artifacts


def test_snapshot_and_changes(kernel_module: ModuleType, tmp_path: Path) -> None:
    k = kernel_module
    (tmp_path / "old.csv").write_text("a")
    (tmp_path / "same.txt").write_text("s")
    before = k.snapshot(str(tmp_path))
    (tmp_path / "old.csv").write_text("ab")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "plot.png").write_bytes(b"png")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"c")
    (tmp_path / (k.UPLOAD_PREFIX + "abc")).write_bytes(b"partial")
    (tmp_path / "link").symlink_to("/etc/passwd")
    items = k.changes(before, k.snapshot(str(tmp_path)))
    assert items == [
        {"path": "old.csv", "size": 2, "mime_type": "text/csv", "change": "modified"},
        {"path": "sub/plot.png", "size": 3, "mime_type": "image/png", "change": "created"},
    ]
    report = k.ArtifactReport(items)
    assert json.loads(repr(report)) == items


def test_snapshot_is_capped(kernel_module: ModuleType, tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"f{i}").write_text("x")
    assert len(kernel_module.snapshot(str(tmp_path), limit=10)) == 10


def test_a_path_user_code_made_unreadable_is_a_400_not_a_500() -> None:
    from kernelgw.errors import BadRequest, KernelGWError
    from kernelgw.runtime.workspace import raise_for_answer

    with pytest.raises(BadRequest, match="made this path inaccessible"):
        raise_for_answer({"ok": False, "error": "io_error", "message": "Permission denied (EACCES)"})
    with pytest.raises(KernelGWError) as other:
        raise_for_answer({"ok": False, "error": "io_error", "message": "Input/output error (EIO)"})
    assert other.value.status_code == 500


# ------------------------------------------------------------------ lost answers


class _SilentThenAnswering:
    """Stands in for the engine (pure logic of `WorkspaceFiles`): each exec's
    process prints the next of ``outputs`` and exits 0; ``b""`` is an answer the
    engine's stream lost."""

    def __init__(self, *outputs: bytes) -> None:
        self.outputs = list(outputs)
        self.execs: list[list[str]] = []

    async def exec(self, handle: object, args: list[str], stdin: bool = False, timeout: float = 0) -> object:
        self.execs.append(args)
        backend = self

        class Process:
            stderr = b""
            pending = backend.outputs.pop(0)

            async def read(self) -> bytes:
                data, self.pending = self.pending, b""
                return data

            async def exit_code(self) -> int:
                return 0

            async def close(self) -> None:
                pass

        return Process()


LISTING = b'{"ok": true, "path": "", "entries": [], "truncated": false}\n'


async def test_a_listing_whose_answer_was_lost_is_asked_again_once() -> None:
    from kernelgw.runtime.workspace import HelperOutputLost, WorkspaceFiles

    backend = _SilentThenAnswering(b"", LISTING)
    files = WorkspaceFiles(backend, max_upload_bytes=1, timeout=5)  # type: ignore[arg-type]
    assert (await files.list(object(), "")).entries == []  # type: ignore[arg-type]
    assert len(backend.execs) == 2
    # twice lost: the error says so
    backend = _SilentThenAnswering(b"", b"")
    with pytest.raises(HelperOutputLost, match="ended without an answer"):
        await WorkspaceFiles(backend, max_upload_bytes=1, timeout=5).list(object(), "")  # type: ignore[arg-type]
    # a delete is not run twice: its first run may have deleted
    backend = _SilentThenAnswering(b"", b'{"ok": true, "type": "file"}\n')
    with pytest.raises(HelperOutputLost):
        await WorkspaceFiles(backend, max_upload_bytes=1, timeout=5).delete(object(), "a.txt")  # type: ignore[arg-type]
    assert len(backend.execs) == 1
