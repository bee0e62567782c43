"""The Bash kernel's entry point: bash_kernel (PyPI), started fast, with stderr
apart from stdout and readable errors. Only the Bash image runs it (it imports
bash_kernel, which the Python image does not have).

``python -m kernelgw_kernel.bash_launcher -f CONNECTION_FILE`` starts
bash_kernel's kernel with these changes, made from outside its source:

- **Start-up.** pexpect sleeps ``delaybeforesend`` (50 ms) before every write to
  bash, and ``sendline`` writes twice. bash_kernel's start-up sends about 25
  lines (the prompt change, ``PAGER``, its ``display`` helpers), which cost
  2.2 s, and every cell paid 100 ms or more (its lines and the ``echo $?`` that
  reads the exit status). The delay guards programs that turn the terminal's
  echo off late; bash_kernel spawns bash with echo off from the start, so the
  launcher spawns it with no delay.
- **stdout in batches.** bash_kernel published a message per line of output
  (10,000 lines took 3 s); lines now go out together every 20 ms (see
  `StdoutBatch`).
- **stderr.** bash runs in a pseudo-terminal, so what a command writes to
  stderr arrived as stdout. Each cell now runs as ``{ :; CELL; } 2>>FIFO`` (a
  group in the same shell: variables, functions and ``cd`` persist as before;
  the ``:`` keeps a cell of comments valid, and the group's status is the last
  command's). A thread reads the FIFO and sends ``stderr`` stream messages as
  lines come; what is left is sent before the cell's error and reply. The
  ``display`` helpers announce their files on stderr, so their lines become
  displays there too (images and HTML still show; `Outlet`).
  The two streams come by two ways, so a line of stderr may overtake a line of
  stdout written just before it. bash's messages about the cell as a whole (a
  syntax error) come on the terminal, as stdout. A cell that removes the FIFO
  (``rm -rf /tmp/*``) gets it back before the next cell.
- **Errors.** A cell whose last command failed gave ``ename ''`` and
  ``evalue '2'``. It is now ``ename 'ExitStatus'``, an ``evalue`` that says the
  status and the cell's last line of stderr, and a traceback that says so too
  (frontends show only the traceback). An interrupted cell answered with
  status ``abort``; it now answers as IPython does (status ``error``, ``ename``
  ``KeyboardInterrupt``), so a gateway tells an interrupt from a failure.
  The interrupt itself is SIGINT to the terminal's foreground process group
  (`interrupt_foreground`): bash_kernel wrote the terminal's ^C, and gVisor's
  terminal (runsc 20221219) turned it into no signal, so under runsc an endless
  loop ran on until the gateway restarted the kernel.
  It is passed on only once bash has started the cell, and a cell it reached
  ends by reading bash's output up to its prompt again (`bash_interrupt`): an
  interrupt pressed while the cell was being typed, or pressed twice, left pexpect
  a prompt behind, and every later cell read the one before it.
  A cell bash could not finish reading (an unclosed quote) made pexpect raise
  and the kernel sent no reply at all; it is now an ``IncompleteInput`` error,
  and nothing of the cell ran (the group was never closed).

- **bash ending under a cell.** ``exit 3``, ``exec ...``, a kill or an
  out-of-memory kill of the shell made bash_kernel start a new shell and end the
  cell ``ok`` with ``state_lost=false``, its variables gone. The kernel now
  ends as bash ended (`kernelgw_kernel.ending`), and the gateway ends the cell
  ``dead`` with the cause and ``state_lost``, as for Python's kernel.

``python -m kernelgw_kernel.bash_launcher --check`` starts bash the kernel's
way, runs one command and says how long it took (the image build's self-check).
"""

from __future__ import annotations

import codecs
import os
import re
import select
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from kernelgw_kernel.bash_interrupt import InterruptGate, RunMarker, marked_wrapper, resync
from kernelgw_kernel.ending import end_as, fence

MAX_PENDING = 1 << 20
"""Bytes of stderr read but not sent yet, at most (a background job's output
waits for the next cell, as its stdout does in the terminal); more is dropped."""
MAX_LINE = 1 << 16
"""A partial line longer than this is sent without waiting for its end."""
BATCH_S = 0.02
"""How long lines of stdout gather before they are published together."""
MAX_BATCH = 64 * 1024
"""Characters of stdout published at once without waiting for BATCH_S."""
HOLD_S = 0.05
"""How long a partial line of stderr waits for the rest of it..."""
HOLD_MAX_S = 0.5
"""... and at most, while pieces of it keep coming (a row of progress dots)."""
EVALUE_MAX = 500


