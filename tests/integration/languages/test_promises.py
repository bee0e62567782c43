"""The promises the README makes for every kernel, checked with the same
expectations for each of the eight, through the gateway as an agent uses it:

- an endless loop is interrupted at its timeout and what was defined before
  survives; an endless *printing* loop likewise, its output capped behind a
  ``truncated`` event;
- huge output through every way the language writes (its print, its raw
  stdout writer, a subprocess) arrives capped behind a ``truncated`` event,
  never lost silently;
- a memory bomb ends the cell ``dead`` with ``state_lost`` (or, where the
  language catches it, as an ``error`` that really kept the state), the cause
  named, and the session runs the next cell;
- the kernel process exiting or replaced (``exit 3``, ``exec``, ``kill -9``)
  ends the cell ``dead`` or ``error`` with the real cause and ``state_lost``;
- nothing of an ended cell appears in the next one;
- a backgrounded fork bomb is held by the pids limit and the session goes on.

"The session runs the next cell" is what Python's session does: the cell that
lost the kernel says so in its ``done`` (``dead``, ``state_lost``, a reason
that says to restart), the session is ``dead`` until a restart, and the cell
after the restart runs. Go and C++ keep no state between cells (each cell is a
whole program): a cell's program dying is that cell's ``error`` there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import docker
import httpx
import pytest

from kernelgw.kernels import PROFILES
from tests.integration.conftest import RunningGateway, assert_nothing_left, gateway_settings, run, start_gateway
from tests.support.language_cells import BOMB_MEMORY_MB, MEMORY_BOMBS, SAID, SAY, cpp, go

pytestmark = pytest.mark.integration

OUTPUT_CAP = 1024 * 1024
"""The gateway's ``max_output_bytes`` here: every huge write below is 4 MB."""
HUGE = 4_000_000
TIMEOUT_S = 3
WRITE_TIMEOUT_S = 20
"""A huge write's cell: every kernel but bash (its terminal) writes the 4 MB in a few seconds."""
YES = f"yes | head -c {HUGE}"
FORK_BOMB = ":(){ :|:& };:"


DENO_FD = (
    "deno jupyter puts a pipe of its own on its fd 1 (it reads it, fd 3) and publishes only console's output: "
    "Deno.stdout's bytes and an inheriting child's go into that pipe and reach no one (not the shim's pipe, "
    "not the container's log); the cell ends ok with no stream and no truncated event"
)
"""Why Deno's own-fd writes are lost even with the shim relaying the kernel's fd 1 and 2."""


@dataclass(frozen=True)
class Case:
    say: str
    """A cell that prints ``said`` and nothing else."""
    said: str
    keep: tuple[str, str] | None
    """Two cells: the first defines kept = 41, the second prints kept + 1."""
    loop: str
    print_loop: str
    writers: dict[str, str]
    """Ways of writing HUGE bytes to stdout, by name."""
    memory_bomb: str
    exits: dict[str, tuple[str, str]]
    """How the kernel process ends or is replaced: (code, text of the real cause in the reason)."""
    fork_bomb: str
    xfail: dict[str, str] = field(default_factory=dict)
    """Promise (test name, or test name/parameter) -> exactly what happens instead."""
    xfail_at_times: dict[str, str] = field(default_factory=dict)
    """As ``xfail``, for a gap that shows or not with the timing of the run (a
    leftover line of an interrupted loop): not strict, so it never fails a run."""


