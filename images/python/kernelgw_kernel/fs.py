"""Workspace file operations, run by the gateway with ``docker exec`` as the
kernel's user::

    python -I -m kernelgw_kernel.fs put    PATH --max-bytes N --quota N [--metadata JSON]
    python -I -m kernelgw_kernel.fs get    PATH [--exit-on-eof] [--idle-timeout S]
    python -I -m kernelgw_kernel.fs list   PATH [--recursive] [--max-entries N]
    python -I -m kernelgw_kernel.fs delete PATH
    python -I -m kernelgw_kernel.fs stat   PATH
    python -I -m kernelgw_kernel.fs listdir PATH [--depth N] [--max-entries N]
    python -I -m kernelgw_kernel.fs mkdir  PATH
    python -I -m kernelgw_kernel.fs move   SOURCE DESTINATION

(``-I``: the working directory and PYTHON* variables cannot substitute this
module.) Every path is relative to the workspace and walked one component at a
time from a descriptor of the workspace, and every component, the last one
included, is taken the same way (`open_at`): ``lstat`` it relative to its
parent's descriptor and refuse a symbolic link or any kind of file not wanted
there; open it with ``O_NOFOLLOW``; then ``fstat`` the descriptor and require
the very file the ``lstat`` saw. A link anywhere in the path is refused when it
is met, even one user code made a moment ago, and one swapped in between the
two calls is caught by the identity check, so nothing outside the workspace is
ever opened (no check-then-use race). ``O_NOFOLLOW`` alone is not enough:
gVisor (runsc, at least Debian's 20221219 build) follows a final symbolic link
when ``O_DIRECTORY`` is given along with it. FIFOs, sockets and devices are
never opened (a FIFO would block, a socket gives ENXIO). ``delete`` removes a
symlink named as the last component itself; it never follows one.

``stat``, ``listdir``, ``mkdir`` and ``move`` serve E2B's filesystem calls
(`describe`: an entry with its permission bits, owner, group and, for a link,
what it points to, read with ``readlink``, never followed). ``move`` renames
the last component's name itself (``renameat``), as ``delete`` unlinks it: a
link is moved, not what it points to.

Answers are JSON lines on stdout: ``{"ok": true, ...}`` or
``{"ok": false, "error": CODE, "message": ...}`` with CODE one of
``invalid_path``, ``not_found``, ``symlink``, ``is_directory``,
``not_directory``, ``not_regular``, ``quota``, ``no_space``, ``io_error``,
``aborted``, ``no_metadata``, ``metadata_too_large``. ``get`` sends one
header line, then exactly ``size`` bytes.

``put`` protocol: the helper answers a first line with how many bytes the
upload may have (``limit``) and the numbers it came from, then reads frames
from stdin: a 4-byte big-endian length and that many bytes; a zero-length frame
commits. The data goes to a temporary file at the workspace root, and only on
commit are missing parent directories made and the file moved into place
(``rename``, atomic), so an upload that is refused, too large or cut off
leaves the workspace as it was. ``--metadata`` (E2B's file metadata) is kept
on the file as ``user.e2b.<key>`` extended attributes, set on the temporary
file, so the file never appears without them; `describe` reads them back.
"""

from __future__ import annotations

import argparse
import errno
import functools
import grp
import json
import os
import pwd
import secrets
import signal
import stat
import sys
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO, NoReturn

from kernelgw_kernel import UPLOAD_PREFIX, WORKSPACE

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
CHUNK = 1 << 20
# Both never follow a link in the last component (except that gVisor ignores
# O_NOFOLLOW next to O_DIRECTORY: see `open_at`) and never block: O_NONBLOCK
# keeps a FIFO swapped in after the lstat from waiting for a writer.
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
LINK_HINT = {"symlink": "paths through links are refused"}
"""Added to a refusal's message, by code, unless the caller gives its own."""


