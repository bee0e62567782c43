"""Workspace files: path rules, and moving bytes in and out (the wire models are in
``kernelgw.models``).

Each session's working directory is ``/workspace``, a size-limited tmpfs in its
container. The gateway never reaches into it directly: it runs the image's
``kernelgw_kernel.fs`` helper with the backend's ``exec`` (as the kernel's user,
no network) and streams bytes through the engine's API. The helper walks every
path from a descriptor of the workspace one component at a time with
``O_NOFOLLOW``, so a symbolic link anywhere in a path is refused when it is met,
including links user code made a moment before. Paths are checked here first as
well, before anything reaches the container.

Uploads are framed on the helper's stdin (4-byte length + data; a zero-length
frame commits) and land in a temporary file that is renamed into place only on
commit: an upload that is refused, too large or cut off leaves the workspace as
it was. Neither direction ever holds more than about 1 MiB of a file in the
gateway's memory.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import mimetypes
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio

from kernelgw.errors import (
    BackendError,
    BadRequest,
    FileNotFoundInWorkspace,
    InvalidPath,
    KernelGWError,
    QuotaExceeded,
    WorkspaceCopyFailed,
    WorkspaceUnreadable,
)
from kernelgw.models import FileEntry, FileList, UploadResult
from kernelgw.paths import validate_path
from kernelgw.runtime.backends.base import (
    HELPER_LOADER_RESET,
    PACKAGES_DIR,
    SESSION_DIRS,
    WORKSPACE_DIR,
    Backend,
    CommandProcess,
    ExecProcess,
    KernelHandle,
    KernelSpec,
    helper_command,
)

log = logging.getLogger(__name__)

LIST_ATTEMPTS = 2
"""A listing changes nothing: one whose answer was lost (`HelperOutputLost`) is asked again once."""

PYTHON = "/opt/kernel/bin/python"
TAR = "/usr/bin/tar"
DU = "/usr/bin/du"
FS_HELPER = [PYTHON, "-I", "-m", "kernelgw_kernel.fs"]
"""``-I``: neither the working directory nor PYTHON* variables can substitute it."""
WATCH_HELPER = [PYTHON, "-I", "-m", "kernelgw_kernel.watch"]
SEND_CHUNK = 1 << 20
"""Upload bytes are batched to this size per write into the container."""
MAX_LIST_ENTRIES = 10_000
MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""Largest JSON answer read from a helper (a listing of 10,000 entries fits)."""

# Python's built-in table (never the host's /etc/mime.types, so every host
# agrees), after these. images/python/kernelgw_kernel/__init__.py has the same
# table for the artifacts it reports; tests/unit/test_workspace.py keeps them equal.
EXTRA_MIME_TYPES = {
    ".csv": "text/csv",
    ".db": "application/vnd.sqlite3",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".feather": "application/vnd.apache.arrow.file",
    ".geojson": "application/geo+json",
    ".ipynb": "application/x-ipynb+json",
    ".js": "text/javascript",
    ".jsonl": "application/jsonl",
    ".log": "text/plain",
    ".md": "text/markdown",
    ".ndjson": "application/x-ndjson",
    ".parquet": "application/vnd.apache.parquet",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".sqlite": "application/vnd.sqlite3",
    ".toml": "application/toml",
    ".tsv": "text/tab-separated-values",
    ".wav": "audio/wav",
    ".webp": "image/webp",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
}
ENCODING_MIME_TYPES = {
    "gzip": "application/gzip",
    "bzip2": "application/x-bzip2",
    "xz": "application/x-xz",
    "compress": "application/x-compress",
    "br": "application/x-brotli",
}
_MIMETYPES = mimetypes.MimeTypes()


def guess_mime(path: str) -> str:
    """The MIME type of a workspace file, from its name."""
    name = path.rsplit("/", 1)[-1].lower()
    dot = name.rfind(".")
    if dot > 0 and name[dot:] in EXTRA_MIME_TYPES:
        return EXTRA_MIME_TYPES[name[dot:]]
    mime, encoding = _MIMETYPES.guess_type(name, strict=False)
    if encoding:
        return ENCODING_MIME_TYPES.get(encoding, "application/octet-stream")
    return mime or "application/octet-stream"