CASES: dict[str, Case] = {
    "python3": Case(
        say=SAY["python3"],
        said=SAID,
        keep=("kept = 41", "print(kept + 1)"),
        loop="while True:\n    pass",
        print_loop="while True:\n    print('x' * 100)",
        writers={
            "print": f"print('x' * {HUGE})",
            "raw": f"import os\nos.write(1, b'x' * {HUGE})",
            "subprocess": f"import subprocess\nsubprocess.run({YES!r}, shell=True)",
        },
        memory_bomb=MEMORY_BOMBS["python3"],
        exits={
            "exit": ("import os\nos._exit(3)", "code 3"),
            "exec": ("import os\nos.execv('/bin/sh', ['sh', '-c', 'exit 0'])", "exited"),
            "kill": ("import os\nos.kill(os.getpid(), 9)", "signal 9"),
        },
        fork_bomb=f"import subprocess\nsubprocess.Popen(['bash', '-c', {FORK_BOMB!r}])",
    ),
    "deno": Case(
        say=SAY["deno"],
        said=SAID,
        keep=("const kept: number = 41;", "console.log(kept + 1);"),
        loop="while (true) {}",
        print_loop="for (;;) console.log('x'.repeat(100));",
        writers={
            "print": f"console.log('x'.repeat({HUGE}));",
            "raw": f"Deno.stdout.writeSync(new TextEncoder().encode('x'.repeat({HUGE})));",
            "raw-async": f"await Deno.stdout.write(new TextEncoder().encode('x'.repeat({HUGE})));",
            "subprocess": f"await new Deno.Command('sh', {{ args: ['-c', {YES!r}], stdout: 'inherit' }}).spawn().status;",
        },
        memory_bomb=MEMORY_BOMBS["deno"],
        exits={
            "exit": ("Deno.exit(3);", "code 3"),
            "kill": ("Deno.kill(Deno.pid, 'SIGKILL');", "signal 9"),
        },
        fork_bomb=f"new Deno.Command('bash', {{ args: ['-c', {FORK_BOMB!r}] }}).spawn();",
        xfail={
            "loops": "for (;;) console.log(...) is not interrupted at the timeout: Deno buffers the output until it is killed for memory (dead, state_lost)",
            "huge_output/raw": DENO_FD,
            "huge_output/raw-async": DENO_FD,
            "huge_output/subprocess": DENO_FD,
        },
    ),
    "ir": Case(
        say=SAY["ir"],
        said=SAID,
        keep=("kept <- 41", "cat(kept + 1, '\\n', sep = '')"),
        loop="while (TRUE) {}",
        print_loop="repeat cat(strrep('x', 100), '\\n')",
        writers={
            "print": f"cat(strrep('x', {HUGE}))",
            "raw": f"writeLines(strrep('x', {HUGE}), stdout())",
            "system": f"system({YES!r})",
        },
        memory_bomb=MEMORY_BOMBS["ir"],
        exits={
            "exit": ("quit(save = 'no', status = 3)", "code 3"),
            "kill": ("tools::pskill(Sys.getpid(), 9)", "signal 9"),
        },
        fork_bomb=f"system({('bash -c ' + repr(FORK_BOMB))!r}, wait = FALSE)",
        xfail={
            "loops": "IRkernel sends what a top-level expression printed when the expression ends: an endless "
            "printing loop, interrupted, shows nothing (0 bytes, no truncated event), and a line of it may begin the "
            "next cell",
        },
    ),
    "bash": Case(
        say=SAY["bash"],
        said=SAID,
        keep=("kept=41", "echo $((kept + 1))"),
        loop="while true; do :; done",
        print_loop="while true; do echo " + "x" * 100 + "; done",
        writers={
            "print": f"s=$(printf '%{HUGE}s' ''); echo \"$s\"",
            "subprocess": YES,
        },
        memory_bomb=MEMORY_BOMBS["bash"],
        exits={
            "exit": ("exit 3", "code 3"),
            "exec": ("exec sh -c 'exit 0'", "exited"),
            "kill": ("kill -9 $$", "signal 9"),
        },
        fork_bomb=FORK_BOMB,
        xfail_at_times={
            "fork_bomb": "a fork bomb that backgrounds itself outlives its cell and holds the pids limit: a later "
            "cell may fail ('fork: retry: Resource temporarily unavailable', exit status 254) until a restart",
        },
        xfail={
            "huge_output/print": "4 MB through bash_kernel's terminal (pexpect) takes over 60 s: the cell times out",
            "huge_output/subprocess": "4 MB through bash_kernel's terminal (pexpect) takes over 60 s: the cell times out (its output capped)",
        },
    ),
    "java": Case(
        say=SAY["java"],
        said=SAID,
        keep=("int kept = 41;", "System.out.println(kept + 1);"),
        loop="while (true) {}",
        print_loop='while (true) System.out.println("x".repeat(100));',
        writers={
            "print": f'System.out.print("x".repeat({HUGE}));',
            "raw": f'new java.io.FileOutputStream(java.io.FileDescriptor.out).write("x".repeat({HUGE}).getBytes());',
            "subprocess": f'new ProcessBuilder("sh", "-c", "{YES}").inheritIO().start().waitFor();',
        },
        memory_bomb=MEMORY_BOMBS["java"],
        exits={
            "exit": ("System.exit(3);", "code 3"),
            "kill": (
                'new ProcessBuilder("sh", "-c", "kill -9 $PPID").start().waitFor();',
                "signal 9",
            ),
        },
        fork_bomb=f'new ProcessBuilder("bash", "-c", "{FORK_BOMB}").start();',
    ),
    "go": Case(
        say=SAY["go"],
        said=SAID,
        keep=None,
        loop=go("\tfor {\n\t}", ""),
        print_loop=go('\tfor {\n\t\tfmt.Println("' + "x" * 100 + '")\n\t}'),
        writers={
            "print": go(f'\tfmt.Print(strings.Repeat("x", {HUGE}))', '"fmt"; "strings"'),
            "raw": go(f'\tos.Stdout.Write([]byte(strings.Repeat("x", {HUGE})))', '"os"; "strings"'),
            "subprocess": go(
                f'\tc := exec.Command("sh", "-c", "{YES}")\n\tc.Stdout = os.Stdout\n\tc.Run()', '"os"; "os/exec"'
            ),
        },
        memory_bomb=MEMORY_BOMBS["go"],
        exits={
            "exit": (go("\tos.Exit(3)", '"os"'), "3"),
            "kill": (go("\tsyscall.Kill(os.Getppid(), 9)", '"os"; "syscall"'), "signal 9"),
        },
        fork_bomb=go(f'\texec.Command("bash", "-c", "{FORK_BOMB}").Start()', '"os/exec"'),
    ),
    "cpp": Case(
        say=SAY["cpp"],
        said=SAID,
        keep=None,
        loop=cpp("    for (;;) {}"),
        print_loop=cpp('    for (;;) std::puts("' + "x" * 100 + '");'),
        writers={
            "print": cpp(f"    std::string s({HUGE}, 'x');\n    std::fputs(s.c_str(), stdout);"),
            "raw": cpp(f"    std::string s({HUGE}, 'x');\n    (void)!write(1, s.data(), s.size());"),
            "system": cpp(f'    return std::system("{YES}") ? 1 : 0;'),
        },
        memory_bomb=MEMORY_BOMBS["cpp"],
        exits={
            "exit": (cpp("    std::exit(3);"), "3"),
            "kill": (cpp("    kill(getppid(), 9);"), "signal 9"),
        },
        fork_bomb=cpp(f"    return std::system(\"bash -c '{FORK_BOMB}' &\");"),
    ),
    "ruby": Case(
        say=SAY["ruby"],
        said=SAID,
        keep=("kept = 41", "puts kept + 1"),
        loop="loop {}",
        print_loop="loop { puts 'x' * 100 }",
        writers={
            "print": f"puts 'x' * {HUGE}",
            "raw": f"$stdout.syswrite('x' * {HUGE})",
            "system": f"system({YES!r})",
        },
        memory_bomb=MEMORY_BOMBS["ruby"],
        exits={
            "exit": ("exit!(3)", "code 3"),
            "exec": ("exec('sh', '-c', 'exit 0')", "exited"),
            "kill": ("Process.kill(9, Process.pid)", "signal 9"),
        },
        fork_bomb=f"spawn('bash', '-c', {FORK_BOMB!r})",
    ),
}
assert set(CASES) == set(PROFILES)


