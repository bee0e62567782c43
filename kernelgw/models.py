"""Request and response bodies at the HTTP/WebSocket edge: the one definition the
gateway and the SDK share.

Requests (`_Body`) forbid unknown fields, so a typo is a 422 rather than an option
silently ignored. Responses the SDK reads (`_Response`) ignore unknown fields and
give a default to every field but the identifying ones, so an older SDK still reads
a newer gateway's answers; the OpenAPI output schemas still mark every field
required, because this gateway always sends them all. Enumerations (a session's
``state``, a cell's ``status``) are part of the contract: a new value is a breaking
change, not something a client should guess at.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kernelgw.events import DoneStatus, Event, holds_surrogate

MAX_ENV_VARS = 100
MAX_ENV_BYTES = 64 * 1024
RESERVED_METADATA_PREFIX = "kernelgw:"
"""Metadata keys a face keeps for itself (`kernelgw.runtime.lease.RESERVED_PREFIX`): no client sets one."""
MAX_ENV_NAME = 256
MAX_ENV_VALUE = 32 * 1024
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

REFUSED_ENV_PREFIXES = ("LD_",)
REFUSED_ENV = frozenset(
    {
        # where programs are looked up, and what runs before a program's own code:
        # the dynamic loader (LD_*) and the C library (gconv modules, tunables,
        # locale and message catalogues, malloc's trace file)
        "PATH",
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        "LOCPATH",
        "NLSPATH",
        "MALLOC_TRACE",
        # code a shell runs at start; the interpreter's own library
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PYTHONHOME",
    }
)
"""Names a session's ``env`` may not set. The gateway's helpers run under
``env -i`` (see ``runtime/backends/base.py``), but ``docker exec`` starts that
first program in the container's environment: what acts before its ``main``
(the loader, libc) or decides which program runs must never come from a
session. Everything else (PYTHONPATH included) reaches the kernel's processes
only."""


def check_env(env: dict[str, str]) -> dict[str, str]:
    """The one rule for an ``env`` given at any face (``/v1``, the Jupyter API):
    shell-identifier names, no loader or lookup variables, no NUL, bounded
    sizes. Raises ValueError naming the first variable at fault."""
    if len(env) > MAX_ENV_VARS:
        raise ValueError(f"{len(env)} environment variables; at most {MAX_ENV_VARS} are accepted")
    for name, value in env.items():
        shown = repr(name[:80])
        if len(name) > MAX_ENV_NAME:
            raise ValueError(f"environment variable name {shown}... is longer than {MAX_ENV_NAME} characters")
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(
                f"{shown} is not a valid environment variable name "
                "(letters, digits and underscores, not starting with a digit)"
            )
        if name in REFUSED_ENV or name.startswith(REFUSED_ENV_PREFIXES):
            raise ValueError(
                f"environment variable {name} cannot be set for a session: it changes which programs run or "
                "what the loader injects into them (refused: PATH, LD_*, "
                f"{', '.join(sorted(REFUSED_ENV - {'PATH'}))}); set it inside the kernel instead (os.environ)"
            )
        if "\x00" in value:
            raise ValueError(f"environment variable {name} holds a NUL character, which no environment can carry")
        if len(value) > MAX_ENV_VALUE:
            raise ValueError(
                f"environment variable {name} is {len(value)} characters long; the limit is {MAX_ENV_VALUE}"
            )
    size = sum(len(k) + len(v) for k, v in env.items())
    if size > MAX_ENV_BYTES:
        raise ValueError(f"environment variables total {size} characters; the limit is {MAX_ENV_BYTES}")
    return env


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        # Python's JSON decoder takes "\ud800" alone; such text can be neither run
        # faithfully nor stored (one such cell made the history store fail for all)
        if holds_surrogate(data):
            raise ValueError(
                "the request holds a lone surrogate (a \\uD800-\\uDFFF escape without its pair), "
                "which is not valid Unicode text; send valid UTF-8"
            )
        return data


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, json_schema_serialization_defaults_required=True)


class CreateSession(_Body):
    memory_mb: int | None = Field(None, description="Memory limit in MiB (within the gateway's maximum).")
    cpus: float | None = Field(None, description="CPU quota in cores (within the gateway's maximum).")
    timeout: float | None = Field(None, description="Default per-execution timeout in seconds.")
    kernel: str | None = Field(
        None,
        description="Kernel (language) by kernelspec name: python3, deno, ir, bash, java, go, cpp or ruby; "
        "one the gateway offers (GET /v1/kernels). Default: the gateway's first.",
        max_length=64,
    )
    image: str | None = Field(None, description="Kernel image; must be one the gateway allows.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the kernel.")
    runtime: Literal["runc", "runsc"] | None = Field(
        None, description="Container runtime (runsc: gVisor); must be one the gateway allows."
    )
    metadata: dict[str, str] = Field(
        default_factory=dict,
        description="Free labels kept with the session (E2B's sandbox metadata): at most 64, keys of "
        "1 to 128 characters, values of at most 1024. A fork gets its source's unless given here.",
    )
    notebook: dict[str, Any] | None = Field(
        None,
        description="Restore: an nbformat v4 notebook (.ipynb JSON) whose code cells are run "
        "in order in the new kernel before the session is returned.",
    )
    from_session: str | None = Field(
        None, description="Restore: replay the stored history of this (possibly deleted) session."
    )
    auto_replay: bool = Field(
        False,
        description="After the kernel dies under a cell (out of memory) or is restarted after ignoring "
        "a timeout, restart it and replay the cells that built its state.",
    )
    fork_of: str | None = Field(
        None,
        alias="from",
        description="Fork: a live session of the same API key to copy. The new session gets a copy of its "
        "workspace and installed packages, its settings (unless given here), and its state rebuilt by "
        "replaying the cells that built it; then both go their own way.",
    )

    @field_validator("env")
    @classmethod
    def _checked_env(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env(env)

    @field_validator("metadata")
    @classmethod
    def _client_labels(cls, metadata: dict[str, str]) -> dict[str, str]:
        for key in metadata:
            if key.startswith(RESERVED_METADATA_PREFIX):
                raise ValueError(
                    f"metadata key {key[:80]!r}: keys starting with {RESERVED_METADATA_PREFIX!r} are kernelgw's own"
                )
        return metadata

    @model_validator(mode="after")
    def _one_source(self) -> CreateSession:
        if sum(x is not None for x in (self.notebook, self.from_session, self.fork_of)) > 1:
            raise ValueError("give at most one of notebook, from_session and from")
        return self


class SessionInfo(_Response):
    """A session as the gateway describes it."""

    id: str
    state: Literal["starting", "idle", "busy", "dead", "paused", "closed"]
    kernel: str = Field("python3", description="The kernel's kernelspec name (its language: GET /v1/kernels).")
    image: str | None = None
    runtime: str | None = Field(None, description="Container runtime: runc, or runsc (gVisor).")
    memory_mb: int | None = None
    cpus: float | None = None
    created_at: datetime | None = None
    last_activity: datetime | None = None
    execution_count: int = 0
    queue_length: int = Field(0, description="Executions waiting behind the running one.")
    subscribers: int = Field(0, description="WebSocket clients watching the session.")
    last_seq: int = Field(0, description="The session's latest event sequence number.")
    dead_reason: str | None = Field(None, description="Why the kernel died, when state is dead.")
    owner: str | None = Field(None, description="The id of the API key that created the session.")
    auto_replay: bool = Field(False, description="Whether a lost kernel is restarted and its cells replayed.")
    metadata: dict[str, str] = Field(default_factory=dict, description="The labels the session was created with.")
    lease_until: datetime | None = Field(
        None,
        description="When the session's lease (an E2B sandbox's timeout) runs out and it ends or pauses; "
        "null: no lease runs.",
    )


class KernelInfo(_Response):
    """A kernel (language) the gateway offers."""

    name: str = Field(description="Its kernelspec name: what `kernel` on create takes.")
    display_name: str
    language: str
    keeps_state: bool = Field(description="Whether variables live on between cells (else each cell is a program).")
    default: bool = Field(description="Whether sessions get it when they name none.")
    image: str
    available: bool = Field(description="Whether its image is present on the gateway's engine.")
    file_extension: str
    packages: bool = Field(description="Whether POST .../packages installs into it (Python only).")


class KernelList(_Response):
    kernels: list[KernelInfo]


class SessionList(_Response):
    sessions: list[SessionInfo]


# --- history, notebooks and restore


class ReplayedCell(_Response):
    """What happened to one code cell when a session was restored."""

    index: int = Field(description="The cell's index in notebook.cells (from_session: the execution's position).")
    status: Literal["ok", "error", "timeout", "interrupted", "dead", "skipped"]
    execution_count: int | None = None
    ename: str | None = None
    evalue: str | None = None
    reason: str | None = Field(None, description="Why it failed or was skipped.")
    duration_ms: float | None = None


class RestartRequest(_Body):
    replay: bool = Field(
        False,
        description="Replay, in the new kernel, the cells that built the old one's state (those that "
        "ran ok in it, in order, except cells sent with replay: false), stopping at the first that fails.",
    )


class ReplayReportCell(_Response):
    """What happened to one cell when a session replayed its lineage."""

    index: int = Field(description="Its place in the replay, from 0 (the oldest cell).")
    replay_of: str = Field(description="The execution it re-ran (see /history).")
    status: Literal["ok", "error", "timeout", "interrupted", "dead", "skipped"]
    execution_id: str | None = Field(None, description="The replayed execution; null when skipped.")
    duration_ms: float | None = None
    ename: str | None = None
    evalue: str | None = None
    reason: str | None = Field(None, description="Why it failed or was skipped.")


class ReplayReport(_Response):
    trigger: Literal["requested", "kernel_died", "timeout", "fork", "resume"]
    cells: list[ReplayReportCell]
    replayed: int = Field(0, description="Cells that ran ok.")
    complete: bool = Field(False, description="Every cell ran ok: the state is rebuilt.")
    duration_ms: float = 0.0


class RestartedSession(SessionInfo):
    replay: ReplayReport | None = Field(
        None, description="With replay: the replay's report. It stops at the first cell that does not end ok."
    )


class ForkReport(_Response):
    """How a forked session was made from its source."""

    source: str = Field(description="The session it was forked from.")
    copied_bytes: int = Field(description="Bytes of workspace and installed packages copied (as a tar stream).")
    copy_ms: float = Field(
        description="How long copying the files took, with starting the store that keeps them past the new kernel."
    )
    replay: ReplayReport = Field(
        description="Rebuilding the source's state in the new kernel (no cells when the source was paused)."
    )
    namespace: NamespaceReport | None = Field(
        None,
        description="A paused source is forked from its snapshot: the variables it gave the new kernel "
        "(what could not be pickled is in `failed`). None for a running source.",
    )


class CreatedSession(SessionInfo):
    replay: list[ReplayedCell] | None = Field(
        None,
        description="Restores only: one entry per code cell, in order. A failing cell does not stop "
        "the replay; a cell that loses the kernel's state (died, or restarted after a timeout) does.",
    )
    fork: ForkReport | None = Field(None, description="Forks only: what was copied and replayed.")


class NamespaceReport(_Response):
    """What a pause saved of the kernel's variables, or a resume restored."""

    names: list[str] = Field(description="Variables saved (pause) or restored (resume).")
    modules: dict[str, str] = Field(default_factory=dict, description="Names bound to modules: re-imported.")
    failed: dict[str, str] = Field(
        default_factory=dict, description="Variables that could not be saved or restored, with why."
    )
    bytes: int = Field(0, description="Size of the pickled namespace.")