def fast_spawn() -> type:
    """pexpect.spawn without the delay before each write (see the module doc)."""
    import pexpect

    class FastSpawn(pexpect.spawn):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.delaybeforesend = None

    return FastSpawn


def use_fast_spawn() -> None:
    """Make every pexpect.spawn of this process (bash_kernel's) a FastSpawn."""
    import pexpect

    if getattr(pexpect.spawn, "__name__", "") != "FastSpawn":
        pexpect.spawn = fast_spawn()


INTERRUPTED = {"ename": "KeyboardInterrupt", "evalue": "", "traceback": ["KeyboardInterrupt"]}
INCOMPLETE = {
    "ename": "IncompleteInput",
    "evalue": "bash waits for more input (an unclosed quote, bracket or here-document?); nothing of the cell ran",
    "traceback": ["IncompleteInput: bash waits for more input; nothing of the cell ran"],
}


def signal_name(status: int) -> str | None:
    """ "SIGINT" for 130 (a shell's status for a command killed by a signal)."""
    if status <= 128:
        return None
    try:
        return signal.Signals(status - 128).name
    except ValueError:
        return None


def exit_error(status: int, last_stderr: str) -> dict[str, Any]:
    """The error content for a cell whose last command exited with ``status``."""
    said = f"exit status {status}"
    if (name := signal_name(status)) is not None:
        said += f" (killed by {name})"
    line = last_stderr.strip()
    if len(line) > EVALUE_MAX:
        line = line[:EVALUE_MAX] + "..."
    evalue = f"{line} ({said})" if line else said
    return {"ename": "ExitStatus", "evalue": evalue, "traceback": [f"The cell's last command ended with {said}."]}


def wrap(code: str, fifo: str) -> str:
    """The cell as a group in the current shell whose stderr goes to ``fifo``."""
    return "{ :\n" + code.rstrip() + "\n} 2>>" + fifo


