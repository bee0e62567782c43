"""When the Bash kernel passes an interrupt on to bash, and how it finds bash's
prompt again afterwards.

bash_kernel let SIGINT raise KeyboardInterrupt wherever the kernel was, then
wrote ^C to bash and waited for one prompt. Two ways that left pexpect one
prompt behind bash, so that every later cell read the output of the one before
it (CI: the next cell said ``^C`` and IncompleteInput):

- an interrupt while the cell's lines were still being typed (the gateway
  passes it on as soon as the cell starts) reached bash at its continuation
  prompt: bash threw the half-typed group away and printed a new prompt, which
  pexpect took for the end of the cell, then the next cell for its own;
- a second interrupt, pressed while the first was being handled, reached bash at
  its prompt after the loop had ended, with the same extra prompt; or it raised
  in the kernel outside the cell, which then sent no reply.

Now bash says when it starts the cell: ``PS0``, which bash prints after it has
read a whole command and before it runs it, holds a marker (`RunMarker`). An
interrupt before the marker waits for it (`InterruptGate`); after the cell no
interrupt is passed on; and a cell to which one was passed ends with a
resynchronisation (`resync`): an ``echo`` of a fresh token, read up to the token
and the prompt after it, so a prompt left by an interrupt at the prompt is
skipped instead of being taken for the next cell's.
"""

from __future__ import annotations

import re
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

WAKE_S = 0.1
"""While a cell runs, the kernel's main thread wakes this often from its wait
for bash's output. Python runs signal handlers in the main thread only, and
gVisor may deliver the kernel's SIGINT to another of its threads: the wait for
a loop that prints nothing did not end, and the interrupt never reached bash."""
RESYNC_TRIES = 5
RESYNC_S = 2.0
"""Seconds to wait for one resynchronisation's token. A signal still on its way
to bash when the token's line is typed makes bash drop that line: the next try
types a new one."""


@dataclass
class InterruptGate:
    """Where the running cell is, from the kernel's side of the terminal:
    ``idle`` (no cell command: exit status reads, start-up), ``typing`` (the
    cell's lines are being sent, bash has not started it) or ``running``."""

    phase: str = "idle"
    waiting: bool = False
    """An interrupt came while ``typing``: it is passed on when the cell starts."""
    passed: int = 0
    """Interrupts passed on to bash during this cell."""

    def typing(self) -> None:
        self.phase, self.waiting, self.passed = "typing", False, 0

    def interrupt(self) -> bool:
        """A SIGINT for the kernel: True when it is to be passed on now."""
        if self.phase == "running":
            self.passed += 1
            return True
        if self.phase == "typing":
            self.waiting = True
        return False

    def started(self) -> bool:
        """bash started the cell (its marker came): True when an interrupt waited."""
        if self.phase != "typing":
            return False
        self.phase = "running"
        if self.waiting:
            self.waiting = False
            self.passed += 1
            return True
        return False

    def ended(self) -> bool:
        """The cell's command returned: True when it was interrupted."""
        interrupted = self.passed > 0
        self.phase, self.waiting, self.passed = "idle", False, 0
        return interrupted


class RunMarker:
    """``PS0``'s value and the pattern of what bash prints for it: ``\\[\\]``
    inside it is printed as two control characters, so the value itself (``env``,
    ``declare -p``) never looks like the marker."""

    def __init__(self, unique: str) -> None:
        self.value = unique + "\\[\\]!"
        self.pattern = re.escape(unique + "\x01\x02!")

    def setting(self) -> str:
        return f"PS0='{self.value}'"


def marked_wrapper(wrapper: Any, marker: RunMarker, on_start: Callable[[], None]) -> None:
    """Make bash_kernel's IREPLWrapper ``wrapper`` see ``marker`` as its own kind
    of match: ``on_start`` is called and the wait for the prompt goes on (the
    marker never reaches the cell's output)."""
    base = type(wrapper)

    class MarkedWrapper(base):  # type: ignore[misc,valid-type]
        def _expect_prompt(self, timeout: float | None = -1) -> int:
            import pexpect

            patterns: list[Any] = [re.compile(p) for p in (self.ps1_re, self.ps2_re, marker.pattern)]
            wait = timeout
            if timeout is None:  # a cell: its output line by line, waking up to take signals
                patterns += [re.compile("\r?\n"), re.compile("\r"), pexpect.TIMEOUT]
                wait = WAKE_S
            while True:
                pos = self.child.expect_list(patterns, timeout=wait)
                before = self.child.before
                if pos == 5:
                    continue
                if pos == 2:
                    if before and timeout is None:
                        self.line_output_callback(before)
                    on_start()
                elif pos == 3:
                    self.line_output_callback(before + "\n")
                elif pos == 4:
                    self.line_output_callback(before + "\r")
                else:
                    if before and timeout is None:
                        self.line_output_callback(before)
                    return int(pos)

    wrapper.__class__ = MarkedWrapper


def resync(wrapper: Any) -> bool:
    """Read past everything bash printed up to a fresh token and the prompt after
    it. False when bash never echoed one (it runs something that ignores
    interrupts): said on stderr, the container's log."""
    import pexpect

    child = wrapper.child
    for _ in range(RESYNC_TRIES):
        token = secrets.token_hex(6)
        child.sendline(f"echo KGW''SYNC{token}")  # typed, it does not match the token
        try:
            child.expect_exact(f"KGWSYNC{token}", timeout=RESYNC_S)
            wrapper._expect_prompt(timeout=RESYNC_S)
            return True
        except pexpect.TIMEOUT:
            continue
    print("bash_launcher: bash did not come back to its prompt after an interrupt", file=sys.stderr, flush=True)
    return False