def params(test: str, items: list[tuple[str, str]] | None = None) -> list[Any]:
    """``pytest.param`` of every kernel (and item), marked xfail (strict) where
    that kernel's case names the gap."""
    out = []
    for kernel, case in CASES.items():
        for item in [None] if items is None else [i for k, i in items if k == kernel]:
            key = test if item is None else f"{test}/{item}"
            why = case.xfail.get(key) or case.xfail.get(test)
            at_times = case.xfail_at_times.get(key) or case.xfail_at_times.get(test)
            marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
            marks += [pytest.mark.xfail(strict=False, reason=at_times)] if at_times else []
            values = kernel if item is None else (kernel, item)
            out.append(pytest.param(values, marks=marks, id=key.replace(test, kernel, 1) if item else kernel))
    return out


@pytest.fixture(scope="module")
def gateway(docker_client: docker.DockerClient) -> Iterator[RunningGateway]:
    images = {
        n: os.environ[f"KERNELGW_IMAGE_{n.upper()}"] for n in CASES if f"KERNELGW_IMAGE_{n.upper()}" in os.environ
    }
    gw = start_gateway(
        gateway_settings(
            gateway_name=f"t{os.getpid()}-promises",
            kernels=list(CASES),
            kernel_images=images,
            max_output_bytes=OUTPUT_CAP,
            interrupt_grace_s=5,
        )
    )
    yield gw
    gw.stop()
    assert_nothing_left(docker_client, gw.settings.gateway_name)