class Outlet:
    """Publishes the running cell's output on iopub, from any thread: the
    cell's parent is set by the kernel (ipykernel keeps it in a ContextVar that
    other threads do not see). Text goes through bash_kernel's display helpers'
    announcements: their lines become displays, in order with the text."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.parent: dict[str, Any] | None = None
        self.silent = False

    def show(self, name: str, text: str) -> str:
        """Publish ``text`` as stream ``name`` and displays; the plain text."""
        from bash_kernel.display import CONTENT_DATA_PREFIXES, extract_contents

        shown = []
        plain: list[str] = []
        for line in re.split("(?<=[\r\n])", text):
            if not line.startswith(tuple(CONTENT_DATA_PREFIXES)):
                plain.append(line)
                continue
            self._stream(name, "".join(plain))
            shown += plain
            plain = []
            try:
                _, rich = extract_contents(line)
            except Exception as exc:  # a helper's file vanished, or is not an image
                self._stream(name, f"display: {exc}\n")
                continue
            for content in rich:
                self._display(content)
        self._stream(name, "".join(plain))
        return "".join(shown + plain)

    def _stream(self, name: str, text: str) -> None:
        if text:
            self.publish("stream", {"name": name, "text": text})

    def _display(self, content: dict[str, Any]) -> None:
        display_id = content.get("transient", {}).get("display_id")
        if display_id is None:
            self.publish("display_data", content)
            return
        known = self.kernel._known_display_ids
        self.publish("update_display_data" if display_id in known else "display_data", content)
        known.add(display_id)

    def publish(self, msg_type: str, content: dict[str, Any]) -> None:
        if self.silent or self.parent is None:
            return
        kernel = self.kernel
        kernel.session.send(kernel.iopub_socket, msg_type, content, parent=self.parent, ident=kernel._topic(msg_type))


class StdoutBatch:
    """bash_kernel publishes a message per line of stdout: 10,000 lines took
    3 s, nearly all of it in messages (pexpect read them in 0.13 s). Lines
    are gathered here and published together once BATCH_S passed since the
    first of them (by a thread: a line before a long ``sleep`` is not held),
    when MAX_BATCH characters wait, and before the cell's error and reply.

    The terminal ends lines with CR LF. bash_kernel cuts them at LF, or at a
    CR, which passes a line ending CR when a read ended between the two and the
    LF as a line of its own: such a CR, followed by its LF, is dropped (a
    trailing CR waits for what follows it, or for the cell's end: under load
    its LF came more than one batch later, and a CR went out on its own)."""

    def __init__(self, outlet: Outlet) -> None:
        self.outlet = outlet
        self.cond = threading.Condition()
        self.text = ""
        thread = threading.Thread(target=self._run, name="kernelgw-stdout", daemon=True)
        thread.start()

    def add(self, text: str) -> None:
        with self.cond:
            first = self.text in ("", "\r")
            if text.startswith("\n") and self.text.endswith("\r"):
                self.text = self.text[:-1]
            self.text += text
            if len(self.text) >= MAX_BATCH:
                self._flush(hold_cr=True)
            elif first:
                self.cond.notify()

    def flush(self) -> None:
        with self.cond:
            self._flush(hold_cr=False)

    def _flush(self, hold_cr: bool) -> None:
        text, self.text = self.text, ""
        if hold_cr and text.endswith("\r"):
            text, self.text = text[:-1], "\r"
        if text:
            self.outlet.show("stdout", text)

    def _run(self) -> None:
        with self.cond:
            while True:
                while self.text in ("", "\r"):  # a held CR waits for its LF
                    self.cond.wait()
                deadline = time.monotonic() + BATCH_S
                while self.text and (left := deadline - time.monotonic()) > 0:
                    self.cond.wait(left)  # lines that come meanwhile join
                self._flush(hold_cr=True)


class StderrRelay:
    """Reads what cells write to stderr (a FIFO) and sends it as ``stderr``
    stream messages of the cell running, from a thread. Whole lines are sent as
    they come; a partial line once nothing more came for HOLD_S (a program
    writes a line in pieces: ``ls`` wrote "ls: ", the path and the reason in
    three writes), so lines are not cut into messages and a display helper's
    announcement (one write) always comes whole."""

    def __init__(self, outlet: Outlet, directory: str) -> None:
        self.outlet = outlet
        self.directory = directory
        self.path = os.path.join(directory, "stderr")
        self.lock = threading.Lock()
        self.pending = bytearray()
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""
        """Decoded, not sent yet (a partial line)."""
        self.active = False
        """A cell runs: what comes is its output (else it waits for the next cell)."""
        self.line = ""
        """The cell's stderr line being written (sent, not ended yet)."""
        self.last_line = ""
        """The cell's last ended line of stderr that was not blank."""
        self.held_since = 0.0
        """When the partial line in ``text`` began to wait."""
        self.fd = -1
        self._open()
        thread = threading.Thread(target=self._run, name="kernelgw-stderr", daemon=True)
        thread.start()

    def _open(self) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        os.mkfifo(self.path, 0o600)
        # read-write: the FIFO never reports end of file and a writer's open never blocks
        fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)
        old, self.fd = self.fd, fd
        if old >= 0:
            os.close(old)  # the reader thread's select fails (EBADF) and polls the new one

    def _ensure(self) -> None:
        """Make the FIFO again if a cell removed it (``rm -rf /tmp/*``): without
        it every later cell would fail on its redirection."""
        try:
            if stat.S_ISFIFO(os.stat(self.path).st_mode):
                return
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self._read()  # what the old FIFO still holds
        self._open()

    # -------------------------------------------------------------- the cell
    def begin(self) -> None:
        """A cell starts (the outlet has its parent): what waited (a background
        job's stderr) is sent as its."""
        with self.lock:
            self._ensure()
            self.active, self.line, self.last_line = True, "", ""
            self._read()
            self._emit(partial=False)

    def flush(self) -> str:
        """Send everything written so far; the cell's last line of stderr."""
        with self.lock:
            self._read()
            self._emit(partial=True)
            return self.line.strip() or self.last_line

    def end(self) -> None:
        """Send everything written so far; later output waits for the next cell."""
        with self.lock:
            self._read()
            self._emit(partial=True)
            self.active = False

    # ---------------------------------------------------------------- inside
    def _run(self) -> None:
        while True:
            fd = self.fd
            waiting = bool(self.text)  # a partial line: send it once writes pause
            try:
                readable, _, _ = select.select([fd], [], [], HOLD_S if waiting else 1.0)
            except (OSError, ValueError):  # closed by _open: poll the new FIFO
                continue
            with self.lock:
                self._read()
                if self.active:
                    held = time.monotonic() - self.held_since
                    self._emit(partial=waiting and (not readable or held > HOLD_MAX_S))

    def _read(self) -> None:
        """Empty the FIFO into ``pending`` (beyond MAX_PENDING bytes, into nothing:
        a writer never blocks on a full pipe)."""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # BlockingIOError: empty for now
                return
            if not chunk:
                return
            room = MAX_PENDING - len(self.pending)
            if room > 0:
                self.pending += chunk[:room]

    def _emit(self, partial: bool) -> None:
        """Send the whole lines decoded so far, and with ``partial`` the rest too."""
        if self.pending:
            self.text += self.decoder.decode(bytes(self.pending))
            self.pending.clear()
        if partial:
            self.text += self.decoder.decode(b"", final=True)
            cut = len(self.text)
        else:
            cut = max(self.text.rfind("\n"), self.text.rfind("\r")) + 1
            if len(self.text) - cut > MAX_LINE:
                cut = len(self.text)
        out, self.text = self.text[:cut], self.text[cut:]
        if out or not self.text:
            self.held_since = time.monotonic()
        if out:
            self._send(out)

    def _send(self, text: str) -> None:
        plain = self.outlet.show("stderr", text)
        *ended, self.line = re.split("[\r\n]", self.line + plain)
        for line in reversed(ended):
            if line.strip():
                self.last_line = line.strip()
                break


