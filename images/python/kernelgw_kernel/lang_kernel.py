"""The shared base of kernelgw's own kernels for languages that have no Jupyter
kernel installable offline (Go, C++, Ruby): ipykernel's ``Kernel`` base class
(the "wrapper kernel" pattern) around child processes.

What every such kernel gets from here:

- :meth:`LangKernel.run_process` starts a child in its own process group
  (session) with its stdout and stderr on pipes the event loop reads as data
  arrives: the output is published as ``stream`` messages while the program
  runs, not after it ended. When the child exits, whatever is left of its
  process group is killed, so a program's background children cannot keep a
  cell open.
- Interrupts: the kernel's own SIGINT handler (the gateway signals the
  container, the shim forwards it; an ``interrupt_request`` on the control
  channel makes ipykernel signal the kernel too) asks the subclass to stop what
  runs (:meth:`LangKernel.interrupt_child`; compiled programs are killed with
  their whole process group), and the cell ends with a ``KeyboardInterrupt``
  error. The kernel itself stays up.
- Errors are Jupyter errors: a subclass raises :class:`CellError` (``ename``,
  ``evalue``, ``traceback``) and the base publishes the ``error`` message and an
  ``execute_reply`` with status ``error``.
- :func:`launch` starts the kernel with the same socket high-water marks and
  message packer as kernelgw's Python kernel (see launcher.py).

Standard library, ipykernel and pyzmq only, like the rest of kernelgw_kernel.
"""

from __future__ import annotations

import asyncio
import codecs
import errno
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipykernel.kernelbase import Kernel

READ_CHUNK = 64 * 1024
MAX_READ_PER_WAKEUP = 1024 * 1024
"""Bytes read from one pipe per wake-up before the loop serves others; what was
read goes out as one ``stream`` message, so a flood makes few large messages."""
TAIL_CHARS = 16 * 1024
"""The end of a program's stderr, kept to name its error (a Go panic, an
uncaught C++ exception)."""
MAX_CAPTURE_CHARS = 256 * 1024
"""A compiler's output kept for the error's traceback."""
MAX_TRACEBACK_LINES = 200
EOF_GRACE_S = 1.0
"""After a child and its process group are gone, how long to wait for the ends
of its pipes (only a process that left the group can still hold them)."""
GROUP_GONE_S = 5.0
"""How long a cell's end waits for the killed processes of its group to be
reaped (`group_gone`); then it ends anyway."""


@dataclass
class CellError(Exception):
    """A failed cell, as Jupyter shows it."""

    ename: str
    evalue: str
    traceback: list[str] = field(default_factory=list)

    def content(self) -> dict[str, Any]:
        return {"ename": self.ename, "evalue": self.evalue, "traceback": cap_lines(self.traceback)}


def interrupted_error(what: str = "the cell") -> CellError:
    return CellError("KeyboardInterrupt", f"{what} was interrupted", [f"KeyboardInterrupt: {what} was interrupted"])


def cap_lines(lines: Sequence[str], limit: int = MAX_TRACEBACK_LINES) -> list[str]:
    """At most ``limit`` lines: the first ones, a note, and the last one."""
    lines = list(lines)
    if len(lines) <= limit:
        return lines
    return [*lines[: limit - 2], f"... [{len(lines) - limit + 1} lines cut]", lines[-1]]


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_error(returncode: int, interrupted: bool = False) -> CellError:
    """The error of a program that ended with ``returncode`` (negative: killed by
    that signal), for when nothing better is known."""
    if returncode < 0:
        name = signal_name(-returncode)
        evalue = f"the program was killed by {name} (signal {-returncode})"
        if -returncode == signal.SIGKILL and not interrupted:
            evalue += "; out of memory?"
        return CellError("Signal", evalue, [f"Signal: {evalue}"])
    evalue = f"the program exited with code {returncode}"
    return CellError("ExitCode", evalue, [f"ExitCode: {evalue}"])