@pytest.fixture(scope="module")
def http(gateway: RunningGateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=180) as client:
        yield client


class Session:
    def __init__(self, http: httpx.Client, kernel: str, **options: Any) -> None:
        self.http, self.kernel, self.case = http, kernel, CASES[kernel]
        resp = http.post("/v1/sessions", json={"kernel": kernel, **options})
        assert resp.status_code == 201, f"{kernel}: {resp.text}"
        self.id = resp.json()["id"]

    def run(self, code: str, **extra: Any) -> dict[str, Any]:
        return run(self.http, self.id, code, **extra)

    def state(self) -> str:
        return str(self.http.get(f"/v1/sessions/{self.id}").json()["state"])

    def keep(self) -> None:
        if self.case.keep is not None:
            assert_ok(self.run(self.case.keep[0]), self.kernel)

    def kept(self) -> None:
        """What :meth:`keep` defined is there, and the cell says nothing else."""
        if self.case.keep is not None:
            assert out(assert_ok(self.run(self.case.keep[1]), self.kernel)) == "42\n"

    def clean(self) -> None:
        """The next cell runs and says exactly what it prints: nothing of an ended cell."""
        result = assert_ok(self.run(self.case.say), self.kernel)
        assert out(result) == self.case.said, f"{self.kernel}: an ended cell's output in the next: {result['events']}"
        assert not [e for e in result["events"] if e["type"] in ("error", "truncated")], result["events"]

    def after_loss(self, end: dict[str, Any]) -> None:
        """As Python's session after its kernel is lost: the next cell runs, or
        the session is ``dead``, its ``done`` said to restart, and a restart
        brings it back."""
        if self.state() == "dead":
            assert "restart" in (end["reason"] or ""), end
            resp = self.http.post(f"/v1/sessions/{self.id}/restart")
            assert resp.status_code == 200 and resp.json()["state"] == "idle", resp.text
        self.clean()

    def delete(self) -> None:
        self.http.delete(f"/v1/sessions/{self.id}")


def done(result: dict[str, Any]) -> dict[str, Any]:
    last: dict[str, Any] = result["events"][-1]
    assert last["type"] == "done", result["events"]
    return last


def out(result: dict[str, Any]) -> str:
    return "".join(e["text"] for e in result["events"] if e["type"] == "stream" and e["name"] == "stdout")


def assert_ok(result: dict[str, Any], kernel: str) -> dict[str, Any]:
    assert done(result)["status"] == "ok", f"{kernel}: {result['events'][-3:]}"
    return result


def truncated(result: dict[str, Any]) -> bool:
    return any(e["type"] == "truncated" for e in result["events"])


