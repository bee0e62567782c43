"""The contract between sessions and whatever runs kernels.

A backend turns a :class:`KernelSpec` into a running, network-less kernel and
hands back how to reach it (a jupyter_client connection dict using ``ipc://``
sockets in a per-kernel directory). Docker is the implementation today; a
Kubernetes backend would implement the same protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

KernelStatus = Literal["running", "exited", "missing"]

WORKSPACE_DIR = "/workspace"
"""The kernel's working directory: uploads, downloads and what its code writes."""
PACKAGES_DIR = "/opt/kernelgw/packages"
"""Where packages installed into a session go (on the kernel's ``sys.path``)."""
SESSION_DIRS = (WORKSPACE_DIR, PACKAGES_DIR)
"""What a session keeps across its kernels, and what a fork copies."""

HELPER_ENV = (
    "PATH=/usr/bin:/bin",
    "LANG=C.UTF-8",
    "HOME=/nonexistent",
    "PYTHONNOUSERSITE=1",
    "PYTHONSAFEPATH=1",
    "PIP_CONFIG_FILE=/dev/null",
)
"""The whole environment of a gateway helper in a container, whatever the
session's ``env``: programs from the image's read-only /usr/bin and /bin; no
home, user site, working directory or pip configuration a kernel could have
written a ``.pth``, a ``pip.py`` or a ``pip.conf`` into (pkg.py runs pip
without ``-I``; pip reads no configuration file when this names /dev/null)."""
HELPER_LOADER_RESET = {
    name: ""
    for name in ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "MALLOC_TRACE")
}
"""Set (empty, which the loader ignores) on the ``docker exec`` itself: the
engine starts ``env`` in the container's environment, so a loader variable
there (a container started before sessions' ``env`` was checked) would reach
``env`` before ``-i`` clears it."""


class HelperPathNotAbsolute(ValueError):
    """A helper was named by a bare name, which a search path would resolve."""


def helper_command(argv: list[str]) -> list[str]:
    """``argv`` as the gateway runs it in a kernel's container: under
    ``/usr/bin/env -i`` with `HELPER_ENV` only, so nothing from the session's
    environment (PATH, LD_*, PYTHON*, TAR_OPTIONS ...) reaches it. The program
    must be an absolute path: no lookup, in any directory the kernel can write."""
    if not argv or not argv[0].startswith("/"):
        raise HelperPathNotAbsolute(f"a helper must be named by an absolute path, not {argv[:1]!r}")
    return ["/usr/bin/env", "-i", *HELPER_ENV, *argv]


ROOT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER")
"""What root needs to use a sandbox's files (owned by the session's uid, the
workspace mode 0700), added to the containers of gVisor sessions when the
gateway allows root commands (``e2b_root_commands``); the kernel drops every
capability (`setpriv --bounding-set=-all`), so only a root command has them."""


IPC_PORTS = {"shell_port": 1, "iopub_port": 2, "stdin_port": 3, "control_port": 4, "hb_port": 5}
"""With ipc transport a "port" only names a socket file: ``{ip}-{port}``."""


def connection_info(ip: str, key: str) -> dict[str, Any]:
    """A jupyter connection dict for ipc transport: sockets are ``{ip}-{port}``,
    messages signed with HMAC-SHA256 and ``key`` (random per kernel)."""
    return {
        "transport": "ipc",
        "ip": ip,
        **IPC_PORTS,
        "key": key,
        "signature_scheme": "hmac-sha256",
        "kernel_name": "python3",
    }


@dataclass(frozen=True)
class KernelSpec:
    """What a session asks for. Values are already validated against the maximums."""

    session_id: str
    image: str
    memory_mb: int
    cpus: float
    pids_limit: int
    tmp_size_mb: int
    workspace_size_mb: int
    shm_size_mb: int
    runtime: str = "runc"
    env: dict[str, str] = field(default_factory=dict)
    packages_size_mb: int = 256
    """tmpfs for packages installed into the session (POST .../packages)."""
    kernel: str = "python3"
    """The kernel's profile name (``kernelgw.kernels``): what runs in ``image``."""
    host: KernelHost | None = None
    """A child kernel (an E2B context): run it as another process in this
    kernel's container, not in a container of its own (None: a container)."""

    @property
    def child(self) -> bool:
        return self.host is not None


