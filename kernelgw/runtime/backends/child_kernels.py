"""How a child kernel (an E2B context) starts inside a sandbox's container.

A child kernel is one more process in the container of the sandbox's own
kernel, started by ``docker exec`` as the sandbox's uid: the container's cgroup
holds it (memory, CPU and pids stay one unit per sandbox), its network is the
container's (none), its files the sandbox's. It is reached as the main kernel
is, by ipc sockets in a directory of the connection directory the container
has at ``/conn``: ``/conn/c<id>/`` (`child_dir_name`), made by the gateway,
sealed by it once the kernel is ready (`DockerBackend.seal`).

`CHILD_WRAPPER` starts it (behind the backend's own wrapper, which names its
pid, and the drop from root to the sandbox's uid the main kernel gets too): it
enters the context's working directory and leaves a watchdog that kills the
kernel's process group once the gateway's connection to the exec closes (the
gateway stopped the child, or the gateway itself went away): a child kernel
never outlives the gateway process that started it. `ChildKernels` keeps the
children a backend started: their processes, how each ended, and what they
last wrote to stderr (to name a death).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from kernelgw.errors import KernelStartFailed
from kernelgw.kernels import BUNDLE_START_DIR, DEFAULT_KERNEL, bundle_of, image_kernels
from kernelgw.runtime.backends.base import CommandProcess, KernelHandle, KernelSpec, KernelState, connection_info

log = logging.getLogger(__name__)

T = TypeVar("T")

CHILD_CONN_PREFIX = "c"
CWD_MISSING_EXIT = 97
"""The wrapper's exit code when the working directory cannot be entered."""
CHILD_WRAPPER = (
    'cd -- "$1" 2>/dev/null || {\n'
    "  printf 'kernelgw: the working directory %s does not exist or cannot be entered\\n' \"$1\" >&2\n"
    f"  exit {CWD_MISSING_EXIT}\n"
    "}\n"
    "shift\n"
    "exec 3<&0 </dev/null\n"
    # the watchdog: stdin is the gateway's connection; at its end, the whole group goes
    '(while read -r _ <&3; do :; done; kill -s KILL -- "-$$") </dev/null >/dev/null 2>&1 &\n'
    'exec "$@" 3<&-\n'
)
"""``/bin/sh -c`` this, then ``sh``, the working directory and the kernel's argv
(``exec`` throughout: the kernel keeps the exec's pid)."""

PYTHON_START = (
    'mkdir -p "$HOME" "$MPLCONFIGDIR" "$IPYTHONDIR" "$JUPYTER_RUNTIME_DIR"\n'
    'if [ -d /opt/kernelgw/mplcache ]; then cp -R /opt/kernelgw/mplcache/. "$MPLCONFIGDIR/" 2>/dev/null || true; fi\n'
    "exec /opt/kernel/bin/python -P -m kernelgw_kernel.launcher --ext=kernelgw_kernel "
    '--HistoryManager.hist_file=:memory: -f "$1"\n'
)
"""The Python image's ``start-kernel`` (images/python/start-kernel), which a
language image replaced by its own: the Python kernel of any kernelgw image."""
IMAGE_START = "/opt/kernelgw/start-kernel"
"""The image's own kernel's entry point."""


class KernelNotInImage(ValueError):
    """A child kernel of a language its sandbox's image does not hold."""


def child_dir_name(kernel_id: str) -> str:
    """The child's directory in its host's connection directory (short: a socket
    path has at most 107 bytes)."""
    return CHILD_CONN_PREFIX + kernel_id


def kernel_argv(kernel: str, image_kernel: str, connection_file: str, image: str | None = None) -> list[str]:
    """The argv that starts ``kernel`` in a container of ``image`` (made for
    ``image_kernel``), on ``connection_file`` (a path in the container)."""
    held = image_kernels(image_kernel, image)
    if kernel not in held:
        raise KernelNotInImage(f"the {image or image_kernel} image holds {' and '.join(held)} kernels, not {kernel}")
    if kernel == image_kernel:
        return [IMAGE_START, connection_file]
    if bundle_of(image) is not None:
        return [f"{BUNDLE_START_DIR}/{kernel}/start-kernel", connection_file]
    assert kernel == DEFAULT_KERNEL
    return ["/bin/sh", "-c", PYTHON_START, "sh", connection_file]


