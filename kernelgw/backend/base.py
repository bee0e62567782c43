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


@dataclass(frozen=True)
class KernelHandle:
    """A started kernel. ``connection`` is what jupyter_client needs on the host."""

    kernel_id: str
    session_id: str
    container_id: str
    conn_dir: Path
    connection: dict[str, Any]


@dataclass(frozen=True)
class KernelState:
    status: KernelStatus
    oom_killed: bool = False
    exit_code: int | None = None
    error: str | None = None

    @property
    def alive(self) -> bool:
        return self.status == "running"

    def describe(self) -> str:
        """Why the kernel is gone, for a ``done`` event's ``reason``."""
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


class Backend(Protocol):
    """Lifecycle of kernel containers. All methods are coroutines and never block
    the event loop; the session layer is their only caller."""

    async def start(self, spec: KernelSpec) -> KernelHandle:
        """Create the connection directory and the container, return at once.

        Called by a session when it is created or restarted. The kernel may not be
        answering yet; the caller waits for it over ZMQ.
        """
        ...

    async def stop(self, handle: KernelHandle) -> None:
        """Remove the container and its connection directory. Idempotent."""
        ...

    async def signal(self, handle: KernelHandle, signum: int) -> None:
        """Send a signal to the kernel process (SIGINT to interrupt a cell)."""
        ...

    async def state(self, handle: KernelHandle) -> KernelState:
        """Whether the container still runs, and if not, why (OOM, exit code)."""
        ...

    async def reap_orphans(self) -> list[str]:
        """Remove containers and directories of this gateway's name left by a
        previous gateway process. Called once at gateway start-up."""
        ...

    async def health(self, image: str) -> EngineHealth:
        """Whether the engine answers and ``image`` is present."""
        ...

    async def close(self) -> None:
        """Release engine clients. Does not stop kernels."""
        ...