@dataclass(frozen=True)
class KernelHost:
    """Where a child kernel runs: in ``handle``'s container, a sandbox's. Its
    processes share that container's files, uid and limits (one cgroup: memory,
    CPU and pids are the sandbox's, whatever runs in it) and end with it."""

    handle: KernelHandle
    image_kernel: str
    """The kernel the container's image was made for: what else it holds
    (`kernelgw.kernels.image_kernels`) and how each starts there."""
    cwd: str
    """The child kernel's working directory (an absolute path in the container)."""


@dataclass(frozen=True)
class KernelHandle:
    """A started kernel. ``connection`` is what jupyter_client needs on the host."""

    kernel_id: str
    session_id: str
    container_id: str
    conn_dir: Path
    connection: dict[str, Any]
    host: str | None = None
    """A child kernel's: the kernel id of the kernel whose container it runs in
    (`KernelSpec.host`); None for a kernel of its own container."""


@dataclass(frozen=True)
class KernelContainer:
    """A kernel container of this gateway's name, as the engine lists it (labels
    and state): what a restarted gateway matches against its open sessions."""

    container_id: str
    kernel_id: str
    session_id: str
    running: bool


@dataclass(frozen=True)
class KernelCounters:
    """What a kernel's container has used, as its engine counts it at ``at``
    (`Backend.counters`); a rate needs two (`kernelgw.runtime.usage`)."""

    at: float
    """When the counters were read (seconds, monotonic clock)."""
    cpu_ns: int
    """CPU time used since the container started, every process of it."""
    memory_bytes: int
    """Memory in use, without the page cache it can drop."""
    cache_bytes: int
    memory_limit: int | None
    """The container's memory limit as the engine reports it (None: not reported)."""


@dataclass(frozen=True)
class KernelState:
    status: KernelStatus
    oom_killed: bool = False
    """Exited: an out-of-memory kill came after the caller last saw the kernel
    alive (``oom_seen``), not merely ever in the container's life."""
    oom_kills: int = 0
    """The out-of-memory kills the engine reported for the container so far."""
    exit_code: int | None = None
    error: str | None = None
    detail: str | None = None
    """What else is known of a child kernel's end (its container stopped, the
    last line it wrote to stderr); None for a kernel of its own container."""

    @property
    def alive(self) -> bool:
        return self.status == "running"

    def describe(self) -> str:
        """Why the kernel is gone, for a ``done`` event's ``reason``."""
        if self.status == "missing" and self.detail and not self.oom_killed:  # a child's: no container of its own
            return self.detail
        said = self._describe()
        return f"{said} ({self.detail})" if self.detail else said

    def _describe(self) -> str:
        if self.oom_killed:
            return "out-of-memory: the kernel used more memory than the session's limit and was killed"
        if self.status == "missing":
            return "the kernel container no longer exists"
        if self.exit_code is not None and self.exit_code < 0:
            return f"the kernel was killed by signal {-self.exit_code}"
        if self.exit_code is not None and self.exit_code > 128:
            return f"the kernel was killed by signal {self.exit_code - 128}"
        return f"the kernel exited with code {self.exit_code}"


@dataclass(frozen=True)
class EngineHealth:
    engine: bool
    image: bool
    detail: str = ""


class ExecProcess(Protocol):
    """A helper process running in a kernel's container (see :meth:`Backend.exec`).

    One caller drives it: write stdin, read stdout, close. Reads and writes
    never block the event loop; each waits at most the timeout given to
    ``exec`` and then raises :class:`~kernelgw.errors.BackendError`.
    """

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the process's stdin (all of it, in order)."""
        ...

    async def close_stdin(self) -> None:
        """End the process's stdin; stdout stays readable."""
        ...

    async def read(self) -> bytes:
        """The next bytes the process wrote to stdout (at most about 1 MiB);
        ``b""`` once stdout has ended and the process has exited or closed it."""
        ...

    @property
    def stderr(self) -> bytes:
        """What the process wrote to stderr so far (capped at 64 KiB)."""
        ...

    async def exit_code(self) -> int | None:
        """The exit code, after ``read`` returned ``b""``; None if not known."""
        ...

    async def close(self) -> None:
        """Drop the connection. A process still running sees its stdin and
        stdout close. Idempotent; every opened process must be closed."""
        ...


