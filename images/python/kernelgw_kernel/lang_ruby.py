"""kernelgw's Ruby kernel: stateful, like irb. One Ruby process per kernel
evaluates every cell in the same binding, so local variables, methods, classes
and required libraries persist between cells.

``python -m kernelgw_kernel.lang_ruby -f CONNECTION_FILE``

The Ruby side is ``kernelgw_driver.rb`` (images/ruby/, installed in
/opt/kernelgw/ruby): it reads one JSON line per cell from a pipe and writes JSON
records (ready, display, done) to another; the cell's stdout and stderr are the
Ruby process's own, streamed as they come. A cell's value is its
``execute_result`` (its ``inspect``, or HTML for ``IRuby.table``/``IRuby.html``
and objects with ``to_html``), except ``nil`` and cells ending with ``;``.

An interrupt sends SIGINT to the Ruby process group: Ruby raises ``Interrupt``
in the running cell and keeps its state. A cell that ignores it is killed at the
second interrupt (after :data:`KILL_AFTER_S`), which loses the state. A Ruby
process that exits (``exit!``, ``exec``) or dies (a kill, out of memory) under a
cell ends this kernel the same way (`kernelgw_kernel.ending`): the cell ends
``dead`` with the cause and ``state_lost``, as Python's does.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import time
from typing import Any

from kernelgw_kernel.ending import end_as, fence
from kernelgw_kernel.lang_kernel import CellError, LangKernel, OutputPump, kill_group, launch, spawn

DRIVER = os.environ.get("KERNELGW_RUBY_DRIVER", "/opt/kernelgw/ruby/kernelgw_driver.rb")
READY_TIMEOUT_S = 30.0
KILL_AFTER_S = 2.0
"""A second interrupt this long after the first kills a cell that ignored it."""
MAX_RECORD_BYTES = 64 * 1024 * 1024


class RubyProcess:
    """The Ruby driver process, its pipes and the records it sent."""

    def __init__(self, proc: subprocess.Popen[bytes], code_fd: int, record_fd: int, out_fd: int, err_fd: int) -> None:
        self.proc = proc
        self.code_fd = code_fd
        self.record_fd = record_fd
        self.out_fd = out_fd
        self.err_fd = err_fd
        self.buffer = b""
        self.pump: OutputPump | None = None
        """Owns out_fd and err_fd once made."""
        self.reading = False
        """Whether the event loop watches record_fd."""
        self.ready: dict[str, Any] = {}
        self.closed = False


class RubyKernel(LangKernel):
    implementation = "kernelgw-ruby"
    language_name = "ruby"
    stateful = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ruby: RubyProcess | None = None
        self.version = ""
        self.description = ""
        self._waiter: asyncio.Future[dict[str, Any]] | None = None
        self._first_interrupt = 0.0
        self._start_error = ""

    @property
    def language_info(self) -> dict[str, Any]:  # type: ignore[override]  # ipykernel: a plain attribute
        return {
            "name": "ruby",
            "version": self.version,
            "mimetype": "text/x-ruby",
            "file_extension": ".rb",
            "codemirror_mode": "ruby",
            "pygments_lexer": "ruby",
        }

    @property
    def banner(self) -> str:  # type: ignore[override]  # ipykernel: a plain attribute
        return (
            f"{self.description or 'Ruby'} (kernelgw): one Ruby process keeps its state between cells "
            "(variables, methods, classes), like irb. IRuby.display, IRuby.html and IRuby.table show rich output."
        )

    # ---------------------------------------------------------------- process
    def start(self) -> None:
        super().start()
        try:
            self.start_ruby()
        except (OSError, CellError) as exc:
            self._start_error = str(exc)
            self.log.error("Ruby did not start: %s", exc)

    def start_ruby(self) -> None:
        """Start the driver and wait for its ready record (so the first cell is
        fast and kernel_info knows Ruby's version)."""
        code_r, code_w = os.pipe()
        rec_r, rec_w = os.pipe()
        try:
            proc, out_r, err_r = spawn(
                ["ruby", DRIVER, str(code_r), str(rec_w)],
                cwd=self.workdir,
                env=self.child_env(),
                pass_fds=(code_r, rec_w),
            )
        except BaseException:
            for fd in (code_r, code_w, rec_r, rec_w):
                os.close(fd)
            raise
        os.close(code_r)
        os.close(rec_w)
        os.set_inheritable(code_w, False)
        ruby = RubyProcess(proc, code_w, rec_r, out_r, err_r)
        self.ruby = ruby
        ready = self._wait_ready(ruby)
        self.version = str(ready.get("version", ""))
        self.description = str(ready.get("description", ""))
        loop = self.io_loop.asyncio_loop  # type: ignore[attr-defined]  # an AsyncIOLoop
        ruby.pump = OutputPump(loop, {"stdout": out_r, "stderr": err_r}, self.publish_stream)
        os.set_blocking(rec_r, False)
        loop.add_reader(rec_r, self._on_records, ruby)
        ruby.reading = True
        for record in self._split(ruby):  # anything after ready (nothing, normally)
            self._handle(ruby, record)

    def _wait_ready(self, ruby: RubyProcess) -> dict[str, Any]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        errors = b""
        watch = [ruby.record_fd, ruby.err_fd]
        while True:
            for record in self._split(ruby):
                if record.get("type") == "ready":
                    return record
            left = deadline - time.monotonic()
            if left <= 0:
                self._kill(ruby)
                raise CellError("RubyExited", "Ruby did not start in time", [])
            readable, _, _ = select.select(watch, [], [], left)
            if ruby.err_fd in readable:
                chunk = os.read(ruby.err_fd, 65536)
                errors += chunk
                if not chunk:
                    watch.remove(ruby.err_fd)
            if ruby.record_fd in readable:
                chunk = os.read(ruby.record_fd, 65536)
                if not chunk:
                    self._kill(ruby)
                    status = ruby.proc.returncode
                    text = errors.decode("utf-8", "replace").strip()
                    raise CellError("RubyExited", f"Ruby exited at start (status {status}): {text}", text.splitlines())
                ruby.buffer += chunk

    def _split(self, ruby: RubyProcess) -> list[dict[str, Any]]:
        records = []
        while b"\n" in ruby.buffer:
            line, ruby.buffer = ruby.buffer.split(b"\n", 1)
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError:
                    self.log.warning("bad record from the Ruby driver: %r", line[:200])
        return records

    def _on_records(self, ruby: RubyProcess) -> None:
        eof = False
        while True:
            try:
                chunk = os.read(ruby.record_fd, 1 << 20)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            ruby.buffer += chunk
            if len(ruby.buffer) > MAX_RECORD_BYTES and b"\n" not in ruby.buffer:
                ruby.buffer = b""  # a record this large is not sent by the driver
        for record in self._split(ruby):
            self._handle(ruby, record)
        if eof:
            self._ended(ruby)

    def _handle(self, ruby: RubyProcess, record: dict[str, Any]) -> None:
        if ruby.pump is not None:
            ruby.pump.drain()  # what the cell printed before this record goes out first
        kind = record.get("type")
        if kind == "display":
            data = record.get("data")
            if isinstance(data, dict):
                self.publish_display(data, record.get("metadata") or {})
        elif kind == "done":
            if self._waiter is not None and not self._waiter.done():
                self._waiter.set_result(record)

    def _ended(self, ruby: RubyProcess) -> None:
        """The driver's record pipe ended: the process exited or was killed."""
        if ruby.closed:
            return
        try:
            ruby.proc.wait(timeout=2)  # its pipes close as it exits: its own status, not our kill's
        except subprocess.TimeoutExpired:
            pass
        self._kill(ruby)
        if self.ruby is ruby:
            self.ruby = None
        status = ruby.proc.returncode or 0
        how = f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"
        evalue = (
            f"the Ruby process {how}: its state (variables, methods, classes) is lost; the next cell starts a new one"
        )
        if self._waiter is not None and not self._waiter.done():
            # under a cell: this kernel ends as Ruby did (`kernelgw_kernel.ending`),
            # so the cell ends dead with the cause and state_lost
            self.publish_stream("stderr", evalue.replace("; the next cell starts a new one", "") + "\n")
            fence(getattr(self, "iopub_thread", None))
            end_as(status if status > 0 else None, -status if status < 0 else None)

    def _kill(self, ruby: RubyProcess) -> None:
        """End the process and its group, hand on what its pipes still hold, close them."""
        if ruby.closed:
            return
        ruby.closed = True
        kill_group(ruby.proc.pid)
        try:
            ruby.proc.kill()
        except OSError:
            pass
        ruby.proc.wait()
        if ruby.pump is not None:
            ruby.pump.close()
        else:
            os.close(ruby.out_fd)
            os.close(ruby.err_fd)
        if ruby.reading:
            self.io_loop.asyncio_loop.remove_reader(ruby.record_fd)  # type: ignore[attr-defined]
            ruby.reading = False
        os.close(ruby.code_fd)
        os.close(ruby.record_fd)

    # -------------------------------------------------------------- interrupt
    def interrupt_child(self, child: subprocess.Popen[bytes]) -> None:
        now = time.monotonic()
        if self._first_interrupt and now - self._first_interrupt >= KILL_AFTER_S:
            kill_group(child.pid, signal.SIGKILL)  # it ignored the first: its state goes with it
            return
        if not self._first_interrupt:
            self._first_interrupt = now
        kill_group(child.pid, signal.SIGINT)

    # -------------------------------------------------------------- execution
    async def run_cell(self, code: str) -> None:
        if self.ruby is None:
            try:
                self.start_ruby()
            except OSError as exc:
                raise CellError("RubyMissing", str(exc), [f"RubyMissing: {exc}"]) from exc
        ruby = self.ruby
        assert ruby is not None
        request = json.dumps({"code": code, "cell": self.execution_count, "silent": self._silent}) + "\n"
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        self._first_interrupt = 0.0
        self._child = ruby.proc
        try:
            if self._interrupted:
                self.interrupt_child(ruby.proc)
            try:
                await loop.run_in_executor(None, _write_all, ruby.code_fd, request.encode("utf-8"))
            except OSError:
                pass  # the driver is gone: _ended answers the waiter
            record = await self._waiter
        finally:
            self._child = None
            self._waiter = None
        if record.get("status") != "error":
            self._interrupted = False  # the cell rescued the Interrupt and went on
        else:
            ename = str(record.get("ename") or "Error")
            traceback = [str(line) for line in record.get("traceback") or []]
            if ename == "Interrupt":
                self._interrupted = True
                raise CellError("KeyboardInterrupt", "the cell was interrupted", traceback)
            raise CellError(ename, str(record.get("evalue") or ""), traceback)
        result = record.get("result")
        if isinstance(result, dict) and result:
            self.publish_result(result)

    def cleanup(self) -> None:
        ruby = self.ruby
        if ruby is not None:
            self._kill(ruby)
        super().cleanup()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def main() -> None:
    launch(RubyKernel)


if __name__ == "__main__":
    main()
