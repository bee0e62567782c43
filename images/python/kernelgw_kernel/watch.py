"""Watch a workspace directory for changes, run by the gateway in the kernel's
container as the kernel's user (E2B's ``sandbox.files.watch_dir``)::

    python -I -m kernelgw_kernel.watch [--recursive] [--entries] [--poll] PATH

The directory is opened as every other workspace helper opens a path
(`kernelgw_kernel.fs.open_dir`: one component at a time from the workspace,
never through a symbolic link), and only that descriptor is watched: inotify
(glibc's ``inotify_init1`` and ``inotify_add_watch`` through ctypes) is given
``.`` after ``fchdir`` to it, so no path is looked up again. ``--recursive``
adds a watch per subdirectory (opened the same way, links never entered), and
one for each directory that appears later. Where inotify is missing (or with
``--poll``) the tree is listed every `POLL_S` seconds and compared.

Answers are JSON lines on stdout: first ``{"ok": true, "mode": ...}`` or
``{"ok": false, "error": CODE, "message": ...}`` (as `kernelgw_kernel.fs`
answers), then one line per change, ``{"type": T, "name": N}`` with T one of
``create``, ``write``, ``remove``, ``rename``, ``chmod`` (envd's, as its Go
library names inotify's events) and N relative to the watched directory;
``--entries`` adds ``entry``, the entry as `kernelgw_kernel.fs.describe` gives
it, to creates, writes and mode changes. A watch that cannot go on ends with an
``ok: false`` line: the directory itself was removed or moved (``gone``), the
kernel's event queue overflowed (``overflow``), or the tree has more than
``--max-dirs`` directories (``too_many``). The helper exits when its stdin ends
(the gateway went away) or its stdout breaks.

Files the gateway's uploads write land in a temporary file at the workspace root
and are renamed into place (`kernelgw_kernel.fs.cmd_put`): their temporary names
are never reported, and the rename is a ``create`` then a ``write`` of the file,
as envd reports a file it writes.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import select
import stat
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from kernelgw_kernel import UPLOAD_PREFIX, WORKSPACE
from kernelgw_kernel.fs import Refused, describe, lstat, open_at, open_dir, open_root, split_path

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
    | IN_EXCL_UNLINK
)
EVENT = struct.Struct("iIII")
"""``struct inotify_event`` without its name: wd, mask, cookie, len."""
READ_BYTES = 64 * 1024
MAX_DIRS = 1000
"""Directories one recursive watch takes at most (each costs a watch and a descriptor)."""
POLL_S = 1.0
MAX_POLL_ENTRIES = 10_000
"""Entries a polled watch compares at most each round."""
TYPES = (
    (IN_CREATE | IN_MOVED_TO, "create"),
    (IN_MOVED_FROM, "rename"),
    (IN_ATTRIB, "chmod"),
    (IN_MODIFY, "write"),
    (IN_DELETE, "remove"),
)
"""inotify's events as envd's (its Go library's order for an event with several)."""
WITH_ENTRY = ("create", "write", "chmod")
"""The events whose entry is described (the others name what is no longer there)."""


class Stop(Exception):
    """The watch ends: the gateway went away (stdin ended, stdout broke)."""


def say(out: BinaryIO, obj: dict[str, Any]) -> None:
    try:
        out.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
        out.flush()
    except (BrokenPipeError, ConnectionResetError):
        raise Stop from None


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel and name else rel or name


@dataclass
class Watch:
    """What the helper reports, where: the watched directory ``base`` (workspace
    path, reached from ``root_fd``) and how it words events."""

    base: str
    root_fd: int
    out: BinaryIO
    entries: bool

    def event(self, kind: str, name: str) -> None:
        """Say that ``name`` (under the watched directory) saw ``kind``; with
        ``entries``, what it is now (its directory opened from the workspace as
        any helper opens one: no descriptor of the tree is kept, which would
        hold a removed directory's inode and its removal's event back)."""
        line: dict[str, Any] = {"type": kind, "name": name}
        if self.entries and kind in WITH_ENTRY:
            entry = self.describe(name)
            if entry is not None:
                line["entry"] = entry
        say(self.out, line)

    def describe(self, name: str) -> dict[str, Any] | None:
        path = join(self.base, name)
        parent, _, last = path.rpartition("/")
        try:
            dir_fd = open_dir(self.root_fd, parent.split("/")) if parent else os.dup(self.root_fd)
        except (Refused, OSError):
            return None  # gone meanwhile, or swapped for a link
        try:
            st = lstat(dir_fd, last)
            return describe(path, st, dir_fd, last) if st is not None else None
        except OSError:
            return None
        finally:
            os.close(dir_fd)


# ------------------------------------------------------------------ inotify


class Unavailable(Exception):
    """inotify is missing here: the watch polls instead."""


class Inotify:
    """glibc's inotify calls through ctypes."""

    def __init__(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self._init = libc.inotify_init1
            self._add = libc.inotify_add_watch
            self._rm = libc.inotify_rm_watch
        except (OSError, AttributeError) as exc:
            raise Unavailable(str(exc)) from None
        self._init.argtypes, self._init.restype = [ctypes.c_int], ctypes.c_int
        self._add.argtypes, self._add.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
        self._rm.argtypes, self._rm.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        fd = self._init(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise Unavailable(os.strerror(ctypes.get_errno()))
        self.fd: int = fd

    def add(self, dir_fd: int) -> int:
        """Watch the directory ``dir_fd`` (the descriptor's own: ``.`` after ``fchdir``)."""
        os.fchdir(dir_fd)
        try:
            wd: int = self._add(self.fd, b".", MASK)
        finally:
            os.chdir("/")  # a working directory would hold the directory's inode, as a descriptor does
        if wd < 0:
            code = ctypes.get_errno()
            if code == errno.ENOSPC:
                raise Refused("too_many", "the kernel's limit of inotify watches is reached; watch a smaller tree")
            raise OSError(code, os.strerror(code))
        return wd

    def remove(self, wd: int) -> None:
        self._rm(self.fd, wd)

    def events(self) -> Iterator[tuple[int, int, int, str]]:
        """The events queued now: (wd, mask, cookie, name)."""
        try:
            data = os.read(self.fd, READ_BYTES)
        except BlockingIOError:
            return
        offset = 0
        while offset + EVENT.size <= len(data):
            wd, mask, cookie, size = EVENT.unpack_from(data, offset)
            raw = data[offset + EVENT.size : offset + EVENT.size + size].split(b"\0", 1)[0]
            offset += EVENT.size + size
            yield wd, mask, cookie, os.fsdecode(raw)


@dataclass
class Tree:
    """The inotify watches of one watch: the directory, and with ``recursive``
    every directory under it, each by its path under the watched one."""

    watch: Watch
    inotify: Inotify
    recursive: bool
    max_dirs: int
    at_root: bool
    """The watched directory is the workspace itself, where uploads' temporary files are."""
    dirs: dict[int, str] = field(default_factory=dict)
    top: int = -1
    hidden: int = -1
    """The workspace root's watch when it is not the watched directory: it only
    tells uploads' renames (their temporary file is at the root) from others."""
    uploads: set[int] = field(default_factory=set)
    """Cookies of renames of uploads' temporary files."""
    moved: dict[int, str] = field(default_factory=dict)
    """Cookies of directories renamed away, to their old path, until the other half comes."""

    def add(self, fd: int, rel: str, *, report: bool = False) -> None:
        """Watch the directory ``fd`` (``rel`` under the watched one; closed here)
        and, recursively, what is in it; ``report``: say ``create`` for each
        entry found (made before its directory was watched)."""
        stack = [(fd, rel)]
        try:
            while stack:
                fd, rel = stack.pop()
                try:
                    if len(self.dirs) >= self.max_dirs:
                        raise Refused(
                            "too_many", f"the tree has more than {self.max_dirs} directories; watch a smaller one"
                        )
                    wd = self.inotify.add(fd)
                    self.dirs[wd] = rel  # the same directory again (moved meanwhile): its newest name
                    if self.top < 0:
                        self.top = wd
                    if self.recursive:
                        stack.extend(self.subdirs(fd, rel, report))
                finally:
                    os.close(fd)
        finally:
            for other, _ in stack:
                os.close(other)

    def subdirs(self, fd: int, rel: str, report: bool) -> list[tuple[int, str]]:
        found: list[tuple[int, str]] = []
        try:
            for name in sorted(os.listdir(fd)):
                if self.at_root and not rel and name.startswith(UPLOAD_PREFIX):
                    continue
                st = lstat(fd, name)
                if st is None:
                    continue
                if report:  # made before its directory was watched: made (and written), as a poll says it
                    self.watch.event("create", join(rel, name))
                    if stat.S_ISREG(st.st_mode) and st.st_size:
                        self.watch.event("write", join(rel, name))
                if stat.S_ISDIR(st.st_mode):
                    try:
                        opened = open_at(fd, name, join(rel, name), directory=True)
                    except (Refused, OSError):
                        opened = None  # swapped for a link meanwhile, or unreadable: not entered
                    if opened is not None:
                        found.append((opened[0], join(rel, name)))
        except BaseException:
            for other, _ in found:
                os.close(other)
            raise
        return found

    def drop_under(self, rel: str) -> None:
        """Stop watching ``rel`` and what is under it (moved out of the tree)."""
        for wd, path in list(self.dirs.items()):
            if path == rel or path.startswith(rel + "/"):
                self.inotify.remove(wd)
                self.dirs.pop(wd, None)

    def rename_under(self, old: str, new: str) -> None:
        for wd, path in self.dirs.items():
            if path == old or path.startswith(old + "/"):
                self.dirs[wd] = new + path[len(old) :]

    def handle(self, wd: int, mask: int, cookie: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            raise Refused("overflow", "more changes came at once than the kernel queues for a watch; events were lost")
        if mask & IN_IGNORED:
            self.dirs.pop(wd, None)
            return
        if wd == self.hidden:
            if mask & IN_MOVED_FROM and name.startswith(UPLOAD_PREFIX):
                self.uploads.add(cookie)
            return
        rel = self.dirs.get(wd)
        if rel is None:
            return
        if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
            if wd == self.top:
                raise Refused("gone", "the watched directory was removed or moved away")
            return  # its parent's watch says so
        if self.at_root and wd == self.top and name.startswith(UPLOAD_PREFIX):
            if mask & IN_MOVED_FROM:
                self.uploads.add(cookie)
            return
        path = join(rel, name)
        for bit, kind in TYPES:
            if mask & bit:
                self.watch.event(kind, path)
        if mask & IN_MOVED_TO and cookie in self.uploads:
            self.uploads.discard(cookie)
            self.watch.event("write", path)
        if not (self.recursive and mask & IN_ISDIR):
            return
        if mask & IN_MOVED_FROM:
            self.moved[cookie] = path
        elif mask & (IN_CREATE | IN_MOVED_TO):
            old = self.moved.pop(cookie, None) if mask & IN_MOVED_TO else None
            if old is not None:
                self.rename_under(old, path)
                return
            base = self.watch.base
            try:
                parent = open_dir(self.watch.root_fd, join(base, rel).split("/")) if join(base, rel) else None
                dir_fd = parent if parent is not None else os.dup(self.watch.root_fd)
                try:
                    opened = open_at(dir_fd, name, path, directory=True)
                finally:
                    os.close(dir_fd)
            except (Refused, OSError):
                return  # gone again, or swapped for a link: not entered
            if opened is not None:
                self.add(opened[0], path, report=bool(mask & IN_CREATE))

    def settle(self) -> None:
        """After a batch: directories renamed away whose other half did not come
        left the tree."""
        for old in self.moved.values():
            self.drop_under(old)
        self.moved.clear()
        self.uploads.clear()


def run_inotify(watch: Watch, inotify: Inotify, dir_fd: int, recursive: bool, max_dirs: int) -> None:
    tree = Tree(watch, inotify, recursive, max_dirs, at_root=not watch.base)
    tree.add(dir_fd, "")  # closes it
    if not tree.at_root:
        tree.hidden = inotify.add(watch.root_fd)
    say(watch.out, {"ok": True, "mode": "inotify", "dirs": len(tree.dirs)})
    poller = select.poll()
    poller.register(inotify.fd, select.POLLIN)
    poller.register(sys.stdin.fileno(), select.POLLIN | select.POLLHUP)
    while True:
        for fd, _ in poller.poll():
            if fd != inotify.fd:
                gateway_gone()
                continue
            for event in list(inotify.events()):
                tree.handle(*event)
            tree.settle()


def gateway_gone() -> None:
    """Stdin ended (or said something): the gateway no longer reads."""
    if not os.read(sys.stdin.fileno(), 4096):
        raise Stop


# ------------------------------------------------------------------ polling


def snapshot(dir_fd: int, recursive: bool, at_root: bool) -> dict[str, os.stat_result]:
    """The entries under ``dir_fd`` (not closed), by path; subdirectories only
    with ``recursive``, entered as `kernelgw_kernel.fs` enters them."""
    found: dict[str, os.stat_result] = {}
    stack = [(os.dup(dir_fd), "")]
    try:
        while stack:
            fd, rel = stack.pop()
            try:
                for name in os.listdir(fd):
                    if at_root and not rel and name.startswith(UPLOAD_PREFIX):
                        continue
                    st = lstat(fd, name)
                    if st is None:
                        continue
                    if len(found) >= MAX_POLL_ENTRIES:
                        raise Refused(
                            "too_many", f"the tree has more than {MAX_POLL_ENTRIES} entries; watch a smaller one"
                        )
                    found[join(rel, name)] = st
                    if recursive and stat.S_ISDIR(st.st_mode):
                        try:
                            opened = open_at(fd, name, join(rel, name), directory=True)
                        except (Refused, OSError):
                            opened = None
                        if opened is not None:
                            stack.append((opened[0], join(rel, name)))
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)
    return found


def changes(before: dict[str, os.stat_result], after: dict[str, os.stat_result]) -> Iterator[tuple[str, str]]:
    """What tells ``after`` from ``before``, as envd's events (a rename is a remove and a create)."""
    for path in sorted(before.keys() - after.keys()):
        yield "remove", path
    for path, st in sorted(after.items()):
        old = before.get(path)
        if old is None or (old.st_ino, stat.S_IFMT(old.st_mode)) != (st.st_ino, stat.S_IFMT(st.st_mode)):
            if old is not None:
                yield "remove", path
            yield "create", path
            if stat.S_ISREG(st.st_mode) and st.st_size:
                yield "write", path
            continue
        if (old.st_size, old.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            yield "write", path
        if stat.S_IMODE(old.st_mode) != stat.S_IMODE(st.st_mode):
            yield "chmod", path


def run_polling(watch: Watch, dir_fd: int, recursive: bool) -> None:
    before = snapshot(dir_fd, recursive, not watch.base)
    say(watch.out, {"ok": True, "mode": "poll"})
    poller = select.poll()
    poller.register(sys.stdin.fileno(), select.POLLIN | select.POLLHUP)
    while True:
        if poller.poll(int(POLL_S * 1000)):
            gateway_gone()
        if os.fstat(dir_fd).st_nlink == 0:
            raise Refused("gone", "the watched directory was removed")
        after = snapshot(dir_fd, recursive, not watch.base)
        for kind, path in changes(before, after):
            watch.event(kind, path)
        before = after


# ------------------------------------------------------------------ main


WATCH_HINTS = {
    "symlink": "a link is not followed; watch the directory it points to",
    "not_directory": "watch a directory",
}


def open_watched(root_fd: int, path: str) -> int:
    parts = split_path(path, allow_root=True)
    if not parts:
        return os.dup(root_fd)
    parent = open_dir(root_fd, parts[:-1])
    try:
        opened = open_at(parent, parts[-1], "/".join(parts), directory=True, hints=WATCH_HINTS)
    finally:
        os.close(parent)
    if opened is None:
        raise Refused("not_found", f"{path!r} does not exist in the workspace")
    return opened[0]


def watch_dir(root: str, path: str, *, recursive: bool, entries: bool, poll: bool, max_dirs: int) -> None:
    root_fd = open_root(root)
    try:
        dir_fd = open_watched(root_fd, path)
        watch = Watch("/".join(split_path(path, allow_root=True)), root_fd, sys.stdout.buffer, entries)
        inotify: Inotify | None = None
        if not poll:
            try:
                inotify = Inotify()
            except Unavailable:
                inotify = None
        if inotify is None:
            try:
                run_polling(watch, dir_fd, recursive)
            finally:
                os.close(dir_fd)
        else:
            run_inotify(watch, inotify, dir_fd, recursive, max_dirs)  # takes dir_fd
    finally:
        os.close(root_fd)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="kernelgw_kernel.watch")
    parser.add_argument("--root", default=WORKSPACE)
    parser.add_argument("--recursive", action="store_true")
    parser.add_argument("--entries", action="store_true", help="describe the entry of creates, writes, chmods")
    parser.add_argument("--poll", action="store_true", help="poll even where inotify works")
    parser.add_argument("--max-dirs", type=int, default=MAX_DIRS)
    parser.add_argument("path")
    args = parser.parse_args(argv)
    out = sys.stdout.buffer
    try:
        watch_dir(
            args.root, args.path, recursive=args.recursive, entries=args.entries, poll=args.poll, max_dirs=args.max_dirs
        )
    except Stop:
        sys.exit(0)
    except Refused as exc:
        fail(out, exc.code, exc.message)
    except OSError as exc:
        fail(out, "io_error", f"{exc.strerror or exc} ({errno.errorcode.get(exc.errno or 0, exc.errno)})")


def fail(out: BinaryIO, code: str, message: str) -> None:
    try:
        say(out, {"ok": False, "error": code, "message": message})
    except Stop:
        pass
    sys.exit(1)


if __name__ == "__main__":
    main()