COMMAND_WRAPPER = 'printf "%s\\n" "$$" >&2; cd -- "$1" || exit 1; PWD=$2; export PWD; shift 2; exec "$@"'
"""How a user command starts in a kernel's container (``/bin/sh -c`` this, its
working directory, the ``PWD`` it shows, then its argv): the shell writes its
pid, which the command keeps (``exec``), as the first line of stderr, so the
gateway can signal the command's process group later (the engine starts each
exec as its own session leader). The shell changes directory itself, after
the exec dropped its privileges: under gVisor the engine's own change of
directory happens with the exec's capabilities, before the drop to the
session's uid, and a root without them cannot enter the session's 0700 workspace."""

CommandStream = Literal[1, 2, 3]
"""1: stdout, 2: stderr, 3: a terminal's one stream (a command with a tty)."""


@dataclass(frozen=True)
class TerminalSize:
    """A terminal's size in characters (``rows`` lines of ``cols`` columns)."""

    rows: int
    cols: int


class CommandProcess(Protocol):
    """A user's command running in a kernel's container (see :meth:`Backend.run_command`).

    Unlike a helper, it may run for as long as its sandbox does and print
    without end: reads wait as long as it takes (no timeout) and never block the
    event loop; whoever reads decides how much to keep.
    """

    @property
    def pid(self) -> int:
        """The command's pid in the container (its process group's id too)."""
        ...

    async def read(self) -> tuple[CommandStream, bytes] | None:
        """The next bytes the command wrote (stdout or stderr; with a terminal,
        its one stream, 3), at most about 64 KiB; None once both have ended."""
        ...

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the command's stdin (all of it, in order)."""
        ...

    async def close_stdin(self) -> None:
        """End the command's stdin."""
        ...

    async def resize(self, size: TerminalSize) -> None:
        """Set the size of the command's terminal (one started with a ``tty``)."""
        ...

    async def exit_code(self) -> int | None:
        """The exit code, after ``read`` returned None; None if not known."""
        ...

    async def close(self) -> None:
        """Drop the connection (the command sees its stdin and stdout close).
        Idempotent; every started command must be closed."""
        ...