@pytest.mark.parametrize("kernel", params("loops"))
def test_endless_loops_are_interrupted_and_the_state_survives(http: httpx.Client, kernel: str) -> None:
    s = Session(http, kernel)
    try:
        s.keep()
        for code, printing in ((s.case.loop, False), (s.case.print_loop, True)):
            result = s.run(code, timeout=TIMEOUT_S)
            end = done(result)
            assert end["status"] == "timeout" and end["state_lost"] is False, f"{kernel}: {end}"
            if printing:  # capped, or all of it arrived (a slow printer's 3 s)
                size = len(out(result).encode())
                assert truncated(result) or 0 < size < OUTPUT_CAP, f"{kernel}: {size} bytes: {result['events'][-3:]}"
            s.kept()
            s.clean()
    finally:
        s.delete()


WRITERS = [(k, w) for k, c in CASES.items() for w in c.writers]


@pytest.mark.parametrize("writer", params("huge_output", WRITERS))
def test_huge_output_through_every_writer_arrives_capped(http: httpx.Client, writer: tuple[str, str]) -> None:
    kernel, how = writer
    s = Session(http, kernel)
    try:
        result = s.run(s.case.writers[how], timeout=WRITE_TIMEOUT_S)
        assert done(result)["status"] == "ok", f"{kernel} {how}: {result['events'][-3:]}"
        size = len(out(result).encode())
        assert truncated(result), f"{kernel} {how}: {size} bytes of stdout and no truncated event"
        assert size >= OUTPUT_CAP // 2, f"{kernel} {how}: only {size} bytes arrived"
        s.clean()
    finally:
        s.delete()


@pytest.mark.parametrize("kernel", params("memory_bomb"))
def test_a_memory_bomb_ends_the_cell_and_the_session_goes_on(http: httpx.Client, kernel: str) -> None:
    s = Session(http, kernel, memory_mb=BOMB_MEMORY_MB)
    try:
        s.keep()
        result = s.run(s.case.memory_bomb, timeout=120)
        end = done(result)
        if end["status"] == "error" and PROFILES[kernel].keeps_state:
            # the language caught it (Java's OutOfMemoryError): the state must really be there
            assert end["state_lost"] is False, end
            s.kept()
        elif end["status"] == "error":
            # a whole program per cell: that program died, the kernel did not
            assert "memory" in str(result["events"]).lower(), f"{kernel}: the cause is not named: {result['events']}"
        else:
            assert end["status"] == "dead" and end["state_lost"] is True, f"{kernel}: {end}"
            assert "out-of-memory" in (end["reason"] or ""), end
            s.after_loss(end)
        s.clean()
    finally:
        s.delete()


EXITS = [(k, how) for k, c in CASES.items() for how in c.exits]


@pytest.mark.parametrize("exit", params("exit", EXITS))
def test_the_kernel_process_ending_ends_the_cell_with_its_cause(http: httpx.Client, exit: tuple[str, str]) -> None:
    kernel, how = exit
    code, cause = CASES[kernel].exits[how]
    s = Session(http, kernel)
    try:
        s.keep()
        result = s.run(code, timeout=30)
        end = done(result)
        said = f"{end['reason']} {result['events']}"
        assert end["status"] in ("dead", "error"), f"{kernel} {how}: {end}"
        assert cause in said, f"{kernel} {how}: the cause ({cause}) is not named: {end}"
        if PROFILES[kernel].keeps_state:
            assert end["state_lost"] is True, f"{kernel} {how}: {end}"
        s.after_loss(end)
    finally:
        s.delete()


@pytest.mark.parametrize("kernel", params("fork_bomb"))
def test_a_background_fork_bomb_is_held_and_the_session_goes_on(http: httpx.Client, kernel: str) -> None:
    s = Session(http, kernel)
    try:
        result = s.run(s.case.fork_bomb, timeout=30)
        end = done(result)
        if end["status"] == "dead":
            assert end["state_lost"] is True, end
            s.after_loss(end)
        else:
            assert end["status"] in ("ok", "error", "timeout"), end
            s.clean()
    finally:
        s.delete()