class Tail:
    """The last ``limit`` characters written to it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0

    def add(self, text: str) -> None:
        self.parts.append(text)
        self.size += len(text)
        if self.size > 2 * self.limit:
            self.parts = [self.text()]
            self.size = len(self.parts[0])

    def text(self) -> str:
        return "".join(self.parts)[-self.limit :]


class Capture:
    """Everything written to it up to ``limit`` characters (a compiler's output)."""

    def __init__(self, limit: int = MAX_CAPTURE_CHARS) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.cut = 0

    def __call__(self, name: str, text: str) -> None:
        room = self.limit - self.size
        if room <= 0:
            self.cut += len(text)
            return
        self.parts.append(text[:room])
        self.size += min(room, len(text))
        self.cut += max(0, len(text) - room)

    def text(self) -> str:
        out = "".join(self.parts)
        if self.cut:
            out += f"\n... [{self.cut} characters cut]\n"
        return out


Sink = Callable[[str, str], None]
"""Where a child's output goes: ``sink(name, text)`` with name stdout or stderr."""


class OutputPump:
    """Reads pipes (non-blocking) when the event loop says they are readable and
    hands decoded text to ``sink`` at once. :meth:`drain` reads what is in them
    right now, for when order against another channel matters."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fds: dict[str, int], sink: Sink) -> None:
        self.loop = loop
        self.sink = sink
        self.fds = dict(fds)
        self.decoders = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in fds}
        self.done: dict[str, asyncio.Future[None]] = {}
        for name, fd in self.fds.items():
            os.set_blocking(fd, False)
            self.done[name] = loop.create_future()
            loop.add_reader(fd, self._readable, name)

    def _readable(self, name: str) -> None:
        self._read(name, MAX_READ_PER_WAKEUP)

    def _read(self, name: str, limit: int | None) -> None:
        fd = self.fds.get(name)
        if fd is None:
            return
        chunks: list[bytes] = []
        total = 0
        eof = False
        while limit is None or total < limit:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                eof = True
                break
            if not chunk:
                eof = True
                break
            chunks.append(chunk)
            total += len(chunk)
        decoder = self.decoders[name]
        text = decoder.decode(b"".join(chunks), final=eof)
        if text:
            self.sink(name, text)
        if eof:
            self._close(name)

    def _close(self, name: str) -> None:
        fd = self.fds.pop(name, None)
        if fd is None:
            return
        self.loop.remove_reader(fd)
        os.close(fd)
        if not self.done[name].done():
            self.done[name].set_result(None)

    def drain(self) -> None:
        """Read and hand on everything the pipes hold now."""
        for name in list(self.fds):
            self._read(name, None)

    async def finish(self, timeout: float) -> None:
        """Wait for the end of every pipe (at most ``timeout`` seconds), then
        hand on what is left and close them."""
        pending = [f for f in self.done.values() if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        self.close()

    def close(self) -> None:
        self.drain()
        for name in list(self.fds):
            fd = self.fds[name]
            text = self.decoders[name].decode(b"", final=True)
            if text:
                self.sink(name, text)
            self.loop.remove_reader(fd)
            os.close(fd)
            del self.fds[name]
            if not self.done[name].done():
                self.done[name].set_result(None)


def kill_group(pgid: int, signum: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


async def group_gone(pgid: int, timeout: float = GROUP_GONE_S) -> bool:
    """Wait until no process of the group ``pgid`` is left, zombies included.
    Killed processes count against the pids limit until the container's init
    reaps them: a fork bomb a cell left behind, killed with its group, made the
    next cell's compiler fail to start (EAGAIN) a few milliseconds later."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return True
        if asyncio.get_running_loop().time() >= deadline:
            return False
        await asyncio.sleep(0.01)


def spawn(
    argv: Sequence[str], *, cwd: str, env: dict[str, str], pass_fds: Sequence[int] = ()
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start ``argv`` in a new session (its own process group) with stdin from
    /dev/null; returns the process and the read ends of its stdout and stderr."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return proc, out_r, err_r


def check_exec_mount(path: str, mounts_text: str | None = None) -> str | None:
    """A note when ``path`` lies on a file system mounted ``noexec`` (compiled
    programs could not run from it), else None. ``mounts_text``: /proc/self/mounts."""
    if mounts_text is None:
        try:
            mounts_text = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    mounts = mounts_text.splitlines()
    best = ""
    options: list[str] = []
    target = os.path.realpath(path)
    for line in mounts:
        parts = line.split()
        if len(parts) < 4:
            continue
        point = parts[1].replace("\\040", " ")
        if (target == point or target.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, options = point, parts[3].split(",")
    if "noexec" in options:
        return f"{best} is mounted noexec: programs built in {path} cannot run (the image needs /tmp mounted exec)"
    return None


class LangKernel(Kernel):
    """A kernel whose cells run in child processes. Subclasses set the class
    attributes and implement :meth:`run_cell`."""

    implementation = "kernelgw"
    implementation_version = "1.0"
    language_name = ""
    stateful = False
    """Whether variables and definitions persist between cells (said in the
    banner and in ``language_info``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]
        self.workdir = os.getcwd()
        base = os.environ.get("KERNELGW_BUILD_DIR") or tempfile.gettempdir()
        os.makedirs(base, exist_ok=True)
        self.build_dir = tempfile.mkdtemp(prefix=f"kernelgw-{self.language_name or 'lang'}-", dir=base)
        self._child: subprocess.Popen[bytes] | None = None
        self._interrupted = False
        self._running_cell = False
        self._silent = False
        self._cell_parent: dict[str, Any] = {}

    # ------------------------------------------------------------ kernel info
    @property
    def language_info(self) -> dict[str, Any]:  # type: ignore[override]  # ipykernel: a plain attribute
        raise NotImplementedError

    @property
    def banner(self) -> str:  # type: ignore[override]  # ipykernel: a plain attribute
        raise NotImplementedError

    # ---------------------------------------------------------------- signals
    def start(self) -> None:
        super().start()  # type: ignore[no-untyped-call]
        # ipykernel ignores SIGINT outside handlers and raises KeyboardInterrupt in
        # them; ours only stops what the cell runs (the event loop goes on)
        signal.signal(signal.SIGINT, self._on_sigint)

    def pre_handler_hook(self) -> None:
        pass

    def post_handler_hook(self) -> None:
        pass

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if not self._running_cell:
            return
        self._interrupted = True
        child = self._child
        if child is not None and child.returncode is None:
            self.interrupt_child(child)

    def interrupt_child(self, child: subprocess.Popen[bytes]) -> None:
        """Stop the child a cell waits for (called in the SIGINT handler). By
        default: kill its whole process group."""
        kill_group(child.pid)

    # ----------------------------------------------------------------- output
    def publish(self, msg_type: str, content: dict[str, Any]) -> None:
        """An iopub message of the running (or the last) cell. The parent is the
        one :meth:`do_execute` noted: ipykernel keeps it in a context variable,
        which event-loop callbacks registered earlier (a Ruby process's pipes)
        do not see."""
        assert self.session is not None  # set by the kernel app before any cell
        self.session.send(self.iopub_socket, msg_type, content, parent=self._cell_parent, ident=self._topic(msg_type))  # type: ignore[no-untyped-call]

    def publish_stream(self, name: str, text: str) -> None:
        if self._silent or not text:
            return
        self.publish("stream", {"name": name, "text": text})

    def publish_display(self, data: dict[str, Any], metadata: dict[str, Any] | None = None) -> None:
        if self._silent:
            return
        self.publish("display_data", {"data": data, "metadata": metadata or {}, "transient": {}})

    def publish_result(self, data: dict[str, Any], metadata: dict[str, Any] | None = None) -> None:
        if self._silent:
            return
        self.publish(
            "execute_result", {"execution_count": self.execution_count, "data": data, "metadata": metadata or {}}
        )

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("JPY_PARENT_PID", "JPY_SESSION_NAME", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"):
            env.pop(name, None)
        return env

    # -------------------------------------------------------------- processes
    async def run_process(
        self,
        argv: Sequence[str],
        *,
        sink: Sink,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> int:
        """Run ``argv`` to its end, its output going to ``sink`` as it comes;
        returns its exit status (negative: the signal that killed it). An
        interrupt kills it (see :meth:`interrupt_child`); check
        ``self._interrupted`` afterwards."""
        loop = asyncio.get_running_loop()
        proc, out_r, err_r = spawn(argv, cwd=cwd or self.workdir, env=env if env is not None else self.child_env())
        pump = OutputPump(loop, {"stdout": out_r, "stderr": err_r}, sink)
        self._child = proc
        try:
            if self._interrupted:  # the interrupt came while the child was being started
                self.interrupt_child(proc)
            returncode = await loop.run_in_executor(None, proc.wait)
        finally:
            self._child = None
            kill_group(proc.pid)  # what the program left running in its group
            await pump.finish(EOF_GRACE_S)
            if proc.returncode is None:
                proc.kill()
                proc.wait()
            await group_gone(proc.pid)
        return returncode

    # -------------------------------------------------------------- execution
    async def run_cell(self, code: str) -> None:
        """Run one cell; raise :class:`CellError` when it fails."""
        raise NotImplementedError

    async def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        self._silent = silent
        self._cell_parent = self.get_parent("shell")  # type: ignore[no-untyped-call]
        self._interrupted = False
        self._running_cell = True
        error: CellError | None = None
        try:
            if code.strip():
                await self.run_cell(code)
            if self._interrupted:
                error = interrupted_error()
        except CellError as exc:
            error = exc
        except Exception as exc:  # a bug of the kernel, not of the cell: say so, keep running
            self.log.exception("the kernel failed running a cell")
            error = CellError(
                "KernelError", f"{type(exc).__name__}: {exc}", [f"KernelError: {type(exc).__name__}: {exc}"]
            )
        finally:
            self._running_cell = False
        expressions = {
            name: {
                "status": "error",
                "ename": "NotImplementedError",
                "evalue": f"user_expressions are not evaluated by the {self.language_name} kernel",
                "traceback": [],
            }
            for name in (user_expressions or {})
        }
        if error is not None:
            content = error.content()
            if not silent:
                self.publish("error", content)
            return {
                "status": "error",
                "execution_count": self.execution_count,
                "user_expressions": expressions,
                **content,
            }
        return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": expressions}

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        self.cleanup()
        return {"status": "ok", "restart": restart}

    def cleanup(self) -> None:
        child = self._child
        if child is not None and child.returncode is None:
            kill_group(child.pid)
        shutil.rmtree(self.build_dir, ignore_errors=True)


class CompiledKernel(LangKernel):
    """Compile-and-run per cell: each cell is a complete program. Subclasses give
    the source file name, the compiler's argv and how to read its errors."""

    source_name = "main"
    program_name = "prog"

    def prepare_source(self, code: str) -> str:
        return code

    def compile_argv(self) -> list[str]:
        raise NotImplementedError

    def compile_env(self) -> dict[str, str]:
        return self.child_env()

    def compile_error(self, output: str) -> CellError:
        raise NotImplementedError

    def compile_warnings(self, output: str) -> str:
        """What of a successful compile's output to show (on stderr)."""
        return output

    def runtime_error(self, returncode: int, stderr_tail: str) -> CellError:
        return exit_error(returncode, self._interrupted)

    def write_source(self, code: str) -> Path:
        """Write the cell's source file, remove the last program; returns the
        program's path (small files on a tmpfs: no need to leave the loop)."""
        Path(self.build_dir, self.source_name).write_text(self.prepare_source(code), encoding="utf-8")
        program = Path(self.build_dir, self.program_name)
        program.unlink(missing_ok=True)
        return program

    async def compile_step(self, argv: list[str]) -> tuple[int, str]:
        """Run one step of the build in the build directory; its exit status and
        its output (stdout and stderr together)."""
        capture = Capture()
        try:
            status = await self.run_process(argv, sink=capture, cwd=self.build_dir, env=self.compile_env())
        except OSError as exc:
            raise CellError("CompilerMissing", str(exc), [f"CompilerMissing: {exc}"]) from exc
        if self._interrupted:
            raise interrupted_error("the compilation")
        return status, capture.text()

    async def build(self) -> None:
        """Build the program from the source file (raise :class:`CellError` when
        that fails); by default one step, :meth:`compile_argv`."""
        status, output = await self.compile_step(self.compile_argv())
        if status != 0:
            raise self.compile_error(output)
        warnings = self.compile_warnings(output)
        if warnings.strip():
            self.publish_stream("stderr", warnings)

    async def run_cell(self, code: str) -> None:
        program = self.write_source(code)
        await self.build()
        tail = Tail(TAIL_CHARS)

        def sink(name: str, text: str) -> None:
            if name == "stderr":
                tail.add(text)
            self.publish_stream(name, text)

        try:
            status = await self.run_process([str(program)], sink=sink)
        except PermissionError as exc:
            note = check_exec_mount(self.build_dir) or str(exc)
            raise CellError("ExecError", note, [f"ExecError: {note}"]) from exc
        if self._interrupted:
            raise interrupted_error("the program")
        if status != 0:
            raise self.runtime_error(status, tail.text())


def launch(kernel_class: type[LangKernel]) -> None:
    """Run ``kernel_class`` as ``python -m kernelgw_kernel.lang_X -f CONNECTION_FILE``,
    with the send HWMs and the packer of kernelgw's Python kernel."""
    from kernelgw_kernel.launcher import launch_app

    launch_app(kernel_class=kernel_class, capture_fd_output=False)
