"""The workspace helper's operations for E2B's filesystem calls (``stat``,
``listdir``, ``mkdir``, ``move`` in images/python/kernelgw_kernel/fs.py), run on
this machine's file system as the gateway runs them in a container: no path
through a link, links described and moved as themselves, never followed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.unit.runtime.test_workspace import fs, tree


def test_stat_describes_an_entry_and_a_link_without_following_it(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("hello")
    os.chmod(tmp_path / "f.txt", 0o640)
    (tmp_path / "l").symlink_to("/etc/passwd")
    (answer,), _, code = fs(tmp_path, "stat", "--", "f.txt")
    assert code == 0 and (answer["path"], answer["type"], answer["size"]) == ("f.txt", "file", 5)
    assert stat.S_IMODE(answer["st_mode"]) == 0o640 and stat.S_ISREG(answer["st_mode"])
    assert answer["owner"] and answer["group"] and "symlink_target" not in answer
    assert answer["own_user"] is True and answer["own_group"] is True  # this process's, as the kernel's in a container
    (link,), _, _ = fs(tmp_path, "stat", "--", "l")
    assert (link["type"], link["symlink_target"]) == ("symlink", "/etc/passwd")
    (root,), _, _ = fs(tmp_path, "stat", "--", "")
    assert (root["path"], root["type"]) == ("", "directory")
    for path, error in [
        ("nope", "not_found"),
        ("l/x", "symlink"),
        ("f.txt/x", "not_directory"),
        ("../x", "invalid_path"),
    ]:
        (answer,), _, code = fs(tmp_path, "stat", "--", path)
        assert code == 1 and answer["error"] == error, path


def test_listdir_goes_as_deep_as_asked_and_never_into_a_link(tmp_path: Path) -> None:
    (tmp_path / "a/b/c").mkdir(parents=True)
    (tmp_path / "a/b/c/deep.txt").write_text("d")
    (tmp_path / "a/top.txt").write_text("t")
    (tmp_path / "a/etc").symlink_to("/etc")
    (tmp_path / ".kernelgw-upload-123").write_text("partial")

    def paths(*args: str) -> list[str]:
        (answer,), _, code = fs(tmp_path, "listdir", *args)
        assert code == 0, answer
        return sorted(e["path"] for e in answer["entries"])

    assert paths("--", "") == ["a"]  # an upload's temporary file is not listed
    assert paths("--depth", "1", "--", "a") == ["a/b", "a/etc", "a/top.txt"]
    assert paths("--depth", "2", "--", "a") == ["a/b", "a/b/c", "a/etc", "a/top.txt"]
    assert paths("--depth", "9", "--", "a") == ["a/b", "a/b/c", "a/b/c/deep.txt", "a/etc", "a/top.txt"]
    (answer,), _, _ = fs(tmp_path, "listdir", "--", "a")
    link = next(e for e in answer["entries"] if e["path"] == "a/etc")
    assert (link["type"], link["symlink_target"]) == ("symlink", "/etc")
    for path, error in [("a/top.txt", "not_directory"), ("a/etc", "symlink"), ("nope", "not_found")]:
        (answer,), _, code = fs(tmp_path, "listdir", "--", path)
        assert code == 1 and answer["error"] == error, path
    (capped,), _, _ = fs(tmp_path, "listdir", "--depth", "9", "--max-entries", "2", "--", "a")
    assert capped["truncated"] is True and len(capped["entries"]) == 2


def test_mkdir_makes_parents_and_says_whether_it_made_it(tmp_path: Path) -> None:
    (made,), _, code = fs(tmp_path, "mkdir", "--", "x/y/z")
    assert code == 0 and made["created"] is True and made["type"] == "directory" and (tmp_path / "x/y/z").is_dir()
    (again,), _, code = fs(tmp_path, "mkdir", "--", "x/y/z")
    assert code == 0 and again["created"] is False
    (tmp_path / "file").write_text("f")
    (tmp_path / "out").symlink_to(tmp_path.parent)
    before = sorted(os.listdir(tmp_path.parent))
    for path, error in [
        ("file", "not_directory"),
        ("file/sub", "not_directory"),
        ("out", "symlink"),
        ("out/new", "symlink"),
    ]:
        (answer,), _, code = fs(tmp_path, "mkdir", "--", path)
        assert code == 1 and answer["error"] == error, path
    assert sorted(os.listdir(tmp_path.parent)) == before  # nothing made through the link


def test_move_renames_names_themselves(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    root = tmp_path / "ws"
    root.mkdir()
    (root / "f.txt").write_text("f")
    (root / "out").symlink_to(outside)
    (moved,), _, code = fs(root, "move", "--", "f.txt", "new/dir/g.txt")
    assert code == 0 and (moved["path"], moved["type"], moved["size"]) == ("new/dir/g.txt", "file", 1)
    assert (root / "new/dir/g.txt").read_text() == "f" and not (root / "f.txt").exists()
    (link,), _, code = fs(root, "move", "--", "out", "link")  # the link moves, not what it points to
    assert code == 0 and link["type"] == "symlink" and (root / "link").is_symlink()
    assert sorted(os.listdir(outside)) == ["secret"]
    (root / "d").mkdir()
    (root / "d/x").write_text("x")
    (root / "e").mkdir()
    (root / "e/y").write_text("y")
    refusals = [
        (("nope", "z"), "not_found"),
        (("link/secret", "stolen"), "symlink"),
        (("new/dir/g.txt", "link/g.txt"), "symlink"),
        (("new", "new/dir/inside"), "invalid_path"),
        (("d", "e"), "invalid_path"),
        (("d", "new/dir/g.txt"), "not_directory"),
        (("new/dir/g.txt", "d"), "is_directory"),
        (("../x", "y"), "invalid_path"),
    ]
    before = tree(root)
    for (source, destination), error in refusals:
        (answer,), _, code = fs(root, "move", "--", source, destination)
        assert code == 1 and answer["error"] == error, (source, destination, answer)
    assert tree(root) == before and sorted(os.listdir(outside)) == ["secret"]