def wrapped(argv: list[str], cwd: str) -> list[str]:
    """``argv`` behind `CHILD_WRAPPER`, in ``cwd``."""
    return ["/bin/sh", "-c", CHILD_WRAPPER, "sh", cwd, *argv]


MAX_SOCKET_PATH = 107
"""sun_path is 108 bytes including the terminating NUL."""
TAIL_BYTES = 4096
"""What a child kernel wrote to stderr last, kept to name its death."""
CONTAINER_STOPPED = "the sandbox's container stopped: its main kernel ended or the sandbox was removed"
STOP_WAIT_S = 5.0
"""How long a stop waits for a killed child's exec to end."""


class OnThreads(Protocol):
    """Runs a blocking call off the event loop."""

    def __call__(self, fn: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


class ChildOps(Protocol):
    """What `ChildKernels` needs of its backend's engine."""

    async def start_process(self, host: KernelHandle, argv: list[str], env: dict[str, str]) -> CommandProcess:
        """Start ``argv`` in ``host``'s container as the kernel does (the sandbox's
        uid, no capabilities), with ``env`` over the container's, its stdin the
        gateway's connection, its pid known."""
        ...

    async def signal_process(self, host: KernelHandle, pid: int, signum: int, *, group: bool) -> None:
        """Send ``signum`` to ``pid`` in ``host``'s container (``group``: its process group)."""
        ...

    async def host_running(self, host: KernelHandle) -> bool:
        """Whether ``host``'s container still runs."""
        ...


@dataclass(eq=False)
class ChildKernel:
    """One started child kernel: its process and, once it ended, how."""

    handle: KernelHandle
    host: KernelHandle
    process: CommandProcess
    tail: bytes = b""
    exit_code: int | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    reader: asyncio.Task[None] | None = None

    async def read_out(self) -> None:
        """Drain its output (nobody reads a kernel's stdout; a full pipe would
        stop it), keeping stderr's last bytes, until the exec ends."""
        try:
            while (item := await self.process.read()) is not None:
                stream, data = item
                if stream == 2:
                    self.tail = (self.tail + data)[-TAIL_BYTES:]
        except Exception as exc:
            log.info("child kernel %s: its output broke off: %s", self.handle.kernel_id, exc)
        finally:
            with contextlib.suppress(Exception):
                self.exit_code = await self.process.exit_code()
            self.ended.set()

    def last_words(self) -> str | None:
        """The last line it wrote to stderr, if any (short)."""
        lines = [line.strip() for line in self.tail.decode("utf-8", "replace").splitlines() if line.strip()]
        return lines[-1][:300] if lines else None


class ChildKernels:
    """The child kernels one backend started, by kernel id."""

    def __init__(self, ops: ChildOps, run: OnThreads, ids: Callable[[str], tuple[int, int]]) -> None:
        self._ops = ops
        self._run = run
        self._ids = ids
        """A session's uid and gid (blocking)."""
        self._children: dict[str, ChildKernel] = {}

    def __contains__(self, kernel_id: object) -> bool:
        return kernel_id in self._children

    async def start(self, spec: KernelSpec, container_conn_dir: str) -> KernelHandle:
        """Start ``spec``'s kernel in its host's container; returns once its process
        runs (the caller waits for the kernel over ZMQ, as for any kernel)."""
        host = spec.host
        assert host is not None
        kernel_id = secrets.token_hex(4)
        name = child_dir_name(kernel_id)
        try:
            argv = kernel_argv(spec.kernel, host.image_kernel, f"{container_conn_dir}/{name}/kernel.json", spec.image)
        except KernelNotInImage as exc:
            raise KernelStartFailed(f"No {spec.kernel} kernel in this sandbox: {exc}.") from None
        if not await self._ops.host_running(host.handle):
            raise KernelStartFailed("The sandbox's kernel container is not running; restart the sandbox's kernel.")
        key = secrets.token_hex(32)
        conn_dir = host.handle.conn_dir / name
        socket = str(conn_dir / "k-5")
        if len(socket.encode()) > MAX_SOCKET_PATH:
            raise KernelStartFailed(
                f"A child kernel's socket path ({socket}) would exceed {MAX_SOCKET_PATH} bytes; "
                "choose a shorter runtime_dir or gateway_name."
            )
        uid, gid = await self._run(self._ids, spec.session_id)
        await self._run(make_child_dir, host.handle.conn_dir, name, key, container_conn_dir, uid, gid)
        try:
            # the session's env: a pooled sandbox's container started without it
            process = await self._ops.start_process(host.handle, wrapped(argv, host.cwd), dict(spec.env))
        except BaseException:
            await self._run(shutil.rmtree, conn_dir, True)
            raise
        handle = KernelHandle(
            kernel_id=kernel_id,
            session_id=spec.session_id,
            container_id=host.handle.container_id,
            conn_dir=conn_dir,
            connection=connection_info(str(conn_dir / "k"), key),
            host=host.handle.kernel_id,
        )
        child = self._children[kernel_id] = ChildKernel(handle, host.handle, process)
        child.reader = asyncio.create_task(child.read_out(), name=f"child-kernel-{kernel_id}")
        return handle

    async def stop(self, handle: KernelHandle) -> None:
        """Kill the child's process group (nothing else of the container), wait for
        its exec to end, remove its directory. Idempotent."""
        child = self._children.pop(handle.kernel_id, None)
        try:
            if child is not None:
                # its container gone, the process is too (and gVisor may never end the exec's stream)
                if not child.ended.is_set() and await self._ops.host_running(child.host):
                    with contextlib.suppress(Exception):  # the container may stop meanwhile
                        await self._ops.signal_process(child.host, child.process.pid, signal.SIGKILL, group=True)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(STOP_WAIT_S):
                            await child.ended.wait()
                await child.process.close()  # the watchdog kills what is left of the group
                if child.reader is not None:
                    child.reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await child.reader
        finally:
            await self._run(shutil.rmtree, handle.conn_dir, True)

    async def signal(self, handle: KernelHandle, signum: int) -> None:
        """``signum`` to the kernel's process only (an interrupt is the kernel's to
        pass on, as the main kernel's init passes the container's on)."""
        child = self._children.get(handle.kernel_id)
        if child is None or child.ended.is_set():
            return
        try:
            await self._ops.signal_process(child.host, child.process.pid, signum, group=False)
        except Exception as exc:
            log.info("signal %s to child kernel %s failed: %s", signum, handle.kernel_id, exc)

    async def state(self, handle: KernelHandle) -> KernelState:
        """Running while its exec and its container run (asked of the engine, as a
        main kernel's state is); else how it ended, and why when known (its
        container stopped: the sandbox's main kernel ended or was removed)."""
        child = self._children.get(handle.kernel_id)
        if child is None:
            return KernelState(status="missing", detail="the context's kernel was stopped by the gateway")
        host_running = await self._ops.host_running(child.host)
        if not child.ended.is_set():
            if host_running:
                return KernelState(status="running")
            # the container is gone and the exec has not said so (gVisor keeps its stream open)
            return KernelState(status="missing", detail=CONTAINER_STOPPED)
        detail = child.last_words() if host_running else CONTAINER_STOPPED
        return KernelState(status="exited", exit_code=child.exit_code, detail=detail)

    async def close(self) -> None:
        """Drop every connection (the watchdogs end the kernels)."""
        for child in list(self._children.values()):
            with contextlib.suppress(Exception):
                await child.process.close()
            if child.reader is not None:
                child.reader.cancel()
        self._children.clear()


def make_child_dir(host_dir: Path, name: str, key: str, container_conn_dir: str, uid: int, gid: int) -> Path:
    """The child's directory in its host's connection directory, with its
    connection file, both the sandbox uid's until `seal` (blocking). The host's
    sealed directory (root's, 0700) becomes 0711: the uid may pass through to
    its child's directory, and still add, rename or list nothing there."""
    directory = host_dir / name
    root = os.geteuid() == 0
    if root:
        os.chmod(host_dir, 0o711)
    directory.mkdir(mode=0o700)
    conn_file = directory / "kernel.json"
    fd = os.open(conn_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(connection_info(f"{container_conn_dir}/{name}/k", key), f)
    if root:
        os.chown(conn_file, uid, gid)
        os.chown(directory, uid, gid)
    return directory
