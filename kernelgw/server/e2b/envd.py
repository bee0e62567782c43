"""envd's filesystem service (``filesystem.Filesystem``, Connect RPC) on a sandbox's workspace.

E2B's SDK calls ``Stat`` (``files.get_info``, ``exists``), ``ListDir``
(``list``, with a depth), ``MakeDir``, ``Move`` (``rename``) and ``Remove`` as
unary Connect calls with the JSON codec (`kernelgw.server.e2b.connect`) on
envd's port, 49983. Each is one operation of the workspace helper, through
`WorkspaceFiles` as on ``/v1``: its path rules (`kernelgw.paths.validate_path`:
no ``..``, no NUL, no path through a symbolic link, which the helper checks
again in the container), its errors, the kernel's user. A paused sandbox is
woken first (`kernelgw.server.e2b.sandbox.wake`), as code sent to it is.

Paths are the sandbox's: E2B's home and working directory ``/home/user`` is
kernelgw's workspace (the kernel image links one to the other), so
``/home/user/...``, ``/workspace/...`` and relative paths (from
``/home/user``, ``~`` too) reach the workspace, and entries name their paths
under ``/home/user``. Any other absolute path is outside what the files API
reaches: ``permission_denied``. Files are read and written as the sandbox's
one user (``user``, E2B's default): another user is refused the same way.
Entries name that user (the kernel's, whatever its uid) ``user`` as owner and
group, as E2B's do; other owners keep the container's names.

Where envd follows symbolic links (``Stat``, ``ListDir`` of a link to a
directory) kernelgw describes the link itself and never enters it. Watching
a directory (``WatchDir``, the watcher calls) is `kernelgw.server.e2b.envd_watch`'s.
``Remove`` of what does not exist succeeds, as envd's does.
"""

from __future__ import annotations

import base64
import binascii
import stat
from collections.abc import Awaitable, Callable
from datetime import datetime

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from kernelgw.errors import (
    BadRequest,
    FileNotFoundInWorkspace,
    Forbidden,
    GatewayDraining,
    InvalidPath,
    KernelDied,
    KernelGWError,
    PayloadTooLarge,
    RateLimited,
    SessionBusy,
    StorageUnavailable,
    Unauthorized,
)
from kernelgw.paths import validate_path
from kernelgw.runtime.backends.base import WORKSPACE_DIR, KernelHandle
from kernelgw.runtime.workspace import EntryDetails, WorkspaceFiles
from kernelgw.server.e2b import errors as e2b_errors
from kernelgw.server.e2b.connect import (
    Code,
    ConnectError,
    message_response,
    read_message,
    within_deadline,
)
from kernelgw.server.e2b.sandbox import ENVD_PORT, Sandbox, not_found, sandbox_for, wake
from kernelgw.server.face_routes import face_route
from kernelgw.server.state import gateway_state

HOME = "/home/user"
"""E2B's home and working directory: the workspace, as the sandbox sees it."""
USER = "user"
"""The sandbox's one user, as E2B names its default one."""
OUTSIDE = (
    "{path!r} is outside what kernelgw's files API reaches: only /home/user, the sandbox's workspace "
    "(also /workspace), and paths relative to it"
)


# ---------------------------------------------------------------- paths


def workspace_path(path: str) -> str:
    """The workspace-relative path (``""``: the workspace) of a path the sandbox
    sees, under kernelgw's path rules; `Forbidden` outside the workspace."""
    text = HOME + path[1:] if path == "~" or path.startswith("~/") else path
    if text.startswith("/"):
        for base in (HOME, WORKSPACE_DIR):
            if text == base or text.startswith(base + "/"):
                text = text[len(base) + 1 :]
                break
        else:
            raise Forbidden(OUTSIDE.format(path=path))
    try:
        return validate_path(text, allow_root=True)
    except InvalidPath as exc:
        raise InvalidPath(f"{path!r}: {exc.message}") from None


def sandbox_path(rel: str) -> str:
    """Where a workspace path lies as the sandbox sees it."""
    return f"{HOME}/{rel}" if rel else HOME


def link_target(target: str) -> str:
    """A link's target as the sandbox names it (a target in the workspace under ``/home/user``)."""
    if target == WORKSPACE_DIR or target.startswith(WORKSPACE_DIR + "/"):
        return HOME + target[len(WORKSPACE_DIR) :]
    return target


def check_user(user: str | None) -> None:
    """Files are the sandbox's one user's: another is refused."""
    if user and user != USER:
        raise Forbidden(
            f"user={user!r}: kernelgw's sandboxes have one user, {USER!r}, whose files these are; "
            "leave the user out (or give 'user')"
        )


def basic_user(authorization: str | None) -> str | None:
    """The user E2B's SDK names in ``Authorization: Basic base64("<user>:")``, if any."""
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise BadRequest("The Authorization header's Basic credentials are not base64 of '<user>:'.") from None
    return decoded.partition(":")[0]