def interrupt_foreground(child: Any) -> None:
    """SIGINT the foreground process group of bash's terminal, as the terminal
    itself does on ^C (bash, or the command it runs in the foreground); the ^C
    written to the terminal when that cannot be done. Under gVisor (runsc
    20221219) the terminal does not say its foreground group (ENOTTY) and bash's
    own group is signalled: with job control off (the kernel's bash), that is
    where a foreground command runs."""
    try:
        group = os.tcgetpgrp(child.child_fd)
    except OSError:
        group = child.pid  # bash leads its own group
    try:
        os.killpg(group, signal.SIGINT)
    except OSError:
        child.sendcontrol("c")


def kernel_class() -> type:
    """bash_kernel's BashKernel with the changes of the module doc."""
    from bash_kernel.kernel import BashKernel
    from pexpect import EOF

    class KernelgwBashKernel(BashKernel):  # type: ignore[misc]
        implementation = "bash_kernel (kernelgw)"

        def __init__(self, **kwargs: Any) -> None:
            self._kgw_in_cell = False
            self._kgw_gate = InterruptGate()
            self._kgw_outlet = Outlet(self)
            self._kgw_stdout = StdoutBatch(self._kgw_outlet)
            self._kgw_stderr: StderrRelay | None = None
            super().__init__(**kwargs)  # starts bash
            self._kgw_stderr = StderrRelay(self._kgw_outlet, tempfile.mkdtemp(prefix="kernelgw-bash-"))

        def _start_bash(self) -> None:
            # bash ending under a cell is `_kgw_run`'s EOF: bash_kernel's own
            # restart of the shell there is never reached
            super()._start_bash()
            wrapper = self.bashwrapper
            child = wrapper.child
            child.sendintr = lambda: interrupt_foreground(child)
            marker = RunMarker(self.unique_prompt)
            marked_wrapper(wrapper, marker, self._kgw_started)
            # job control off: a foreground command runs in bash's own process
            # group, which an interrupt signals (gVisor's terminal cannot say
            # which group is in the foreground: `interrupt_foreground`), and
            # background jobs ignore SIGINT, as they would not get a terminal's ^C
            wrapper.run_command(f"{marker.setting()}; set +m")

        # ------------------------------------------------------ interrupts
        def pre_handler_hook(self) -> None:
            """SIGINT goes to `_kgw_sigint` while a request is handled, instead of
            raising KeyboardInterrupt wherever the kernel is (`bash_interrupt`)."""
            self.saved_sigint_handler = signal.signal(signal.SIGINT, self._kgw_sigint)

        def _kgw_sigint(self, signum: int, frame: Any) -> None:
            if self._kgw_gate.interrupt():
                interrupt_foreground(self.bashwrapper.child)

        def _kgw_started(self) -> None:
            if self._kgw_gate.started():
                interrupt_foreground(self.bashwrapper.child)

        # -------------------------------------------------------- the cell
        def do_execute(
            self,
            code: str,
            silent: bool,
            store_history: bool = True,
            user_expressions: Any = None,
            allow_stdin: bool = False,
            **kwargs: Any,
        ) -> Any:
            relay = self._kgw_stderr
            if relay is None or not code.strip() or code.strip().endswith("\\"):
                return super().do_execute(code, silent, store_history, user_expressions, allow_stdin)
            self.silent = silent
            self._kgw_outlet.parent, self._kgw_outlet.silent = self.get_parent("shell"), silent
            relay.begin()
            self._kgw_in_cell = True
            try:
                return self._kgw_run(wrap(code, relay.path), silent)
            finally:
                self._kgw_in_cell = False
                self._kgw_stdout.flush()
                relay.end()

        def _kgw_run(self, command: str, silent: bool) -> dict[str, Any]:
            """bash_kernel's do_execute, with interrupts passed on by the gate."""
            gate = self._kgw_gate
            gate.typing()
            try:
                self.bashwrapper.run_command(command, timeout=None)
            except ValueError as exc:
                gate.ended()
                if not str(exc).startswith("Continuation prompt found"):
                    raise
                # pexpect's replwrap saw bash ask for more input after the last
                # line and sent it SIGINT: nothing of the cell ran (the group was
                # never closed), bash is at its prompt again
                return self._error_reply(INCOMPLETE, silent)
            except EOF:
                gate.ended()
                self._kgw_lost()  # bash ended under the cell: this kernel ends too
            if gate.ended():
                # the prompt an interrupt may have left behind is read here, not
                # by the next cell; answered as IPython does (bash_kernel: abort)
                resync(self.bashwrapper)
                return self._error_reply(INTERRUPTED, silent)
            try:
                status = int(self.bashwrapper.run_command("{ echo $?; } 2>/dev/null").rstrip().split("\r\n")[0])
            except Exception:
                status = 1
            if status:
                # its error content says the status and the cell's last line of stderr
                self._kgw_stdout.flush()
                assert self._kgw_stderr is not None
                return self._error_reply(exit_error(status, self._kgw_stderr.flush()), silent)
            return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}

        def _kgw_lost(self) -> NoReturn:
            """bash ended under the cell (``exit``, ``exec``, a kill, out of memory):
            send what it wrote, then end this kernel the way bash ended, so the
            gateway ends the cell ``dead`` with the real cause and ``state_lost``
            (bash_kernel started a new shell instead, and the cell ended ``ok``)."""
            child = self.bashwrapper.child
            self.process_output(child.before or "")
            child.close(force=True)
            code, sig = child.exitstatus, child.signalstatus
            how = f"was killed by signal {sig}" if sig else f"exited with code {code}"
            self._kgw_stdout.flush()
            if self._kgw_stderr is not None:
                self._kgw_stderr.end()
            self._kgw_outlet.publish(
                "stream", {"name": "stderr", "text": f"bash {how}: its variables, functions and directory are lost\n"}
            )
            fence(getattr(self, "iopub_thread", None))
            end_as(code, sig)

        def process_output(self, output: str) -> None:
            """A line of the terminal's output (bash_kernel's callback): into the batch."""
            if not self._kgw_in_cell:
                super().process_output(output)
            elif not self.silent:
                self._kgw_stdout.add(output)

        def _error_reply(self, content: dict[str, Any], silent: bool) -> dict[str, Any]:
            if not silent:
                self.send_response(self.iopub_socket, "error", dict(content))
            return {**content, "status": "error", "execution_count": self.execution_count}

    return KernelgwBashKernel