def _entry(data: dict[str, Any], cls: type[FileEntry] = FileEntry, **extra: Any) -> Any:
    path = str(data["path"])
    kind = data["type"]
    return cls(
        path=path,
        type=kind,
        size=int(data["size"]),
        mtime=datetime.fromtimestamp(int(data["mtime_ns"]) / 1e9, UTC),
        mime_type=guess_mime(path) if kind == "file" else None,
        **extra,
    )


@dataclass(frozen=True)
class EntryDetails:
    """A workspace entry as E2B's filesystem calls describe one (`WorkspaceFiles.stat`,
    ``list_dir``, ``make_dir``, ``move``): besides `FileEntry`'s fields, the whole
    ``st_mode``, owner and group as the container names them (or their numbers),
    whether those are the kernel's user's, and a link's target (what ``readlink``
    says; never followed)."""

    path: str
    """Relative to the workspace; ``""`` is the workspace itself."""
    type: str
    """``file``, ``directory``, ``symlink`` or ``other``."""
    size: int
    mtime: datetime
    st_mode: int
    owner: str
    group: str
    symlink_target: str | None = None
    metadata: dict[str, str] | None = None
    """E2B's metadata kept on the file (its ``user.e2b.*`` extended attributes)."""
    own_user: bool = False
    """The owner is the kernel's user (whose uid may be a session's own, unnamed in the container)."""
    own_group: bool = False


def entry_details(data: dict[str, Any]) -> EntryDetails:
    target = data.get("symlink_target")
    metadata = data.get("metadata")
    return EntryDetails(
        path=str(data["path"]),
        type=str(data["type"]),
        size=int(data["size"]),
        mtime=datetime.fromtimestamp(int(data["mtime_ns"]) / 1e9, UTC),
        st_mode=int(data["st_mode"]),
        owner=str(data["owner"]),
        group=str(data["group"]),
        symlink_target=str(target) if target is not None else None,
        metadata={str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) and metadata else None,
        own_user=bool(data.get("own_user")),
        own_group=bool(data.get("own_group")),
    )


# ------------------------------------------------------------------ helper I/O


class HelperOutputLost(BackendError):
    """A helper exited 0 and none of its output reached the gateway: it always
    answers, so the engine's stream lost it (seen once under gVisor, for a
    ``list``). A helper that only reads may be run again."""


class HelperAnswer:
    """Reads a helper's stdout: JSON lines, then (for ``get``) raw bytes."""

    def __init__(self, proc: ExecProcess) -> None:
        self.proc = proc
        self.buffer = b""

    async def line(self, limit: int = MAX_ANSWER_BYTES) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            if len(self.buffer) > limit:
                raise BackendError("A helper in the kernel container answered with an oversized line.")
            data = await self.proc.read()
            if not data:
                raise await self._no_answer()
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:
            raise BackendError(f"A helper in the kernel container answered {line[:200]!r}.") from None
        if not isinstance(answer, dict):
            raise BackendError(f"A helper in the kernel container answered {line[:200]!r}.")
        return answer

    async def _no_answer(self) -> KernelGWError:
        stderr = self.proc.stderr.decode("utf-8", "replace").strip()
        if "No module named" in stderr and "kernelgw_kernel" in stderr:
            return BackendError(
                "The kernel image lacks the kernelgw_kernel helper that file transfers and package "
                "installs need; rebuild it with `kernelgw image build`."
            )
        code = await self.proc.exit_code()
        lines = stderr.splitlines()
        # a crashed interpreter's cause is its first "Fatal Python error" line, not its last line
        detail = next(
            (line for line in lines if line.startswith("Fatal Python error")), lines[-1] if lines else "no output"
        )
        if code in (137, -9):
            detail = "killed (out of memory?)"
        message = f"A helper in the kernel container ended without an answer (exit {code}: {detail})."
        if code == 0 and not lines and not self.buffer:
            return HelperOutputLost(message)
        return BackendError(message)


