"""The Bash kernel's interrupts (images/python/kernelgw_kernel/bash_interrupt.py):
the gate that holds an interrupt until bash starts the cell, and, against a real
bash in a real pseudo-terminal (pexpect, as the kernel runs it), the PS0 marker,
the resynchronisation after an interrupt at the prompt, and the wake-ups that let
a signal taken by another thread reach the main one."""

from __future__ import annotations

import os
import re
import secrets
import signal
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pexpect
import pytest
from pexpect import replwrap

from tests.support.local_backend import image_helper


@pytest.fixture(scope="module")
def bi() -> Iterator[ModuleType]:
    with image_helper("bash_interrupt") as module:
        yield module


# ------------------------------------------------------------------ the gate
def test_an_interrupt_while_the_cell_is_typed_waits_until_bash_starts_it(bi: ModuleType) -> None:
    gate = bi.InterruptGate()
    gate.typing()
    assert gate.interrupt() is False  # bash would throw the half-typed cell away
    assert gate.interrupt() is False  # pressed twice: still one interrupt
    assert gate.started() is True  # passed on now, once
    assert gate.started() is False
    assert gate.ended() is True
    assert gate.phase == "idle"


def test_interrupts_while_the_cell_runs_pass_and_none_pass_outside_a_cell(bi: ModuleType) -> None:
    gate = bi.InterruptGate()
    assert gate.interrupt() is False  # no cell: an exit status read, start-up
    assert gate.started() is False
    gate.typing()
    assert gate.started() is False
    assert gate.interrupt() is True
    assert gate.interrupt() is True
    assert gate.ended() is True
    assert gate.interrupt() is False


def test_a_cell_no_interrupt_reached_ends_as_not_interrupted(bi: ModuleType) -> None:
    gate = bi.InterruptGate()
    gate.typing()
    gate.started()
    assert gate.ended() is False
    gate.typing()
    gate.interrupt()  # waiting, and the cell never started (incomplete input)
    assert gate.ended() is False
    gate.typing()
    assert gate.started() is False  # nothing left over from the last cell


# ------------------------------------------------------------- a real bash
class Repl(replwrap.REPLWrapper):  # type: ignore[misc]
    """bash_kernel's IREPLWrapper as far as the marker needs it: regular
    expressions for the prompts and a callback for the cell's lines."""

    def __init__(self, child: pexpect.spawn, unique: str, lines: list[str]) -> None:
        self.child = child
        self.ps1_re = re.escape(unique + ">")
        self.ps2_re = re.escape(unique + "+")
        self.prompt, self.continuation_prompt = self.ps1_re, self.ps2_re
        self.line_output_callback = lines.append


class Bash:
    def __init__(self, bi: ModuleType) -> None:
        self.lines: list[str] = []
        self.starts = 0
        self.child = pexpect.spawn(
            "bash", ["--norc", "--noprofile"], echo=False, encoding="utf-8", env={"PATH": os.environ["PATH"]}
        )
        unique = "PROMPT_" + secrets.token_hex(4).upper()
        self.child.sendline(f"PS1='{unique}\\[\\]>' PS2='{unique}\\[\\]+' PROMPT_COMMAND=''")
        self.child.expect(re.escape(unique + ">"), timeout=10)
        self.repl = Repl(self.child, unique, self.lines)
        marker = bi.RunMarker(unique)
        bi.marked_wrapper(self.repl, marker, self.started)
        self.repl.run_command(f"{marker.setting()}; set +m", timeout=10)
        self.starts = 0

    def started(self) -> None:
        self.starts += 1

    def cell(self, code: str) -> str:
        """``code`` as the kernel runs a cell (its lines to the callback)."""
        self.lines.clear()
        self.repl.run_command(code, timeout=None)
        return "".join(self.lines)

    def command(self, code: str) -> str:
        """``code`` as the kernel reads an exit status."""
        return str(self.repl.run_command(code, timeout=10))


@pytest.fixture
def bash(bi: ModuleType) -> Iterator[Bash]:
    shell = Bash(bi)
    yield shell
    shell.child.close(force=True)


def test_the_marker_says_when_bash_starts_each_command_and_stays_out_of_the_output(bash: Bash) -> None:
    assert bash.cell("echo hi") == "hi\n"
    assert bash.starts == 1
    # a group typed line by line starts once, when it is whole
    assert bash.cell("{ :\necho a\necho b\n}") == "a\nb\n"
    assert bash.starts == 2
    # PS0's own value, printed, is not the marker
    value = bash.cell('echo "$PS0"')
    assert bash.starts == 3 and value.endswith("\\[\\]!\n"), value
    assert bash.command("echo $((6 * 7))").strip() == "42"
    assert bash.starts == 4


def test_an_interrupt_at_the_prompt_leaves_a_prompt_the_resync_reads(bi: ModuleType, bash: Bash) -> None:
    bash.cell("true")
    # the hazard: bash prints one prompt more than any command asked for
    os.killpg(bash.child.pid, signal.SIGINT)
    bash.child.expect(bash.repl.ps1_re, timeout=10)
    # the remedy, with the signal's prompt still to come or already come
    os.killpg(bash.child.pid, signal.SIGINT)
    assert bi.resync(bash.repl) is True
    assert bash.cell("echo after") == "after\n"
    assert bash.command("echo $((1 + 1))").strip() == "2"


def test_a_signal_another_thread_took_reaches_bash_while_nothing_is_printed(bi: ModuleType, bash: Bash) -> None:
    """gVisor may hand the kernel's SIGINT to any of its threads; Python runs
    the handler in the main thread, which the kernel's wait wakes every WAKE_S."""
    handled = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        handled.set()
        os.killpg(bash.child.pid, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        # a timer thread sends itself the signal while the main thread waits for
        # output that never comes
        bash.child.sendline("while true; do :; done")
        timer = threading.Timer(0.5, lambda: signal.pthread_kill(threading.get_ident(), signal.SIGINT))
        timer.start()
        bash.lines.clear()
        bash.repl._expect_prompt(timeout=None)
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert handled.is_set()
    assert bash.command("echo still").strip() == "still"