def check() -> int:
    """Start bash the kernel's way (pexpect, bashrc, a unique prompt) and run one
    command; prints the time it took."""
    import pexpect
    from bash_kernel.kernel import IREPLWrapper

    use_fast_spawn()
    started = time.monotonic()
    bashrc = os.path.join(os.path.dirname(pexpect.__file__), "bashrc.sh")
    child = pexpect.spawn("bash", ["--rcfile", bashrc], echo=False, encoding="utf-8", codec_errors="replace")
    prompt = "PROMPT_KGWCHECK"
    change = f"PS1='{prompt}\\[\\]>' PS2='{prompt}\\[\\]+' PROMPT_COMMAND=''"
    repl = IREPLWrapper(child, "\\$", change, prompt, extra_init_cmd="export PAGER=cat")
    out = repl.run_command("echo $((6 * 7))").strip()
    child.close(force=True)
    took = time.monotonic() - started
    if out != "42":
        print(f"bash_launcher check: unexpected output {out!r}", file=sys.stderr)
        return 1
    print(f"bash_launcher check: bash answered in {took:.2f} s")
    return 0


def main() -> None:
    # as ipykernel_launcher: no imports from the working directory (/workspace)
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]
    if sys.argv[1:] == ["--check"]:
        sys.exit(check())
    use_fast_spawn()
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=kernel_class())


if __name__ == "__main__":
    main()