class Refused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def say(out: BinaryIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
    out.flush()


def split_path(path: str, *, allow_root: bool = False) -> list[str]:
    """The components of a relative workspace path; refuses what the gateway
    refuses too (absolute, ``..``, ``.``, empty components, NUL, backslash)."""
    if "\x00" in path:
        raise Refused("invalid_path", "the path contains a NUL character")
    if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise Refused("invalid_path", f"the path is longer than {MAX_PATH_BYTES} bytes")
    if path.startswith("/"):
        raise Refused("invalid_path", "the path is absolute; give it relative to the workspace")
    path = path.rstrip("/") if allow_root else path
    if path == "":
        if allow_root:
            return []
        raise Refused("invalid_path", "the path is empty")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise Refused("invalid_path", f"the path has a {part or 'empty'!r} component")
        if "\\" in part:
            raise Refused("invalid_path", "the path contains a backslash; separate directories with /")
        if len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            raise Refused("invalid_path", f"a path component is longer than {MAX_NAME_BYTES} bytes")
    return parts


def lstat(dir_fd: int | None, name: str) -> os.stat_result | None:
    """The entry ``name`` of the directory ``dir_fd`` itself (a link is not
    followed), or None when there is none."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def refusal(shown: str, mode: int, *, directory: bool, hints: Mapping[str, str] = LINK_HINT) -> Refused | None:
    """Why an entry of ``mode`` may not be used as a directory (``directory``)
    or as a regular file; None when it may. ``hints`` complete the message."""
    if stat.S_ISLNK(mode):
        code, what = "symlink", "is a symbolic link"
    elif directory:
        if stat.S_ISDIR(mode):
            return None
        code, what = "not_directory", "is not a directory"
    elif stat.S_ISREG(mode):
        return None
    elif stat.S_ISDIR(mode):
        code, what = "is_directory", "is a directory"
    else:
        code, what = "not_regular", "is not a regular file (a FIFO, a socket or a device)"
    hint = hints.get(code)
    return Refused(code, f"{shown!r} {what}" + (f"; {hint}" if hint else ""))


def same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def open_at(
    dir_fd: int | None, name: str, shown: str, *, directory: bool, hints: Mapping[str, str] = LINK_HINT
) -> tuple[int, os.stat_result] | None:
    """Open the entry ``name`` of the directory ``dir_fd``, which must be a
    directory (``directory``) or else a regular file, never a symbolic link.
    Returns the descriptor and its ``fstat``, or None when there is no such
    entry; anything else is refused (``shown`` names it in the message).

    ``O_NOFOLLOW`` is not trusted on its own: under gVisor (runsc 20221219)
    ``O_DIRECTORY | O_NOFOLLOW`` opens what a link points to. So the entry is
    ``lstat``-ed first, and the descriptor opened must be that very file (same
    device and inode): a name swapped for a link (or anything else) between the
    two calls is refused, whatever the runtime does with the flags. Checking
    the kind first also means a FIFO, socket or device is never opened at all.
    """
    st = lstat(dir_fd, name)
    if st is None:
        return None
    refused = refusal(shown, st.st_mode, directory=directory, hints=hints)
    if refused:
        raise refused
    try:
        fd = os.open(name, O_DIR if directory else O_FILE, dir_fd=dir_fd)
    except OSError as exc:
        # ELOOP (a link), ENOTDIR, ENXIO/ENODEV (a socket or device), ENOENT:
        # the entry changed since the lstat; say what it is now
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO, errno.ENODEV, errno.ENOENT):
            raise
        changed(dir_fd, name, shown, directory=directory, hints=hints)
        return None
    try:
        fst = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if same_file(st, fst):
        return fd, fst
    os.close(fd)
    changed(dir_fd, name, shown, directory=directory, hints=hints)
    return None


def changed(dir_fd: int | None, name: str, shown: str, *, directory: bool, hints: Mapping[str, str]) -> None:
    """Refuse an entry that changed between its lstat and its use: as what it
    is now (a link, say), or else plainly. None when it is gone by now."""
    st = lstat(dir_fd, name)
    if st is None:
        return
    refused = refusal(shown, st.st_mode, directory=directory, hints=hints)
    raise refused or Refused("invalid_path", f"{shown!r} changed while it was being used; try again")


def walk(root_fd: int, parts: list[str], *, create: bool = False) -> tuple[int, bool]:
    """Descend from ``root_fd`` through the directories ``parts``, refusing
    symbolic links and non-directories on the way (see `open_at`). Returns a
    descriptor of the deepest directory reached and whether that is all of
    ``parts``: a missing directory ends the walk early, or is made when
    ``create``."""
    fd = os.dup(root_fd)
    try:
        for i, name in enumerate(parts):
            shown = "/".join(parts[: i + 1])
            opened = open_at(fd, name, shown, directory=True)
            if opened is None:
                if not create:
                    return fd, False
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)  # never follows a link: EEXIST
                except FileExistsError:
                    pass
                opened = open_at(fd, name, shown, directory=True)
                if opened is None:
                    raise Refused("not_found", f"{shown!r} was removed while it was being made")
            os.close(fd)
            fd = opened[0]
        return fd, True
    except BaseException:
        os.close(fd)
        raise


def open_dir(root_fd: int, parts: list[str], *, create: bool = False) -> int:
    """A descriptor of the directory ``parts`` (``[]``: the root); see `walk`."""
    fd, complete = walk(root_fd, parts, create=create)
    if not complete:
        os.close(fd)
        raise Refused("not_found", f"{'/'.join(parts)!r} does not exist in the workspace")
    return fd


def open_root(root: str) -> int:
    opened = open_at(None, root, root, directory=True)
    if opened is None:
        raise Refused("not_found", f"the workspace {root} does not exist")
    return opened[0]


def _entry(rel: str, st: os.stat_result) -> dict[str, Any]:
    if stat.S_ISREG(st.st_mode):
        kind = "file"
    elif stat.S_ISDIR(st.st_mode):
        kind = "directory"
    elif stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    else:
        kind = "other"
    return {"path": rel, "type": kind, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


# ------------------------------------------------------------------ commands


def exit_on_eof(inp: BinaryIO) -> None:
    """Exit as soon as stdin ends: the engine closes it when the gateway drops the
    connection, and a helper blocked writing to a pipe nobody reads would
    otherwise stay forever."""
    import threading

    def watch() -> None:
        while inp.read(65536):
            pass
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


GET_HINTS = {**LINK_HINT, "symlink": "download what it points to", "is_directory": "list it instead"}


def cmd_get(root: str, path: str, out: BinaryIO, idle_timeout: int = 0) -> None:
    parts = split_path(path)
    root_fd = open_root(root)
    try:
        parent = open_dir(root_fd, parts[:-1])
        try:
            opened = open_at(parent, parts[-1], path, directory=False, hints=GET_HINTS)
        finally:
            os.close(parent)
    finally:
        os.close(root_fd)
    if opened is None:
        raise Refused("not_found", f"{path!r} does not exist in the workspace")
    fd, st = opened
    with os.fdopen(fd, "rb", buffering=0) as f:
        size = st.st_size
        say(out, {"ok": True, **_entry(path, st)})
        left = size
        out_fd = out.fileno()
        use_sendfile = True
        while left > 0:
            # exactly the size announced: a file that grows is cut, one that
            # shrinks ends early (the gateway then reports a short download)
            if idle_timeout:
                signal.alarm(idle_timeout)  # no progress for that long: the default action ends us
            if use_sendfile:
                try:
                    sent = os.sendfile(out_fd, fd, None, min(left, CHUNK))
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                        raise
                    use_sendfile = False
                    continue
            else:
                data = f.read(min(left, CHUNK))
                sent = len(data)
                out.write(data)
            if sent == 0:
                break
            left -= sent
        out.flush()


def cmd_list(root: str, path: str, recursive: bool, max_entries: int, out: BinaryIO) -> None:
    parts = split_path(path, allow_root=True)
    shown = "/".join(parts)
    root_fd = open_root(root)
    try:
        if not parts:
            dir_fd = os.dup(root_fd)
        else:
            parent = open_dir(root_fd, parts[:-1])
            try:
                st = lstat(parent, parts[-1])
                if st is None:
                    raise Refused("not_found", f"{path!r} does not exist in the workspace")
                if not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
                    # one file (or FIFO...) asked for: its lstat is all there is to say
                    say(out, {"ok": True, "path": shown, "entries": [_entry(shown, st)], "truncated": False})
                    return
                opened = open_at(parent, parts[-1], shown, directory=True)  # refuses a link
                if opened is None:
                    raise Refused("not_found", f"{path!r} does not exist in the workspace")
                dir_fd = opened[0]
            finally:
                os.close(parent)
    finally:
        os.close(root_fd)
    entries, truncated = list_tree(dir_fd, shown + "/" if parts else "", recursive, max_entries)
    say(out, {"ok": True, "path": shown, "entries": entries, "truncated": truncated})


def list_tree(
    dir_fd: int,
    prefix: str,
    recursive: bool,
    max_entries: int,
    *,
    max_depth: int | None = None,
    details: bool = False,
) -> tuple[list[dict[str, Any]], bool]:
    """The entries of the directory ``dir_fd`` (closed here), depth first, named
    ``prefix`` + their path, and whether ``max_entries`` cut the list short.
    Links are listed, never followed: recursion enters only what `open_at`
    opens as a directory, and skips an entry that changed meanwhile.
    ``max_depth``: how many levels a recursive listing takes (1: the directory's
    own entries); ``details``: entries as `describe` makes them."""
    entries: list[dict[str, Any]] = []
    stack = [(dir_fd, prefix, 1)]
    try:
        while stack:
            fd, rel, level = stack.pop()
            subdirs: list[tuple[int, str, int]] = []
            try:
                for name in sorted(os.listdir(fd)):
                    if name.startswith(UPLOAD_PREFIX):
                        continue
                    st = lstat(fd, name)
                    if st is None:
                        continue
                    if len(entries) >= max_entries:
                        return entries, True
                    entries.append(describe(rel + name, st, fd, name) if details else _entry(rel + name, st))
                    deeper = max_depth is None or level < max_depth
                    if recursive and deeper and stat.S_ISDIR(st.st_mode):
                        try:
                            opened = open_at(fd, name, rel + name, directory=True)
                        except (Refused, OSError):
                            opened = None  # swapped for a link, or unreadable: listed, not entered
                        if opened is not None:
                            subdirs.append((opened[0], rel + name + "/", level + 1))
            finally:
                os.close(fd)
                stack.extend(reversed(subdirs))  # closed below if we stop early
        return entries, False
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def cmd_delete(root: str, path: str, out: BinaryIO) -> None:
    parts = split_path(path)
    root_fd = open_root(root)
    try:
        parent = open_dir(root_fd, parts[:-1])
    finally:
        os.close(root_fd)
    try:
        name = parts[-1]
        st = lstat(parent, name)
        if st is None:
            raise Refused("not_found", f"{path!r} does not exist in the workspace")
        if stat.S_ISDIR(st.st_mode):
            opened = open_at(parent, name, path, directory=True)
            if opened is None:
                raise Refused("not_found", f"{path!r} does not exist in the workspace")
            empty_tree(opened[0], path)
            os.rmdir(name, dir_fd=parent)
            kind = "directory"
        else:
            # unlink removes the name itself: a link goes, what it points to stays
            os.unlink(name, dir_fd=parent)
            kind = "symlink" if stat.S_ISLNK(st.st_mode) else "file"
    finally:
        os.close(parent)
    say(out, {"ok": True, "path": path, "type": kind})


def empty_tree(dir_fd: int, shown: str) -> None:
    """Remove everything in the directory ``dir_fd`` (closed here), never
    following a link: subdirectories are entered only through `open_at`. Not
    recursive (a deep tree must not exhaust Python's stack); one descriptor and
    one listing are held per level being emptied."""
    stack: list[tuple[int, str, Iterator[str]]] = []

    def enter(fd: int, rel: str) -> None:
        try:
            names = iter(os.listdir(fd))
        except BaseException:
            os.close(fd)
            raise
        stack.append((fd, rel, names))

    try:
        enter(dir_fd, shown)
        while stack:
            fd, rel, names = stack[-1]
            for name in names:
                st = lstat(fd, name)
                if st is None:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    opened = open_at(fd, name, f"{rel}/{name}", directory=True)
                    if opened is not None:
                        enter(opened[0], f"{rel}/{name}")
                        break  # empty that first, then go on with this one
                else:
                    os.unlink(name, dir_fd=fd)  # a link itself, never what it points to
            else:
                # this one is empty now: remove it from its parent (the caller removes the top)
                stack.pop()
                os.close(fd)
                if stack:
                    os.rmdir(rel.rpartition("/")[2], dir_fd=stack[-1][0])
    finally:
        for fd, _, _ in stack:
            os.close(fd)


# ------------------------------------------------------------------ E2B's calls


@functools.cache
def user_name(uid: int) -> str:
    """The account's name in the container, else the number (as E2B's envd says it)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@functools.cache
def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def describe(rel: str, st: os.stat_result, dir_fd: int | None, name: str) -> dict[str, Any]:
    """`_entry` and what E2B's entries carry besides: the whole ``st_mode``,
    owner and group (``own``: the kernel's user's, this helper's, whose uid the
    container may have no name for), and for a symbolic link what it points
    to (``readlink`` of ``name`` in ``dir_fd``: read, never followed)."""
    entry = _entry(rel, st)
    entry.update(st_mode=st.st_mode, owner=user_name(st.st_uid), group=group_name(st.st_gid))
    entry.update(own_user=st.st_uid == os.geteuid(), own_group=st.st_gid == os.getegid())
    if stat.S_ISLNK(st.st_mode):
        try:
            entry["symlink_target"] = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            pass  # changed meanwhile: listed without its target
    elif dir_fd is not None and name:
        metadata = read_metadata(dir_fd, name)
        if metadata:
            entry["metadata"] = metadata
    return entry


METADATA_XATTR = "user.e2b."
"""E2B's file metadata: extended attributes of this prefix (envd's)."""


def read_metadata(dir_fd: int, name: str) -> dict[str, str]:
    """The E2B metadata of the entry ``name`` of ``dir_fd`` (its ``user.e2b.*``
    attributes), never following a link: read relative to the directory, from
    within it (``fchdir``: the xattr calls take no directory descriptor)."""
    found: dict[str, str] = {}
    os.fchdir(dir_fd)
    try:
        for attr in os.listxattr(name, follow_symlinks=False):
            if attr.startswith(METADATA_XATTR):
                value = os.getxattr(name, attr, follow_symlinks=False)
                found[attr[len(METADATA_XATTR) :]] = value.decode("utf-8", "replace")
    except OSError:
        return found  # gone meanwhile, or a file system without them
    finally:
        os.chdir("/")
    return found


def cmd_stat(root: str, path: str, out: BinaryIO) -> None:
    """The entry ``path`` itself (a link is described, not followed); ``""`` is the workspace."""
    parts = split_path(path, allow_root=True)
    root_fd = open_root(root)
    try:
        if not parts:
            entry = describe("", os.fstat(root_fd), None, "")
        else:
            parent = open_dir(root_fd, parts[:-1])
            try:
                st = lstat(parent, parts[-1])
                if st is None:
                    raise Refused("not_found", f"{path!r} does not exist in the workspace")
                entry = describe("/".join(parts), st, parent, parts[-1])
            finally:
                os.close(parent)
    finally:
        os.close(root_fd)
    say(out, {"ok": True, **entry})


LISTDIR_HINTS = {**LINK_HINT, "not_directory": "only a directory is listed"}


def cmd_listdir(root: str, path: str, depth: int, max_entries: int, out: BinaryIO) -> None:
    """A directory's entries (`describe`), ``depth`` levels deep; anything but a
    directory is refused (a link too: it is not entered)."""
    parts = split_path(path, allow_root=True)
    shown = "/".join(parts)
    root_fd = open_root(root)
    try:
        if not parts:
            dir_fd = os.dup(root_fd)
        else:
            parent = open_dir(root_fd, parts[:-1])
            try:
                opened = open_at(parent, parts[-1], shown, directory=True, hints=LISTDIR_HINTS)
            finally:
                os.close(parent)
            if opened is None:
                raise Refused("not_found", f"{path!r} does not exist in the workspace")
            dir_fd = opened[0]
    finally:
        os.close(root_fd)
    prefix = shown + "/" if parts else ""
    entries, truncated = list_tree(dir_fd, prefix, True, max_entries, max_depth=max(1, depth), details=True)
    say(out, {"ok": True, "path": shown, "entries": entries, "truncated": truncated})


MKDIR_HINTS = {**LINK_HINT, "not_directory": "something else of that name exists"}


def cmd_mkdir(root: str, path: str, out: BinaryIO) -> None:
    """Make the directory ``path`` and any missing parents; ``created`` is false
    when it existed already. A file (or a link) of that name is refused."""
    parts = split_path(path)
    root_fd = open_root(root)
    try:
        parent = open_dir(root_fd, parts[:-1], create=True)
    finally:
        os.close(root_fd)
    try:
        name = parts[-1]
        created = True
        try:
            os.mkdir(name, 0o755, dir_fd=parent)  # never follows a link: EEXIST
        except FileExistsError:
            created = False
        st = lstat(parent, name)
        if st is None:
            raise Refused("not_found", f"{path!r} was removed while it was being made")
        refused = refusal(path, st.st_mode, directory=True, hints=MKDIR_HINTS)
        if refused:
            raise refused
        entry = describe(path, st, parent, name)
    finally:
        os.close(parent)
    say(out, {"ok": True, "created": created, **entry})


MOVE_ERRORS = {
    errno.ENOENT: ("not_found", "{source!r} was removed while it was being moved"),
    errno.EISDIR: ("is_directory", "{destination!r} is a directory; only a directory can replace it"),
    errno.ENOTDIR: ("not_directory", "{destination!r} is not a directory; a directory cannot replace it"),
    errno.ENOTEMPTY: ("invalid_path", "{destination!r} is a directory that is not empty"),
    errno.EEXIST: ("invalid_path", "{destination!r} is a directory that is not empty"),
    errno.EINVAL: ("invalid_path", "{source!r} cannot be moved into itself"),
}
"""What ``rename`` refuses, as the helper's errors."""


def cmd_move(root: str, source: str, destination: str, out: BinaryIO) -> None:
    """Rename ``source`` to ``destination`` (missing parents of the destination
    are made; an existing file there is replaced, as ``rename`` does). The
    names themselves move: a link is moved, never followed."""
    src, dst = split_path(source), split_path(destination)
    root_fd = open_root(root)
    try:
        src_parent = open_dir(root_fd, src[:-1])
        try:
            if lstat(src_parent, src[-1]) is None:
                raise Refused("not_found", f"{source!r} does not exist in the workspace")
            dst_parent = open_dir(root_fd, dst[:-1], create=True)
            try:
                try:
                    os.rename(src[-1], dst[-1], src_dir_fd=src_parent, dst_dir_fd=dst_parent)
                except OSError as exc:
                    if exc.errno not in MOVE_ERRORS:
                        raise
                    code, message = MOVE_ERRORS[exc.errno]
                    raise Refused(code, message.format(source=source, destination=destination)) from None
                st = lstat(dst_parent, dst[-1])
                if st is None:
                    raise Refused("not_found", f"{destination!r} was removed right after the move")
                entry = describe("/".join(dst), st, dst_parent, dst[-1])
            finally:
                os.close(dst_parent)
        finally:
            os.close(src_parent)
    finally:
        os.close(root_fd)
    say(out, {"ok": True, **entry})


def read_exact(inp: BinaryIO, n: int) -> bytes | None:
    """``n`` bytes, or None at end of input before that."""
    buf = bytearray()
    while len(buf) < n:
        data = inp.read(n - len(buf))
        if not data:
            return None
        buf += data
    return bytes(buf)


def read_frames(inp: BinaryIO) -> Any:
    """Yield the frames' data; raise Refused('aborted') at end of input before the
    zero-length frame."""
    while True:
        head = read_exact(inp, 4)
        if head is None:
            raise Refused("aborted", "the upload was cut off before it ended")
        n = int.from_bytes(head, "big")
        if n == 0:
            return
        while n > 0:
            data = inp.read(min(n, CHUNK))
            if not data:
                raise Refused("aborted", "the upload was cut off before it ended")
            n -= len(data)
            yield data


def drain(inp: BinaryIO) -> None:
    """Read the rest of the input so the sender is never blocked or broken off."""
    try:
        for _ in read_frames(inp):
            pass
    except Refused:
        pass


PUT_HINTS = {**LINK_HINT, "symlink": "delete it first"}


def check_target(path: str, st: os.stat_result) -> None:
    """An upload replaces only a regular file."""
    refused = refusal(path, st.st_mode, directory=False, hints=PUT_HINTS)
    if refused:
        raise refused


def cmd_put(
    root: str,
    path: str,
    max_bytes: int,
    quota: int,
    inp: BinaryIO,
    out: BinaryIO,
    metadata: Mapping[str, str] | None = None,
) -> None:
    parts = split_path(path)
    root_fd = open_root(root)
    tmp_name: str | None = None
    try:
        # Refuse early what would be refused at the end (links, files in the way),
        # without making anything: missing directories are made on commit.
        existing = 0
        fd, complete = walk(root_fd, parts[:-1])
        try:
            st = lstat(fd, parts[-1]) if complete else None
            if st is not None:
                check_target(path, st)
                existing = st.st_size
        finally:
            os.close(fd)
        vfs = os.statvfs(root_fd)
        used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        free = vfs.f_bavail * vfs.f_frsize
        limit = max(0, min(max_bytes, quota - used + existing, free))
        tmp_name = UPLOAD_PREFIX + secrets.token_hex(8)
        # O_CREAT | O_EXCL never follows a link and never opens an existing file
        tmp_fd = os.open(
            tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=root_fd
        )
        try:
            for key, value in (metadata or {}).items():
                os.setxattr(tmp_fd, METADATA_XATTR + key, value.encode())
        except OSError as exc:
            os.close(tmp_fd)
            if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
                raise Refused(
                    "no_metadata", "the workspace's file system keeps no metadata (extended attributes)"
                ) from None
            if exc.errno in (errno.ENOSPC, errno.E2BIG, errno.ERANGE):
                raise Refused(
                    "metadata_too_large", "the file's metadata is larger than its file system keeps"
                ) from None
            raise
        say(
            out,
            {
                "ok": True,
                "limit": limit,
                "max_bytes": max_bytes,
                "quota": quota,
                "used": used,
                "free": free,
                "existing": existing,
            },
        )
        size = 0
        with os.fdopen(tmp_fd, "wb", buffering=0) as f:
            try:
                for data in read_frames(inp):
                    size += len(data)
                    if size > limit:
                        raise Refused("quota", f"the upload is larger than its limit of {limit} bytes")
                    view = memoryview(data)
                    while view:
                        view = view[f.write(view) :]
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    drain(inp)
                    raise Refused("no_space", "the workspace file system is full") from None
                raise
            except Refused as exc:
                if exc.code != "aborted":
                    drain(inp)
                raise
            parent = open_dir(root_fd, parts[:-1], create=True)
            try:
                st = lstat(parent, parts[-1])
                if st is not None:
                    check_target(path, st)
                # User code (the same user) can rename or replace the temporary
                # file meanwhile: move it only while its name still is ours. Even
                # if it is swapped right after this check, rename moves the name
                # itself (never what a link points to), within the workspace.
                tmp_st = lstat(root_fd, tmp_name)
                if tmp_st is None or not same_file(tmp_st, os.fstat(tmp_fd)):
                    raise Refused("aborted", "the upload's temporary file was moved or replaced before the commit")
                try:
                    os.replace(tmp_name, parts[-1], src_dir_fd=root_fd, dst_dir_fd=parent)
                except OSError as exc:
                    if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.ENOTDIR):
                        raise
                    # the target became a directory since the lstat
                    changed(parent, parts[-1], path, directory=False, hints=PUT_HINTS)
                    raise
                tmp_name = None
            finally:
                os.close(parent)
            done = os.fstat(tmp_fd)  # what was written, whatever is at the name by now
        say(
            out,
            {
                "ok": True,
                "created": st is None,
                **_entry(path, done),
                **({"metadata": dict(metadata)} if metadata else {}),
            },
        )
    finally:
        if tmp_name is not None:
            try:
                os.unlink(tmp_name, dir_fd=root_fd)
            except OSError:
                pass
        os.close(root_fd)


