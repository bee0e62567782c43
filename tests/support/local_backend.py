"""A :class:`~kernelgw.runtime.backends.base.Backend` that runs each kernel as a
plain host subprocess: real ipykernel, real ZMQ over ``ipc://``, no container.

Why: the session's state machine (queue, interrupt, timeout escalation, death,
restart, fan-out) only needs a kernel that speaks the Jupyter protocol and a
process whose fate can be observed, so it can be tested in seconds without an
engine. It runs user code **unsandboxed on the host**, which is why it lives
under ``tests/`` and never in the package.

Each kernel gets a short temporary directory holding its connection file, its
sockets (``k-1`` ... ``k-5``, as in the Docker backend), IPython's per-user
directories and a ``workspace/`` that is the kernel's working directory. The
image's helper package (``images/python/kernelgw_kernel``) is importable and
pointed at that workspace, so the artifact scan and the file helpers work as
they do in a container. A child kernel (`KernelSpec.host`: an E2B context) is
another such subprocess whose ``workspace`` is a link to its host's: the same
files, as a context shares its sandbox's (Python children only).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import importlib
import json
import os
import secrets
import shutil
import stat
import struct
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from signal import SIGKILL
from types import ModuleType

from kernelgw.errors import BackendError, BadRequest, KernelDied, KernelStartFailed
from kernelgw.kernels import bundle_of
from kernelgw.runtime.backends.base import (
    IPC_PORTS,
    WORKSPACE_DIR,
    CommandStream,
    EngineHealth,
    KernelContainer,
    KernelCounters,
    KernelHandle,
    KernelSpec,
    KernelState,
    TerminalSize,
    connection_info,
)

IMAGE_HELPERS = Path(__file__).resolve().parents[2] / "images" / "python"
"""Holds ``kernelgw_kernel``, the package the image installs next to the kernel."""


@contextlib.contextmanager
def image_helper(name: str) -> Iterator[ModuleType]:
    """``kernelgw_kernel.<name>``, the image's helper module, imported from
    images/python for a unit test of its logic (for a module-scoped fixture)."""
    sys.path.insert(0, str(IMAGE_HELPERS))
    try:
        yield importlib.import_module(f"kernelgw_kernel.{name}")
    finally:
        sys.path.remove(str(IMAGE_HELPERS))


# kernelgw_kernel hard-codes /workspace; point it (and snapshot's default) at ours.
_USE_WORKSPACE = (
    "import sys, kernelgw_kernel as k\n"
    "k.WORKSPACE = sys.argv.pop(1)\n"
    "k.snapshot.__defaults__ = (k.WORKSPACE, k.MAX_WALK)\n"
)
KERNEL_BOOT = _USE_WORKSPACE + "from kernelgw_kernel.launcher import main\nmain()\n"
"""The image's entry point (kernelgw_kernel.launcher with the extension), after _USE_WORKSPACE."""
HELPER_BOOT = _USE_WORKSPACE + "import runpy\nrunpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)\n"
"""Runs ``-m kernelgw_kernel.<helper>`` the way ``exec`` gets it, against the workspace."""