class Backend(Protocol):
    """Lifecycle of kernel containers. All methods are coroutines and never block
    the event loop. The session layer calls the lifecycle methods; ``exec`` and
    ``image_labels`` serve the workspace file and package endpoints."""

    async def start(self, spec: KernelSpec) -> KernelHandle:
        """Create the connection directory and the container, return at once.

        Called by a session when it is created or restarted. The kernel may not be
        answering yet; the caller waits for it over ZMQ.
        """
        ...

    async def stop(self, handle: KernelHandle) -> None:
        """Remove the kernel's container and its connection directory (not the
        session's workspace: see ``end_session``). Idempotent."""
        ...

    async def keep_workspace(self, spec: KernelSpec) -> None:
        """From now on, keep the session's workspace and packages past its kernel
        (a restart or an out-of-memory kill keeps them). Called once the session
        has files, and before a restart; idempotent, cheap once done. A backend
        whose kernels keep no files apart does nothing."""
        ...

    async def end_session(self, session_id: str) -> None:
        """Remove what a session keeps across its kernels (its workspace and
        installed packages, where the backend keeps them apart from the kernel).

        Called when the session ends (deleted, reaped, or it failed to start),
        and when it is paused or its resume failed (its files are then in the
        snapshot): a later ``start`` for the session and ``keep_workspace``
        keep its files again. Never on a restart or when a gateway leaves
        kernels running. Idempotent; failures are logged, not raised."""
        ...

    async def signal(self, handle: KernelHandle, signum: int) -> None:
        """Send a signal to the kernel process (SIGINT to interrupt a cell)."""
        ...

    async def state(self, handle: KernelHandle, oom_seen: int = 0) -> KernelState:
        """Whether the container still runs, and if not, why (exit code; an
        out-of-memory kill when the container's count of them passed
        ``oom_seen``, what `oom_kills` said when the caller last knew the kernel
        alive: a subprocess killed earlier does not make a later kill one)."""
        ...

    def oom_kills(self, handle: KernelHandle) -> int:
        """The out-of-memory kills reported for the container so far. Never blocks."""
        ...

    async def counters(self, handle: KernelHandle) -> KernelCounters:
        """The container's CPU time and memory now (cheap: no waiting for a
        second sample). Raises :class:`~kernelgw.errors.KernelDied` when the
        container is gone."""
        ...

    async def seal(self, handle: KernelHandle) -> None:
        """Take the connection directory away from the kernel once it is ready.

        Called by the session after the first kernel_info reply and before any
        user code runs. Checks (lstat, no link following) that the kernel's
        sockets are sockets, then makes the directory the gateway's alone, so
        user code cannot swap a socket for a symlink that the gateway would
        follow on a ZMQ reconnect. Raises KernelStartFailed if anything is off.
        """
        ...

    async def reap_orphans(self) -> list[str]:
        """Remove containers and directories of this gateway's name left by a
        previous gateway process. Same as ``reap_except(set())``."""
        ...

    async def list_kernels(self) -> list[KernelContainer]:
        """Every kernel container of this gateway's name, running or not.

        Called once at gateway start-up, under the name's ownership lock, to find
        the kernels a previous gateway process left for reattachment."""
        ...

    async def reap_except(self, keep: set[str]) -> list[str]:
        """Remove the containers and connection directories of this gateway's
        name whose kernel id is not in ``keep`` (the reattached kernels).

        Called once at start-up, after reattachment; returns what was removed."""
        ...

    async def exec(
        self, handle: KernelHandle, argv: list[str], *, stdin: bool = False, timeout: float = 120.0
    ) -> ExecProcess:
        """Start ``argv`` in the kernel's container, next to the kernel, as the
        kernel's user, with no more rights than the kernel has, and nothing of
        the session's environment: through `helper_command` (absolute path,
        ``env -i``), loader variables reset on the exec itself.

        Called by the workspace file and package endpoints to run the image's
        ``kernelgw_kernel`` helpers: bytes move through the engine's API, the
        container never gets a network. ``timeout`` bounds every single read or
        write. Raises :class:`~kernelgw.errors.KernelDied` when the container
        is gone or stopped.
        """
        ...

    async def run_command(
        self,
        handle: KernelHandle,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        stdin: bool = False,
        tty: TerminalSize | None = None,
        root: bool = False,
    ) -> CommandProcess:
        """Start a user's command (not a helper: ``argv`` as given, looked up on
        the container's PATH) in the kernel's container, as the kernel's user
        (``root``: as uid 0 of the container, which the caller allows only
        under gVisor, with the file capabilities of `ROOT_CAPABILITIES` only),
        inside the container's limits, no network; its environment is the
        kernel's plus ``env`` (already checked with `kernelgw.models.check_env`),
        its working directory ``cwd`` (an absolute path in the container).
        With ``tty`` (its size) the command gets a terminal: its input is the
        terminal's (``stdin`` is implied) and its output one stream (3), as
        the terminal shows it. Raises :class:`~kernelgw.errors.KernelDied` when
        the container is gone."""
        ...

    async def signal_command(
        self, handle: KernelHandle, pid: int, signum: int, *, session: bool = False, root: bool = False
    ) -> None:
        """Send ``signum`` to the process group of a command `run_command`
        started (``pid``: its `CommandProcess.pid`); nothing if it has ended.
        ``session``: to every process of its session instead (a terminal's,
        whose shell puts each job in a process group of its own). ``root``: the
        command runs as root (only root may signal it)."""
        ...

    async def image_labels(self, image: str) -> dict[str, str] | None:
        """The labels of ``image`` (its Python version, preinstalled packages,
        ...), or None when the engine does not have it."""
        ...

    async def health(self, image: str) -> EngineHealth:
        """Whether the engine answers and ``image`` is present."""
        ...

    async def close(self) -> None:
        """Release engine clients. Does not stop kernels."""
        ...