def raise_for_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer if ``ok``, else the matching gateway error."""
    if answer.get("ok") is True:
        return answer
    code = str(answer.get("error", ""))
    message = str(answer.get("message", "")) or code
    message = message[:1].upper() + message[1:]
    if not message.endswith("."):
        message += "."
    if code in ("invalid_path", "symlink", "is_directory", "not_directory", "not_regular", "too_many"):
        raise InvalidPath(message)
    if code == "not_found":
        raise FileNotFoundInWorkspace(message)
    if code in ("quota", "no_space"):
        raise QuotaExceeded(message)
    if code in ("aborted", "no_metadata", "metadata_too_large"):
        raise BadRequest(message)
    if code == "io_error" and ("(EACCES)" in message or "(EPERM)" in message):
        # user code changed the file's permissions (chmod 000): not a gateway fault
        raise BadRequest(f"{message} The session's own code made this path inaccessible.")
    raise KernelGWError(f"The workspace operation failed: {message}")


def _mib(n: int) -> str:
    return f"{n} bytes ({n / 1048576:.1f} MiB)" if n >= 1048576 else f"{n} bytes"


def quota_message(info: dict[str, Any], size: int | None) -> str:
    """Why an upload of ``size`` bytes (None: unknown) does not fit, in words."""
    max_bytes, quota = int(info["max_bytes"]), int(info["quota"])
    used, free, existing = int(info["used"]), int(info["free"]), int(info["existing"])
    room = quota - used + existing
    what = f"The upload ({_mib(size)})" if size is not None else "The upload"
    if max_bytes <= min(room, free):
        return f"{what} is larger than the gateway's per-file limit of {_mib(max_bytes)}."
    if room <= free:
        return (
            f"{what} would exceed the workspace quota of {_mib(quota)}: {_mib(used)} are in use, so at "
            f"most {_mib(max(room, 0))} fit. Delete files from the workspace to make room."
        )
    return f"{what} does not fit: the workspace file system has only {_mib(free)} free."


class Download:
    """A file on its way out of a workspace: its entry, and ``chunks``, exactly
    ``entry.size`` bytes as they come out of the container."""

    def __init__(self, entry: FileEntry, proc: ExecProcess, head: bytes) -> None:
        self.entry = entry
        self._proc = proc
        self._head = head
        self._complete = False
        self.chunks: AsyncIterator[bytes] = self._stream()

    async def _stream(self) -> AsyncIterator[bytes]:
        left = self.entry.size
        data = self._head
        while left > 0:
            if not data:
                data = await self._proc.read()
                if not data:
                    raise BackendError(
                        f"{self.entry.path!r} ended {left} bytes early; it was truncated while being downloaded."
                    )
            piece, data = data[:left], b""
            left -= len(piece)
            yield piece
        self._complete = True
        await self._proc.close()

    async def aclose(self) -> None:
        """End the transfer; idempotent. Whoever stops iterating early must call
        it (a suspended generator is only finalised by GC)."""
        if not self._complete:
            self._complete = True
            await wind_down(self._proc)
        await self._proc.close()


async def wind_down(proc: ExecProcess, grace: float = 2.0) -> None:
    """End a helper that is still running: end its stdin (no commit frame, or the
    EOF ``get --exit-on-eof`` waits for), then read what it still says until it
    exits. Dropping the connection at once races the engine, which then
    sometimes leaves the helper blocked on a full pipe."""
    try:
        await proc.close_stdin()

        async def drain() -> None:
            while await proc.read():
                pass

        async with asyncio.timeout(grace):
            await drain()
    except (KernelGWError, TimeoutError):
        log.warning("a helper in a kernel container did not end within %gs of being stopped", grace)


class WorkspaceFiles:
    """Upload, download, list and delete files in sessions' workspaces."""

    def __init__(self, backend: Backend, *, max_upload_bytes: int, timeout: float) -> None:
        self.backend = backend
        self.max_upload_bytes = max_upload_bytes
        self.timeout = timeout

    def check_length(self, content_length: int | None) -> None:
        """Refuse a declared size over the per-file limit before anything is read."""
        if content_length is not None and content_length > self.max_upload_bytes:
            raise QuotaExceeded(
                f"The upload ({_mib(content_length)}) is larger than the gateway's per-file "
                f"limit of {_mib(self.max_upload_bytes)}."
            )

    async def _exec(self, handle: KernelHandle, args: list[str], stdin: bool = False) -> ExecProcess:
        return await self.backend.exec(handle, [*FS_HELPER, *args], stdin=stdin, timeout=self.timeout)

    async def upload(
        self,
        handle: KernelHandle,
        path: str,
        body: AsyncIterable[bytes],
        *,
        quota_bytes: int,
        content_length: int | None = None,
        metadata: dict[str, str] | None = None,
    ) -> UploadResult:
        """Stream ``body`` into ``path``; a declared ``content_length`` over the
        per-file limit is refused before anything starts. ``metadata``: E2B's,
        kept on the file (as ``user.e2b.*`` extended attributes) from the moment
        it appears."""
        rel = validate_path(path)
        self.check_length(content_length)
        args = ["put", "--max-bytes", str(self.max_upload_bytes), "--quota", str(quota_bytes)]
        if metadata:
            args += ["--metadata", json.dumps(metadata)]
        args += ["--", rel]
        proc = await self._exec(handle, args, stdin=True)
        committed = False
        try:
            answer = HelperAnswer(proc)
            info = raise_for_answer(await answer.line())
            limit = int(info["limit"])
            if content_length is not None and content_length > limit:
                raise QuotaExceeded(quota_message(info, content_length))
            total = 0
            batch = bytearray()
            async for chunk in body:
                total += len(chunk)
                if total > limit:
                    raise QuotaExceeded(quota_message(info, content_length))
                batch += chunk
                if len(batch) >= SEND_CHUNK:
                    await proc.write(len(batch).to_bytes(4, "big") + batch)
                    batch = bytearray()
            if batch:
                await proc.write(len(batch).to_bytes(4, "big") + batch)
            await proc.write(b"\0\0\0\0")
            committed = True
            done = raise_for_answer(await answer.line())
            return _entry(done, UploadResult, created=bool(done.get("created")))  # type: ignore[no-any-return]
        finally:
            if not committed:
                # no commit frame: the helper discards the upload and exits
                with anyio.CancelScope(shield=True):
                    await wind_down(proc)
            await proc.close()

    async def download(self, handle: KernelHandle, path: str) -> Download:
        """The file's entry, and its bytes as they come out of the container."""
        rel = validate_path(path)
        # stdin stays open and unused: when the connection is dropped (the client
        # went away) the engine closes it and the helper exits at once
        args = ["get", "--exit-on-eof", "--idle-timeout", str(max(1, int(self.timeout))), "--", rel]
        proc = await self._exec(handle, args, stdin=True)
        try:
            answer = HelperAnswer(proc)
            entry: FileEntry = _entry(raise_for_answer(await answer.line(limit=64 * 1024)))
        except BaseException:
            await proc.close()
            raise
        return Download(entry, proc, answer.buffer)

    async def list(self, handle: KernelHandle, path: str = "", *, recursive: bool = False) -> FileList:
        rel = validate_path(path, allow_root=True)
        args = ["list", "--max-entries", str(MAX_LIST_ENTRIES)]
        if recursive:
            args.append("--recursive")
        for attempt in range(LIST_ATTEMPTS):
            proc = await self._exec(handle, [*args, "--", rel])
            try:
                data = raise_for_answer(await HelperAnswer(proc).line())
                break
            except HelperOutputLost:
                if attempt + 1 == LIST_ATTEMPTS:
                    raise
                log.warning("workspace: a file listing's answer was lost on its way out of the container; asking again")
            finally:
                await proc.close()
        return FileList(
            path=str(data.get("path", rel)),
            entries=[_entry(e) for e in data.get("entries", [])],
            truncated=bool(data.get("truncated")),
        )

    async def delete(self, handle: KernelHandle, path: str) -> str:
        """Remove a file, a directory (with its contents) or a symbolic link
        (not what it points to); returns which it was."""
        rel = validate_path(path)
        proc = await self._exec(handle, ["delete", "--", rel])
        try:
            data = raise_for_answer(await HelperAnswer(proc).line())
        finally:
            await proc.close()
        return str(data.get("type", "file"))

    # E2B's filesystem calls (kernelgw.server.e2b): the same helper, the same path rules

    async def _ask(self, handle: KernelHandle, args: builtins.list[str], *, reads_only: bool) -> dict[str, Any]:
        """The one answer of a helper command; one that only reads is asked again
        once when its answer was lost (`HelperOutputLost`)."""
        attempts = LIST_ATTEMPTS if reads_only else 1
        for attempt in range(attempts):
            proc = await self._exec(handle, args)
            try:
                return raise_for_answer(await HelperAnswer(proc).line())
            except HelperOutputLost:
                if attempt + 1 == attempts:
                    raise
                log.warning("workspace: a helper's answer was lost on its way out of the container; asking again")
            finally:
                await proc.close()
        raise AssertionError("unreachable")  # pragma: no cover

    async def stat(self, handle: KernelHandle, path: str) -> EntryDetails:
        """The entry ``path`` itself (``""``: the workspace); a link is described, not followed."""
        rel = validate_path(path, allow_root=True)
        return entry_details(await self._ask(handle, ["stat", "--", rel], reads_only=True))

    async def list_dir(
        self, handle: KernelHandle, path: str, depth: int = 1
    ) -> tuple[builtins.list[EntryDetails], bool]:
        """The entries of the directory ``path``, ``depth`` levels deep (links listed,
        never entered), and whether `MAX_LIST_ENTRIES` cut the list short."""
        rel = validate_path(path, allow_root=True)
        args = ["listdir", "--depth", str(max(1, depth)), "--max-entries", str(MAX_LIST_ENTRIES), "--", rel]
        data = await self._ask(handle, args, reads_only=True)
        return [entry_details(e) for e in data.get("entries", [])], bool(data.get("truncated"))

    async def make_dir(self, handle: KernelHandle, path: str) -> tuple[bool, EntryDetails]:
        """Make the directory and its missing parents; False when it existed already."""
        rel = validate_path(path)
        data = await self._ask(handle, ["mkdir", "--", rel], reads_only=False)
        return bool(data.get("created")), entry_details(data)

    async def move(self, handle: KernelHandle, source: str, destination: str) -> EntryDetails:
        """Rename ``source`` to ``destination`` (its missing parents are made; a file
        there is replaced); a link is moved itself. Returns the moved entry."""
        src, dst = validate_path(source), validate_path(destination)
        return entry_details(await self._ask(handle, ["move", "--", src, dst], reads_only=False))