def fail(out: BinaryIO, code: str, message: str) -> NoReturn:
    try:
        say(out, {"ok": False, "error": code, "message": message})
    except OSError:
        pass
    sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kernelgw_kernel.fs")
    parser.add_argument("--root", default=WORKSPACE)
    sub = parser.add_subparsers(dest="command", required=True)
    put = sub.add_parser("put")
    put.add_argument("path")
    put.add_argument("--max-bytes", type=int, required=True)
    put.add_argument("--quota", type=int, required=True)
    put.add_argument("--metadata", default="{}", help="E2B metadata to keep on the file: a JSON object of strings")
    get = sub.add_parser("get")
    get.add_argument("path")
    get.add_argument("--exit-on-eof", action="store_true", help="exit when stdin ends (the gateway went away)")
    get.add_argument("--idle-timeout", type=int, default=0, help="exit when a write stalls this many seconds")
    ls = sub.add_parser("list")
    ls.add_argument("path")
    ls.add_argument("--recursive", action="store_true")
    ls.add_argument("--max-entries", type=int, default=10_000)
    rm = sub.add_parser("delete")
    rm.add_argument("path")
    st = sub.add_parser("stat")
    st.add_argument("path")
    ld = sub.add_parser("listdir")
    ld.add_argument("path")
    ld.add_argument("--depth", type=int, default=1)
    ld.add_argument("--max-entries", type=int, default=10_000)
    md = sub.add_parser("mkdir")
    md.add_argument("path")
    mv = sub.add_parser("move")
    mv.add_argument("source")
    mv.add_argument("destination")
    args = parser.parse_args(argv)
    # paths arrive as UTF-8 (the gateway validated them); keep any odd byte as is
    out = sys.stdout.buffer
    inp = sys.stdin.buffer
    try:
        if args.command == "put":
            cmd_put(args.root, args.path, args.max_bytes, args.quota, inp, out, json.loads(args.metadata))
        elif args.command == "get":
            if args.exit_on_eof:
                exit_on_eof(inp)
            cmd_get(args.root, args.path, out, args.idle_timeout)
        elif args.command == "list":
            cmd_list(args.root, args.path, args.recursive, args.max_entries, out)
        elif args.command == "stat":
            cmd_stat(args.root, args.path, out)
        elif args.command == "listdir":
            cmd_listdir(args.root, args.path, args.depth, args.max_entries, out)
        elif args.command == "mkdir":
            cmd_mkdir(args.root, args.path, out)
        elif args.command == "move":
            cmd_move(args.root, args.source, args.destination, out)
        else:
            cmd_delete(args.root, args.path, out)
    except Refused as exc:
        fail(out, exc.code, exc.message)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            fail(out, "no_space", "the workspace file system is full")
        fail(out, "io_error", f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, exc.errno)})")


if __name__ == "__main__":
    main()