def _proc_counters(pid: int) -> tuple[int, int]:
    """A process's CPU clock ticks (user and system: fields 14 and 15 of
    proc_pid_stat(5)) and resident bytes."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    resident = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return int(fields[11]) + int(fields[12]), resident


@dataclass
class _Kernel:
    process: asyncio.subprocess.Process
    root: Path


class LocalBackend:
    """Kernels as host subprocesses. ``kernels`` maps kernel id to its process,
    so tests can kill one (``kill_kernel``) or check that none is left."""

    def __init__(self, base_dir: Path | None = None, python: str = sys.executable) -> None:
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="kgwl-", dir="/tmp"))
        self.python = python
        self.kernels: dict[str, _Kernel] = {}
        self.started = 0

    # ---------------------------------------------------------------- protocol
    async def start(self, spec: KernelSpec) -> KernelHandle:
        kernel_id = secrets.token_hex(6)
        key = secrets.token_hex(32)
        root = self.base_dir / kernel_id
        workspace = root / "workspace"
        host = self.kernels.get(spec.host.handle.kernel_id) if spec.host is not None else None
        if spec.host is not None:
            if host is None or host.process.returncode is not None:
                raise KernelStartFailed("The sandbox's kernel is not running.")
            if spec.kernel != "python3":
                raise KernelStartFailed(f"the local test backend runs Python children only, not {spec.kernel}")
            root.mkdir(parents=True, mode=0o700)
            workspace.symlink_to(host.root / "workspace")
        else:
            workspace.mkdir(parents=True, mode=0o700)
        connection = connection_info(str(root / "k"), key)
        conn_file = root / "kernel.json"
        conn_file.write_text(json.dumps(connection))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(IMAGE_HELPERS),
            "HOME": str(root / "home"),
            "IPYTHONDIR": str(root / "ipython"),
            "JUPYTER_RUNTIME_DIR": str(root / "jupyter"),
            "MPLBACKEND": "agg",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
            **spec.env,
        }
        try:
            process = await asyncio.create_subprocess_exec(
                self.python,
                "-c",
                KERNEL_BOOT,
                str(workspace),
                "--ext=kernelgw_kernel",
                "-f",
                str(conn_file),
                cwd=workspace,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C in the test terminal is not the kernel's
            )
        except OSError as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise KernelStartFailed(f"could not start a local kernel: {exc}") from exc
        self.kernels[kernel_id] = _Kernel(process, root)
        self.started += 1
        return KernelHandle(
            kernel_id=kernel_id,
            session_id=spec.session_id,
            container_id=spec.host.handle.container_id if spec.host is not None else f"local-{process.pid}",
            conn_dir=root,
            connection=connection,
            host=spec.host.handle.kernel_id if spec.host is not None else None,
        )

    async def stop(self, handle: KernelHandle) -> None:
        kernel = self.kernels.pop(handle.kernel_id, None)
        if kernel is not None:
            if kernel.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    kernel.process.kill()
            await kernel.process.wait()
        await asyncio.to_thread(shutil.rmtree, handle.conn_dir, True)

    async def signal(self, handle: KernelHandle, signum: int) -> None:
        kernel = self.kernels.get(handle.kernel_id)
        if kernel is not None and kernel.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(kernel.process.pid, signum)

    async def counters(self, handle: KernelHandle) -> KernelCounters:
        """The kernel process's own CPU time and resident memory (/proc), as a
        container's cgroup would count them for its one process."""
        kernel = self.kernels.get(handle.kernel_id)
        if kernel is None or kernel.process.returncode is not None:
            raise KernelDied("The local kernel is not running; restart the session.")
        ticks, resident = await asyncio.to_thread(_proc_counters, kernel.process.pid)
        return KernelCounters(
            at=time.monotonic(),
            cpu_ns=ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK"),
            memory_bytes=resident,
            cache_bytes=0,
            memory_limit=None,
        )

    async def state(self, handle: KernelHandle, oom_seen: int = 0) -> KernelState:
        kernel = self.kernels.get(handle.kernel_id)
        if kernel is None:
            return KernelState(status="missing")
        code = kernel.process.returncode
        if code is None:
            return KernelState(status="running")
        return KernelState(status="exited", exit_code=code)  # negative: killed by that signal

    def oom_kills(self, handle: KernelHandle) -> int:
        return 0  # no memory limit here

    async def seal(self, handle: KernelHandle) -> None:
        """The Docker backend's check that the sockets are sockets; nothing to
        take away from the kernel, which runs as the test's own user."""
        for port in IPC_PORTS.values():
            try:
                st = os.lstat(handle.conn_dir / f"k-{port}")
            except FileNotFoundError:
                raise KernelStartFailed(f"The kernel did not create its socket k-{port}.") from None
            if not stat.S_ISSOCK(st.st_mode):
                raise KernelStartFailed(f"k-{port} in the kernel's connection directory is not a socket.")

    async def reap_orphans(self) -> list[str]:
        return []

    async def list_kernels(self) -> list[KernelContainer]:
        return []  # kernel subprocesses die with the test's gateway: nothing to reattach

    async def keep_workspace(self, spec: KernelSpec) -> None:
        """Each kernel has its own workspace directory, removed with it."""

    async def end_session(self, session_id: str) -> None:
        """Each kernel has its own workspace directory, removed with it."""

    async def reap_except(self, keep: set[str]) -> list[str]:
        return []

    async def exec(
        self, handle: KernelHandle, argv: list[str], *, stdin: bool = False, timeout: float = 120.0
    ) -> LocalExec:
        """Run an image helper (``... -m kernelgw_kernel.<helper> ARGS``) as a host
        subprocess against the kernel's workspace; nothing else is supported."""
        kernel = self.kernels.get(handle.kernel_id)
        if kernel is None or kernel.process.returncode is not None:
            raise KernelDied("The local kernel is not running; restart the session.")
        try:
            module = argv[argv.index("-m") + 1]
        except (ValueError, IndexError):
            module = ""
        if not module.startswith("kernelgw_kernel."):
            raise BackendError(f"the local test backend runs only kernelgw_kernel helpers, not {argv!r}")
        rest = argv[argv.index("-m") + 2 :]
        workspace = handle.conn_dir / "workspace"
        process = await asyncio.create_subprocess_exec(
            self.python,
            "-c",
            HELPER_BOOT,
            str(workspace),
            module,
            *rest,
            cwd="/",
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(IMAGE_HELPERS)},
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return LocalExec(process, timeout)

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
    ) -> LocalCommand | LocalTerminal:
        """A user's command as a host subprocess in its own session, in the
        kernel's workspace (``/workspace`` of ``cwd`` mapped to it); with
        ``tty``, on a pseudo-terminal of that size (not its controlling one).
        No root here: a host process is never started as another user."""
        if root:
            raise BadRequest("the local backend runs no command as root")
        kernel = self.kernels.get(handle.kernel_id)
        if kernel is None or kernel.process.returncode is not None:
            raise KernelDied("The local kernel is not running; restart the session.")
        workspace = handle.conn_dir / "workspace"
        rel = cwd[len(WORKSPACE_DIR) :].lstrip("/") if cwd.startswith(WORKSPACE_DIR) else ""
        if argv[:2] == ["/usr/bin/env", "-i"] and "-m" in argv:  # an image helper run as a command (a watch)
            module, rest = argv[argv.index("-m") + 1], argv[argv.index("-m") + 2 :]
            argv = [self.python, "-c", HELPER_BOOT, str(workspace), module, *rest]
            env = {"PYTHONPATH": str(IMAGE_HELPERS)}
        environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workspace), **env}
        if tty is not None:
            return await LocalTerminal.start(argv, str(workspace / rel), environ, tty)
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(workspace / rel),
            env=environ,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        return LocalCommand(process)

    async def signal_command(
        self, handle: KernelHandle, pid: int, signum: int, *, session: bool = False, root: bool = False
    ) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signum)
        for name in await asyncio.to_thread(os.listdir, "/proc") if session else ():
            with contextlib.suppress(ValueError, OSError):
                if os.getsid(int(name)) == pid:
                    os.kill(int(name), signum)

    async def image_labels(self, image: str) -> dict[str, str] | None:
        if bundle_of(image) is not None:
            return None  # a bundle's other kernels (Deno, R, Java) are not on this host
        version = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
        return {"kernelgw.python": version}

    async def health(self, image: str) -> EngineHealth:
        return EngineHealth(engine=True, image=True)

    async def close(self) -> None:
        """Like the Docker backend: kernels are the sessions' to stop. Removes
        the base directory once it is empty."""
        with contextlib.suppress(OSError):
            self.base_dir.rmdir()

    # ---------------------------------------------------------------- for tests
    def running(self) -> list[str]:
        """Ids of kernels whose process has not exited (or not been reaped yet)."""
        return [kid for kid, k in self.kernels.items() if k.process.returncode is None]

    def kill_kernel(self, handle: KernelHandle, signum: int = SIGKILL) -> None:
        """What an OOM killer or a crash does: the process dies, nobody asked."""
        os.kill(self.kernels[handle.kernel_id].process.pid, signum)

    async def kill_all(self) -> None:
        """Stop every kernel still known, for a fixture's teardown."""
        for kid, kernel in list(self.kernels.items()):
            if kernel.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    kernel.process.kill()
            await kernel.process.wait()
            shutil.rmtree(kernel.root, ignore_errors=True)
            self.kernels.pop(kid, None)
        shutil.rmtree(self.base_dir, ignore_errors=True)