class DirWatch:
    """A directory watch: the image's ``kernelgw_kernel.watch`` helper running in
    the kernel's container, its answers as they come (`line`), until `close`.

    It runs as long as the watch does, so it is started as a command is
    (`Backend.run_command`, whose reads hold no thread of the backend's pool
    while they wait), but as a helper: `helper_command` (absolute path, ``env -i``),
    loader variables reset on the exec. Its stdin stays open: when it closes
    (`close`, or the gateway going away) the helper exits."""

    def __init__(self, process: CommandProcess) -> None:
        self.process = process
        self._buffer = bytearray()
        self._stderr = bytearray()

    @property
    def stderr(self) -> str:
        """The last of what the helper wrote to stderr (a Python traceback, say)."""
        return self._stderr.decode("utf-8", "replace").strip()

    async def line(self) -> dict[str, Any] | None:
        """The helper's next answer, or None once it has ended."""
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > MAX_ANSWER_BYTES:
                raise BackendError("The watch helper in the kernel container answered with an oversized line.")
            item = await self.process.read()
            if item is None:
                return None
            stream, data = item
            if stream == 1:
                self._buffer += data
            else:
                self._stderr = (self._stderr + data)[-4096:]
        raw = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        try:
            answer = json.loads(raw)
        except ValueError:
            raise BackendError(f"The watch helper in the kernel container answered {raw[:200]!r}.") from None
        if not isinstance(answer, dict):
            raise BackendError(f"The watch helper in the kernel container answered {raw[:200]!r}.")
        return answer

    async def close(self) -> None:
        await self.process.close()