# ---------------------------------------------------------------- entries

FILE_TYPES = {"file": "FILE_TYPE_FILE", "directory": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}
"""envd's ``FileType`` names; anything else (a FIFO, a socket) is unspecified (the SDK leaves it out)."""

_KINDS = (
    (stat.S_ISDIR, "d"),
    (stat.S_ISLNK, "L"),
    (lambda m: stat.S_ISBLK(m) or stat.S_ISCHR(m), "D"),
    (stat.S_ISFIFO, "p"),
    (stat.S_ISSOCK, "S"),
    (lambda m: bool(m & stat.S_ISUID), "u"),
    (lambda m: bool(m & stat.S_ISGID), "g"),
    (stat.S_ISCHR, "c"),
    (lambda m: bool(m & stat.S_ISVTX), "t"),
)


def permissions(st_mode: int) -> str:
    """The mode as envd's entries spell it (Go's ``FileMode.String``: ``-rw-r--r--``,
    ``drwxr-xr-x``, ``Lrwxrwxrwx``)."""
    kinds = "".join(letter for test, letter in _KINDS if test(st_mode)) or "-"
    bits = "".join(c if st_mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    return kinds + bits


def timestamp(moment: datetime) -> str:
    """proto3 JSON's ``Timestamp``: RFC 3339 in UTC with ``Z``."""
    return moment.isoformat().replace("+00:00", "Z")


def clean(text: str) -> str:
    """A name as valid UTF-8 (an undecodable byte of a file name becomes U+FFFD)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class EntryInfo(BaseModel):
    """envd's ``EntryInfo`` in proto3 JSON (``size`` is an int64: a string)."""

    model_config = ConfigDict(populate_by_name=True)

    name: str
    type: str
    path: str
    size: str
    mode: int
    permissions: str
    owner: str
    group: str
    modified_time: str = Field(alias="modifiedTime")
    symlink_target: str | None = Field(None, alias="symlinkTarget")
    metadata: dict[str, str] | None = None
    is_symlink: bool | None = Field(None, alias="isSymlink")


def entry_info(entry: EntryDetails) -> EntryInfo:
    link = entry.type == "symlink"
    path = clean(sandbox_path(entry.path))
    return EntryInfo(
        name=path.rsplit("/", 1)[-1],
        type=FILE_TYPES.get(entry.type, "FILE_TYPE_UNSPECIFIED"),
        path=path,
        size=str(entry.size),
        mode=stat.S_IMODE(entry.st_mode),
        permissions=permissions(entry.st_mode),
        owner=USER if entry.own_user else clean(entry.owner),
        group=USER if entry.own_group else clean(entry.group),
        modified_time=timestamp(entry.mtime),
        symlink_target=clean(link_target(entry.symlink_target or "")) if link else None,
        metadata=entry.metadata or None,
        is_symlink=True if link else None,
    )


# ---------------------------------------------------------------- errors


def connect_error(exc: KernelGWError) -> ConnectError:
    """kernelgw's error as the Connect code E2B's SDK turns into its exception
    (``not_found``: `FileNotFoundException`; ``invalid_argument``:
    `InvalidArgumentException`; ...)."""
    code: Code
    if isinstance(exc, Forbidden):
        code = "permission_denied"
    elif isinstance(exc, FileNotFoundInWorkspace):
        code = "not_found"
    elif isinstance(exc, BadRequest):
        code = "invalid_argument"
    elif isinstance(exc, Unauthorized):
        code = "unauthenticated"
    elif isinstance(exc, RateLimited):
        code = "resource_exhausted"
    elif isinstance(exc, PayloadTooLarge | KernelDied):
        code = "failed_precondition"  # resource_exhausted would read as a rate limit in the SDK
    elif isinstance(exc, SessionBusy | GatewayDraining | StorageUnavailable) or exc.status_code == 503:
        code = "unavailable"
    else:
        code = "internal"
    return ConnectError(code, exc.message)


def connect_shape(request: Request, exc: Exception) -> Response | None:
    """A Connect call's errors: the sandbox's own (not found, wrong port) as E2B's
    proxy answers them, the call's in Connect's shape."""
    if isinstance(exc, ConnectError):
        return exc.response(request)
    if isinstance(exc, KernelGWError):
        return connect_error(exc).response(request)
    return e2b_errors.to_response(request, exc)


ConnectRoute = face_route(connect_shape, "ConnectRoute")


# ---------------------------------------------------------------- the workspace


def workspace_files(request: Request) -> WorkspaceFiles:
    return gateway_state(request).workspace_files


async def workspace_of(request: Request, sandbox: Sandbox) -> KernelHandle:
    """The sandbox's running container with its files in it: a paused sandbox is
    woken (E2B's auto-resume, with its lease), a start or resume under way waited for."""
    session = sandbox.session
    if session.state == "closed":
        raise not_found()  # being killed: as if gone
    await wake(request, session)
    handle = await session.files_handle()
    if handle is None:
        if session.state == "dead":
            raise KernelDied(
                f"The sandbox's kernel is dead ({session.dead_reason}); restart its context (or kill the sandbox)."
            )
        raise SessionBusy("The sandbox's kernel is (re)starting; try again in a moment.")
    session.touch()
    return handle


# ---------------------------------------------------------------- the calls


class PathRequest(BaseModel):
    """``StatRequest``, ``MakeDirRequest``, ``RemoveRequest``."""

    model_config = ConfigDict(extra="ignore")

    path: StrictStr = ""


class ListDirRequest(PathRequest):
    depth: StrictInt | StrictStr = 0
    """A uint32: a number, or (proto3 JSON) a string of one."""


class MoveRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    source: StrictStr = ""
    destination: StrictStr = ""


class EntryResponse(BaseModel):
    """``StatResponse``, ``MakeDirResponse``, ``MoveResponse``."""

    entry: EntryInfo


class ListDirResponse(BaseModel):
    entries: list[EntryInfo]


class Empty(BaseModel):
    pass


def depth_of(value: int | str) -> int:
    """``ListDirRequest.depth`` (0: the directory's own entries, as 1)."""
    try:
        depth = int(value)
    except ValueError:
        raise ConnectError("invalid_argument", f"depth must be a number, not {value!r}") from None
    if not 0 <= depth < 1 << 32:
        raise ConnectError("invalid_argument", f"depth must be a uint32, not {depth}")
    return max(1, depth)


async def stat_call(request: Request, sandbox: Sandbox) -> BaseModel:
    msg = await read_message(request, PathRequest)
    rel = workspace_path(msg.path)
    entry = await workspace_files(request).stat(await workspace_of(request, sandbox), rel)
    return EntryResponse(entry=entry_info(entry))


async def list_dir_call(request: Request, sandbox: Sandbox) -> BaseModel:
    msg = await read_message(request, ListDirRequest)
    rel, depth = workspace_path(msg.path), depth_of(msg.depth)
    entries, truncated = await workspace_files(request).list_dir(await workspace_of(request, sandbox), rel, depth)
    if truncated:
        raise ConnectError(
            "failed_precondition",
            f"{sandbox_path(rel)} has more than {len(entries)} entries within depth {depth}: "
            "list it with a smaller depth, or list its subdirectories one by one",
        )
    return ListDirResponse(entries=[entry_info(e) for e in entries])


async def make_dir_call(request: Request, sandbox: Sandbox) -> BaseModel:
    msg = await read_message(request, PathRequest)
    rel = workspace_path(msg.path)
    if rel == "":
        raise ConnectError("already_exists", f"directory already exists: {HOME}")
    created, entry = await workspace_files(request).make_dir(await workspace_of(request, sandbox), rel)
    if not created:
        raise ConnectError("already_exists", f"directory already exists: {sandbox_path(rel)}")
    await sandbox.session.keep_files()
    return EntryResponse(entry=entry_info(entry))


async def move_call(request: Request, sandbox: Sandbox) -> BaseModel:
    msg = await read_message(request, MoveRequest)
    source, destination = workspace_path(msg.source), workspace_path(msg.destination)
    if "" in (source, destination):
        raise ConnectError("invalid_argument", f"{HOME} (the workspace itself) cannot be moved, nor replaced")
    entry = await workspace_files(request).move(await workspace_of(request, sandbox), source, destination)
    await sandbox.session.keep_files()
    return EntryResponse(entry=entry_info(entry))


async def remove_call(request: Request, sandbox: Sandbox) -> BaseModel:
    msg = await read_message(request, PathRequest)
    rel = workspace_path(msg.path)
    if rel == "":
        raise ConnectError("invalid_argument", f"{HOME} (the workspace itself) cannot be removed; remove what is in it")
    try:
        await workspace_files(request).delete(await workspace_of(request, sandbox), rel)
    except FileNotFoundInWorkspace:
        pass  # envd's Remove of what is not there succeeds
    return Empty()


Call = Callable[[Request, Sandbox], Awaitable[BaseModel]]
CALLS: dict[str, Call] = {
    "Stat": stat_call,
    "ListDir": list_dir_call,
    "MakeDir": make_dir_call,
    "Move": move_call,
    "Remove": remove_call,
}
router = APIRouter(route_class=ConnectRoute, tags=["e2b"])


@router.post("/e2b/filesystem.Filesystem/{method}")
async def filesystem(method: str, request: Request) -> Response:
    """One call of envd's filesystem service (port 49983) on the sandbox's workspace."""
    sandbox = await sandbox_for(request, ENVD_PORT)
    call = CALLS.get(method)
    if call is None:
        raise ConnectError("unimplemented", f"filesystem.Filesystem has no method {method}")
    check_user(basic_user(request.headers.get("authorization")))
    return message_response(await within_deadline(request, call(request, sandbox)))