class PausedSession(SessionInfo):
    namespace: NamespaceReport | None = None
    stored_bytes: int = Field(0, description="Bytes kept on the gateway's disk (files, packages, namespace).")
    duration_ms: float = 0.0


class ResumeRequest(_Body):
    replay: bool = Field(
        False,
        description="Run the cells that built the state first (only when some variables could not be saved); "
        "the saved values are loaded over what they rebuild.",
    )


class ResumedSession(SessionInfo):
    namespace: NamespaceReport | None = None
    restored_bytes: int = 0
    duration_ms: float = 0.0
    replay: ReplayReport | None = None


class NoteRequest(_Body):
    markdown: str = Field(description="Markdown text; exported as a markdown cell at the current position.")


class NoteResponse(BaseModel):
    session_id: str
    after_seq: int = Field(description="The session's last event seq when the note was added.")
    created_at: datetime


class HistoryExecution(BaseModel):
    execution_id: str
    position: int
    code: str
    status: DoneStatus | Literal["running"] = Field(description="running: the cell had not ended when this was read.")
    execution_count: int | None
    started_at: datetime
    duration_ms: float
    reason: str | None
    state_lost: bool
    replay_of: str | None = Field(None, description="A replayed execution: the execution it re-ran.")
    replayable: bool = Field(True, description="False: sent with replay: false, never replayed.")
    events: list[Event]