async def watch_dir(
    backend: Backend, handle: KernelHandle, path: str, *, recursive: bool, entries: bool, timeout: float
) -> tuple[DirWatch, str]:
    """Start watching the workspace directory ``path`` (``""``: the workspace)
    under the path rules of every workspace helper; returns the watch and how it
    watches (``inotify``, or ``poll`` where inotify is missing). A missing
    directory is `FileNotFoundInWorkspace`, anything else (a file, a link) an
    `InvalidPath`."""
    rel = validate_path(path, allow_root=True)
    args = [*WATCH_HELPER, *(["--recursive"] if recursive else []), *(["--entries"] if entries else []), "--", rel]
    process = await backend.run_command(
        handle, helper_command(args), env=dict(HELPER_LOADER_RESET), cwd="/", stdin=True
    )
    watch = DirWatch(process)
    try:
        async with asyncio.timeout(timeout):
            answer = await watch.line()
        if answer is None:
            raise BackendError(
                f"The watch helper in the kernel container ended without an answer: {watch.stderr or 'no output'}"
            )
        raise_for_answer(answer)
    except TimeoutError:
        await watch.close()
        raise BackendError(f"The watch helper in the kernel container did not answer within {timeout:g}s.") from None
    except BaseException:
        with anyio.CancelScope(shield=True):
            await watch.close()
        raise
    return watch, str(answer.get("mode", ""))


