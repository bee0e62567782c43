"""Workspace file operations, run by the gateway with ``docker exec`` as the
kernel's user::

    python -I -m kernelgw_kernel.fs put    PATH --max-bytes N --quota N
    python -I -m kernelgw_kernel.fs get    PATH [--exit-on-eof] [--idle-timeout S]
    python -I -m kernelgw_kernel.fs list   PATH [--recursive] [--max-entries N]
    python -I -m kernelgw_kernel.fs delete PATH

(``-I``: the working directory and PYTHON* variables cannot substitute this
module.) Every path is relative to the workspace and walked one component at a
time from a descriptor of the workspace with ``O_NOFOLLOW``: a symbolic link
anywhere in the path is refused when it is met, even one user code made a
moment ago, so nothing outside the workspace is ever opened (no check-then-use
race). ``delete`` removes a symlink named as the last component itself; it
never follows one.

Answers are JSON lines on stdout: ``{"ok": true, ...}`` or
``{"ok": false, "error": CODE, "message": ...}`` with CODE one of
``invalid_path``, ``not_found``, ``symlink``, ``is_directory``,
``not_directory``, ``not_regular``, ``quota``, ``no_space``, ``io_error``,
``aborted``. ``get`` sends one header line, then exactly ``size`` bytes.

``put`` protocol: the helper answers a first line with how many bytes the
upload may have (``limit``) and the numbers it came from, then reads frames
from stdin: a 4-byte big-endian length and that many bytes; a zero-length frame
commits. The data goes to a temporary file at the workspace root, and only on
commit are missing parent directories made and the file moved into place
(``rename``, atomic), so an upload that is refused, too large or cut off
leaves the workspace as it was.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import secrets
import signal
import stat
import sys
from typing import Any, BinaryIO, NoReturn

from kernelgw_kernel import UPLOAD_PREFIX, WORKSPACE

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
CHUNK = 1 << 20
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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


def _kind(dir_fd: int, name: str) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def walk(root_fd: int, parts: list[str], *, create: bool = False) -> tuple[int, bool]:
    """Descend from ``root_fd`` through the directories ``parts``, refusing
    symbolic links and non-directories on the way. Returns a descriptor of the
    deepest directory reached and whether that is all of ``parts``: a missing
    directory ends the walk early, or is made when ``create``."""
    fd = os.dup(root_fd)
    try:
        for i, name in enumerate(parts):
            shown = "/".join(parts[: i + 1])
            try:
                nfd = os.open(name, O_DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return fd, False
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                nfd = os.open(name, O_DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                mode = _kind(fd, name)
                if mode is not None and stat.S_ISLNK(mode):
                    raise Refused(
                        "symlink", f"{shown!r} is a symbolic link; paths through links are refused"
                    ) from None
                raise Refused("not_directory", f"{shown!r} is not a directory") from None
            os.close(fd)
            fd = nfd
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
    return os.open(root, O_DIR)


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


def cmd_get(root: str, path: str, out: BinaryIO, idle_timeout: int = 0) -> None:
    parts = split_path(path)
    root_fd = open_root(root)
    parent = open_dir(root_fd, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            raise Refused("not_found", f"{path!r} does not exist in the workspace") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Refused("symlink", f"{path!r} is a symbolic link; download what it points to") from None
            raise
    finally:
        os.close(parent)
        os.close(root_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise Refused("is_directory", f"{path!r} is a directory; list it instead")
        raise Refused("not_regular", f"{path!r} is not a regular file")
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
    root_fd = open_root(root)
    entries: list[dict[str, Any]] = []
    truncated = False
    try:
        if parts:
            parent = open_dir(root_fd, parts[:-1])
            try:
                mode = _kind(parent, parts[-1])
                if mode is None:
                    raise Refused("not_found", f"{path!r} does not exist in the workspace")
                if stat.S_ISLNK(mode):
                    raise Refused("symlink", f"{path!r} is a symbolic link; paths through links are refused")
                if not stat.S_ISDIR(mode):
                    st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
                    say(out, {"ok": True, "path": "/".join(parts), "entries": [_entry("/".join(parts), st)],
                              "truncated": False})
                    return
            finally:
                os.close(parent)
        dir_fd = open_dir(root_fd, parts)
        prefix = "/".join(parts) + "/" if parts else ""
        stack = [(dir_fd, prefix)]
        try:
            while stack:
                fd, rel = stack.pop()
                try:
                    names = sorted(os.listdir(fd))
                    subdirs = []
                    for name in names:
                        if name.startswith(UPLOAD_PREFIX):
                            continue
                        try:
                            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        if len(entries) >= max_entries:
                            truncated = True
                            break
                        entries.append(_entry(rel + name, st))
                        if recursive and stat.S_ISDIR(st.st_mode):
                            try:
                                subdirs.append((os.open(name, O_DIR, dir_fd=fd), rel + name + "/"))
                            except OSError:
                                pass
                    stack.extend(reversed(subdirs))
                finally:
                    os.close(fd)
                if truncated:
                    break
        finally:
            for fd, _ in stack:
                os.close(fd)
    finally:
        os.close(root_fd)
    say(out, {"ok": True, "path": "/".join(parts), "entries": entries, "truncated": truncated})


def cmd_delete(root: str, path: str, out: BinaryIO) -> None:
    import shutil

    parts = split_path(path)
    root_fd = open_root(root)
    try:
        parent = open_dir(root_fd, parts[:-1])
    finally:
        os.close(root_fd)
    try:
        name = parts[-1]
        mode = _kind(parent, name)
        if mode is None:
            raise Refused("not_found", f"{path!r} does not exist in the workspace")
        if stat.S_ISDIR(mode):
            # fd-based and never follows links (shutil.rmtree.avoids_symlink_attacks)
            shutil.rmtree(name, dir_fd=parent)
            kind = "directory"
        else:
            os.unlink(name, dir_fd=parent)
            kind = "symlink" if stat.S_ISLNK(mode) else "file"
    finally:
        os.close(parent)
    say(out, {"ok": True, "path": path, "type": kind})


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


def _check_target(path: str, mode: int) -> None:
    """An upload replaces only a regular file."""
    if stat.S_ISLNK(mode):
        raise Refused("symlink", f"{path!r} is a symbolic link; delete it first")
    if stat.S_ISDIR(mode):
        raise Refused("is_directory", f"{path!r} is a directory")
    if not stat.S_ISREG(mode):
        raise Refused("not_regular", f"{path!r} is not a regular file")


def cmd_put(root: str, path: str, max_bytes: int, quota: int, inp: BinaryIO, out: BinaryIO) -> None:
    parts = split_path(path)
    root_fd = open_root(root)
    tmp_name: str | None = None
    try:
        # Refuse early what would be refused at the end (links, files in the way),
        # without making anything: missing directories are made on commit.
        existing = 0
        fd, complete = walk(root_fd, parts[:-1])
        try:
            mode = _kind(fd, parts[-1]) if complete else None
            if mode is not None:
                _check_target(path, mode)
                existing = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_size
        finally:
            os.close(fd)
        vfs = os.statvfs(root_fd)
        used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        free = vfs.f_bavail * vfs.f_frsize
        limit = max(0, min(max_bytes, quota - used + existing, free))
        tmp_name = UPLOAD_PREFIX + secrets.token_hex(8)
        tmp_fd = os.open(
            tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=root_fd
        )
        say(out, {"ok": True, "limit": limit, "max_bytes": max_bytes, "quota": quota, "used": used,
                  "free": free, "existing": existing})
        size = 0
        with os.fdopen(tmp_fd, "wb", buffering=0) as f:
            try:
                for data in read_frames(inp):
                    size += len(data)
                    if size > limit:
                        raise Refused("quota", f"the upload is larger than its limit of {limit} bytes")
                    view = memoryview(data)
                    while view:
                        view = view[f.write(view):]
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
            mode = _kind(parent, parts[-1])
            if mode is not None:
                _check_target(path, mode)
            os.replace(tmp_name, parts[-1], src_dir_fd=root_fd, dst_dir_fd=parent)
            tmp_name = None
            st = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(parent)
        say(out, {"ok": True, "created": mode is None, **_entry(path, st)})
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
    args = parser.parse_args(argv)
    # paths arrive as UTF-8 (the gateway validated them); keep any odd byte as is
    out = sys.stdout.buffer
    inp = sys.stdin.buffer
    try:
        if args.command == "put":
            cmd_put(args.root, args.path, args.max_bytes, args.quota, inp, out)
        elif args.command == "get":
            if args.exit_on_eof:
                exit_on_eof(inp)
            cmd_get(args.root, args.path, out, args.idle_timeout)
        elif args.command == "list":
            cmd_list(args.root, args.path, args.recursive, args.max_entries, out)
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