class HistoryNote(BaseModel):
    after_seq: int
    markdown: str
    created_at: datetime


class HistoryResponse(BaseModel):
    session_id: str
    created_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    image: str
    executions: list[HistoryExecution]
    notes: list[HistoryNote]


class ExecuteRequest(_Body):
    code: str
    timeout: float | None = Field(None, description="Seconds before the cell is interrupted.")
    execution_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    replay: bool = Field(True, description="false: a replay never runs this cell again (side effects).")


class ExecuteResponse(BaseModel):
    execution_id: str
    status: DoneStatus
    execution_count: int | None
    duration_ms: float
    events: list[Event]


class InterruptResponse(BaseModel):
    interrupted: bool


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    engine: bool
    image: bool
    image_name: str
    runtime: str
    sessions: int
    detail: str = ""
    storage: str = "writable"
    """The history store: ``writable`` or why it cannot write."""
    draining: bool = False
    """Shutting down: running cells finish, new work is refused."""


class ErrorBody(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody


# --- workspace files


class FileEntry(_Response):
    """One workspace entry. Symbolic links are listed, never followed."""

    path: str
    """Relative to the workspace."""
    type: Literal["file", "directory", "symlink", "other"]
    size: int
    mtime: datetime
    mime_type: str | None = None
    """For files: the type a download is served with."""


class UploadResult(FileEntry):
    created: bool
    """False when an existing file was replaced."""


class FileList(_Response):
    path: str
    """The listed directory ("" is the workspace), or the one file asked for."""
    entries: list[FileEntry]
    truncated: bool = False
    """True when there were more than 10,000 entries."""


# --- packages and images


class PackageInfo(_Response):
    name: str
    """PEP 503 normalised name."""
    version: str


class PresentPackage(PackageInfo):
    source: Literal["image", "session"]
    """Preinstalled in the image, or installed into this session earlier."""


class InstallRequest(_Body):
    packages: list[str]
    """Requirements: names, optionally with a version specifier (``"sympy>=1.12"``)."""


class InstallResult(_Response):
    installed: list[PackageInfo]
    """What this request added to the session: the packages and their dependencies."""
    already_present: list[PresentPackage]
    """Requested packages the session already had (nothing was done for them)."""
    duration_ms: float


class ImageInfo(_Response):
    name: str
    default: bool
    present: bool
    """Whether the engine has the image (sessions cannot use it otherwise)."""
    python: str | None = None
    packages: dict[str, str] = {}
    """Preinstalled packages: normalised name -> version."""


class ImageList(_Response):
    images: list[ImageInfo]
    package_allowlist: list[str]
    """What sessions may install on top (POST /v1/sessions/{id}/packages)."""


# --- messages a WebSocket client sends


class WsExecute(_Body):
    type: Literal["execute"]
    code: str
    execution_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    timeout: float | None = None
    replay: bool = True
    """false: a replay never runs this cell again."""


class WsInterrupt(_Body):
    type: Literal["interrupt"]


WsMessage = Annotated[WsExecute | WsInterrupt, Field(discriminator="type")]


# ---------------------------------------------------------------- auth and keys
class Quotas(_Body):
    max_sessions: int | None = Field(None, gt=0, description="Sessions the key may hold at once.")
    max_memory_mb: int | None = Field(None, ge=64, description="Most memory one of its sessions may ask for.")
    max_cpus: float | None = Field(None, gt=0, description="Most CPUs one of its sessions may ask for.")
    max_timeout_s: float | None = Field(None, gt=0, description="Longest execution timeout it may ask for.")
    executions_per_minute: int | None = Field(None, gt=0, description="Executions it may start per minute.")


class CreateApiKey(_Body):
    name: str = Field(min_length=1, max_length=255, description="Who or what the key is for.")
    role: Literal["user", "admin"] = "user"
    quotas: Quotas | None = None


class ApiKeyInfo(BaseModel):
    id: str
    name: str
    role: Literal["user", "admin"]
    quotas: dict[str, Any]
    created_at: datetime
    revoked_at: datetime | None = None


class CreatedApiKey(ApiKeyInfo):
    key: str = Field(description="The key itself: shown once, stored only as a hash.")


class ApiKeyList(BaseModel):
    keys: list[ApiKeyInfo]


class WhoAmI(BaseModel):
    auth: bool = Field(description="Whether the gateway requires API keys.")
    key_id: str | None
    name: str
    role: Literal["user", "admin"]
    quotas: dict[str, Any]


class BrowserToken(BaseModel):
    token: str = Field(description="Put it on a WebSocket URL as ?token=...; it expires soon.")
    expires_at: datetime