class LocalExec:
    """An image helper's process (see ``ExecProcess``): every read and write waits at most ``timeout``."""

    STDERR_CAP = 64 * 1024

    def __init__(self, process: asyncio.subprocess.Process, timeout: float) -> None:
        self._process = process
        self._timeout = timeout
        self._stderr = bytearray()
        self._stderr_task = asyncio.create_task(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        assert self._process.stderr is not None
        while chunk := await self._process.stderr.read(65536):
            self._stderr += chunk[: max(0, self.STDERR_CAP - len(self._stderr))]

    async def _bounded(self, aw: object) -> object:
        try:
            async with asyncio.timeout(self._timeout):
                return await aw  # type: ignore[misc]
        except TimeoutError:
            raise BackendError(f"A helper did not answer within {self._timeout:g}s.") from None
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise BackendError(f"The connection to a helper broke: {exc}") from exc

    @property
    def stderr(self) -> bytes:
        return bytes(self._stderr)

    async def write(self, data: bytes) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(data)
        await self._bounded(self._process.stdin.drain())

    async def close_stdin(self) -> None:
        if self._process.stdin is not None and not self._process.stdin.is_closing():
            self._process.stdin.close()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await self._process.stdin.wait_closed()

    async def read(self) -> bytes:
        assert self._process.stdout is not None
        data = await self._bounded(self._process.stdout.read(1 << 20))
        assert isinstance(data, bytes)
        return data

    async def exit_code(self) -> int | None:
        try:
            async with asyncio.timeout(1):
                return await self._process.wait()
        except TimeoutError:
            return None

    async def close(self) -> None:
        if self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        await self._process.wait()
        await self._stderr_task


class LocalCommand:
    """A `CommandProcess` over a host subprocess (stdout and stderr read by two tasks)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self._queue: asyncio.Queue[tuple[CommandStream, bytes] | None] = asyncio.Queue(maxsize=4)
        self._tasks = [
            asyncio.create_task(self._pump(1, process.stdout)),
            asyncio.create_task(self._pump(2, process.stderr)),
        ]
        self._ended = 0

    @property
    def pid(self) -> int:
        return self.process.pid

    async def _pump(self, stream: CommandStream, reader: asyncio.StreamReader | None) -> None:
        if reader is not None:
            while chunk := await reader.read(64 * 1024):
                await self._queue.put((stream, chunk))
        await self._queue.put(None)

    async def read(self) -> tuple[CommandStream, bytes] | None:
        while self._ended < 2:
            item = await self._queue.get()
            if item is not None:
                return item
            self._ended += 1
        return None

    async def write(self, data: bytes) -> None:
        if self.process.stdin is None:
            raise BackendError("The command has no stdin.")
        try:
            self.process.stdin.write(data)
            await self.process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise BackendError(f"The command's stdin is closed: {exc}") from exc

    async def close_stdin(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()

    async def resize(self, size: TerminalSize) -> None:
        raise BackendError("The command has no terminal to resize.")

    async def exit_code(self) -> int | None:
        return await self.process.wait()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, SIGKILL)
            await self.process.wait()


class LocalTerminal:
    """A `CommandProcess` with a terminal: a host subprocess on a pseudo-terminal
    whose master the event loop reads and writes (non-blocking)."""

    def __init__(self, process: asyncio.subprocess.Process, master: int) -> None:
        self.process = process
        self.master = master
        self._closed = False

    @classmethod
    async def start(cls, argv: list[str], cwd: str, env: dict[str, str], size: TerminalSize) -> LocalTerminal:
        master, slave = os.openpty()
        try:
            _set_size(master, size)
            os.set_blocking(master, False)
            process = await asyncio.create_subprocess_exec(
                *argv, cwd=cwd, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return cls(process, master)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def _ready(self, add: str, remove: str) -> None:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        getattr(loop, add)(self.master, ready.set_result, None)
        try:
            await ready
        finally:
            getattr(loop, remove)(self.master)

    async def read(self) -> tuple[CommandStream, bytes] | None:
        while not self._closed:
            try:
                data = os.read(self.master, 64 * 1024)
            except BlockingIOError:
                await self._ready("add_reader", "remove_reader")
                continue
            except OSError as exc:
                if exc.errno == errno.EIO:  # every holder of the terminal's other side is gone
                    return None
                raise BackendError(f"The terminal broke: {exc}") from exc
            return (3, data) if data else None
        return None

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.master, view) :]
            except BlockingIOError:
                await self._ready("add_writer", "remove_writer")
            except OSError as exc:
                raise BackendError(f"The terminal is closed: {exc}") from exc

    async def close_stdin(self) -> None:
        raise BackendError("A terminal's input cannot be closed.")

    async def resize(self, size: TerminalSize) -> None:
        _set_size(self.master, size)

    async def exit_code(self) -> int | None:
        return await self.process.wait()

    async def close(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, SIGKILL)
            await self.process.wait()
        if not self._closed:
            self._closed = True
            os.close(self.master)


def _set_size(fd: int, size: TerminalSize) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size.rows, size.cols, 0, 0))