async def copy_session_files(
    backend: Backend, source: KernelHandle, target: KernelHandle, timeout: float, caps: dict[str, int] | None = None
) -> int:
    """Copy a session's workspace and installed packages into another session's
    kernel (a fork); returns the bytes moved. ``caps``: the most each directory's
    tar stream may take (the target's tmpfs sizes), past which it is a 413.

    GNU tar runs in each container as that kernel's user (``tar c`` in the
    source, ``tar x`` in the target) and the stream passes through the gateway
    about 1 MiB at a time: neither side gets more rights than its own kernel
    has, and a hostile stream can only write what the target's code could."""
    moved = 0
    for path in SESSION_DIRS:
        cap = (caps or {}).get(path)
        async with contextlib.aclosing(read_tree(backend, source, path, timeout, max_bytes=cap)) as stream:
            moved += await write_tree(backend, target, path, stream, timeout)
    return moved


def tree_caps(spec: KernelSpec) -> dict[str, int]:
    """The most a copy of each of a session's directories may take: its tmpfs
    size, plus a sixteenth for tar's 512-byte headers and padding (tmpfs rounds
    a file up to 4 KiB, so most trees make a smaller stream than they use)."""
    sizes = {WORKSPACE_DIR: spec.workspace_size_mb, PACKAGES_DIR: spec.packages_size_mb}
    return {path: mb * (1 << 20) * 17 // 16 for path, mb in sizes.items()}


class TreeTooLarge(QuotaExceeded):
    """A directory's tar stream passed the bytes it may take (``read_tree``'s
    ``max_bytes``): it does not fit where it is going."""

    code = "copy_too_large"


async def read_tree(
    backend: Backend,
    handle: KernelHandle,
    path: str,
    timeout: float,
    members: tuple[str, ...] = (".",),
    *,
    max_bytes: int | None = None,
) -> AsyncGenerator[bytes, None]:
    """A directory of a kernel's container (or ``members`` of it) as a tar stream,
    made by ``tar c`` as the kernel's user. ``--sparse``: a file's holes are not
    sent, so the stream holds what the tmpfs holds, whatever size a file claims
    (``truncate -s 2G`` is a few bytes). ``max_bytes``: counted as the bytes
    come, the copy stops with `TreeTooLarge` past it; and a tree whose files
    already take more (``du``) is refused before a byte moves. That is what
    stops a sparse file under gVisor at once, where holes cannot be seen
    (``st_blocks`` counts the whole size, SEEK_HOLE is EINVAL) and tar would
    stream every zero up to the cap."""
    if max_bytes is not None:
        await _refuse_if_larger(backend, handle, path, max_bytes, timeout)
    proc = await backend.exec(handle, [TAR, "--sparse", "-C", path, "-cf", "-", "--", *members], timeout=timeout)
    try:
        sent = 0
        while chunk := await proc.read():
            sent += len(chunk)
            if max_bytes is not None and sent > max_bytes:
                raise TreeTooLarge(
                    f"{path} does not fit: its copy passed {_mib(max_bytes)}, the most the session's "
                    "tmpfs sizes allow (workspace_size_mb, packages_size_mb, with room for tar's headers). "
                    "Many small or empty files cost a 512-byte header each; delete files to make room."
                )
            yield chunk
        # tar c exits 1 when a file changed while it was read: still a copy
        if (await proc.exit_code()) not in (0, 1):
            if b"Permission denied" in proc.stderr:
                raise WorkspaceUnreadable(
                    f"{path} cannot be copied: {_tar_errors(proc.stderr)}. The session's user may not read "
                    "what the session made unreadable to it (a root command's file, a chmod); make it readable "
                    "or remove it, then try again."
                )
            raise WorkspaceCopyFailed(f"Reading {path} from the kernel failed: {_tar_errors(proc.stderr)}")
    finally:
        await proc.close()


async def _refuse_if_larger(backend: Backend, handle: KernelHandle, path: str, max_bytes: int, timeout: float) -> None:
    """`TreeTooLarge` when the files under ``path`` take more than ``max_bytes``
    by ``du``'s count. Only a fast path: a ``du`` that fails or answers nonsense
    is passed over, and the streamed count still holds."""
    proc = await backend.exec(handle, [DU, "-s", "-x", "-B1", "--", path], timeout=timeout)
    try:
        out = b""
        while (chunk := await proc.read()) and len(out) < 4096:
            out += chunk
        code = await proc.exit_code()
    finally:
        await proc.close()
    field = out.split(b"\t", 1)[0].strip()
    if code != 0 or not field.isdigit():
        log.warning("du of %s in a kernel container failed (exit %s); the copy is counted as it streams", path, code)
        return
    if int(field) > max_bytes:
        raise TreeTooLarge(
            f"{path} does not fit: its files take {_mib(int(field))}, past {_mib(max_bytes)}, the most the "
            "session's tmpfs sizes allow (workspace_size_mb, packages_size_mb, with room for tar's headers). "
            "Under gVisor (runsc) a sparse file counts its full size. Delete files to make room."
        )


NO_SPACE = ("No space left on device", "Disk quota exceeded", "File too large", ": Wrote only ")
"""What ``tar x`` says (on some line of its stderr) when the target cannot hold the copy
(a short write, "Wrote only 4608 of 10240 bytes", is how GNU tar reports a full tmpfs)."""


async def write_tree(
    backend: Backend, handle: KernelHandle, path: str, stream: AsyncIterable[bytes], timeout: float
) -> int:
    """Unpack a tar stream into a directory of a kernel's container, as the kernel's
    user (``tar x``, which recreates sparse files sparse); returns the bytes it
    took. A target that cannot hold it is a 413 (`QuotaExceeded`), whichever line
    of tar's errors says so; any other failure a `WorkspaceCopyFailed`.

    tar's output is read while the stream is written: a tar that reports one
    error per file must never block on a full pipe while we wait on its stdin."""
    proc = await backend.exec(
        handle,
        [TAR, "-C", path, "-xf", "-", "--no-same-owner", "--delay-directory-restore"],
        stdin=True,
        timeout=timeout,
    )
    try:
        moved = 0
        write_error: KernelGWError | None = None

        async def drain() -> None:
            while await proc.read():
                pass

        reader = asyncio.create_task(drain(), name=f"tar-x-output {path}")
        try:
            async for chunk in stream:
                await proc.write(chunk)
                moved += len(chunk)
            await proc.close_stdin()
        except BackendError as exc:  # tar x ended early (its stdin closed): its errors say why
            write_error = exc
        except BaseException:
            reader.cancel()
            raise
        await reader
        code = await proc.exit_code()
        if code != 0 or write_error is not None:
            text = proc.stderr.decode("utf-8", "replace")
            full = next((line for line in text.splitlines() if any(n in line for n in NO_SPACE)), None)
            if full is not None:
                setting = "workspace_size_mb" if path == WORKSPACE_DIR else "packages_size_mb"
                raise QuotaExceeded(
                    f"{path} does not fit into the session: its file system (size: the setting {setting}) "
                    f"is full. tar said: {full.strip()[:300]}"
                )
            detail = _last_line(proc.stderr) if code != 0 else str(write_error)
            raise WorkspaceCopyFailed(f"Writing {path} into the kernel failed: {detail}")
        return moved
    finally:
        await proc.close()


def _tar_errors(stderr: bytes) -> str:
    """What tar said went wrong (its first three complaints), without its
    closing "Exiting with failure status due to previous errors"."""
    lines = [
        line
        for line in stderr.decode("utf-8", "replace").strip().splitlines()
        if line and "Exiting with failure status" not in line
    ]
    return "; ".join(lines[:3]) if lines else _last_line(stderr)


def _last_line(stderr: bytes) -> str:
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else "no output"
