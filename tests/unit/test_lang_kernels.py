"""The pure parts of kernelgw's own kernels (images/python/kernelgw_kernel/lang_*.py):
compiler diagnostics and program failures as Jupyter errors, Go's package
clause, and the pipe pump that streams a child's output while it runs. The
kernels themselves run in their images (tests/integration/languages)."""

from __future__ import annotations

import asyncio
import importlib
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.local_backend import IMAGE_HELPERS


@pytest.fixture(scope="module")
def modules() -> Iterator[dict[str, ModuleType]]:
    sys.path.insert(0, str(IMAGE_HELPERS))
    try:
        yield {
            name: importlib.import_module(f"kernelgw_kernel.{name}")
            for name in ("lang_kernel", "lang_go", "lang_cpp", "lang_ruby")
        }
    finally:
        sys.path.remove(str(IMAGE_HELPERS))


@pytest.fixture
def base(modules: dict[str, ModuleType]) -> ModuleType:
    return modules["lang_kernel"]


@pytest.fixture
def go(modules: dict[str, ModuleType]) -> ModuleType:
    return modules["lang_go"]


@pytest.fixture
def cpp(modules: dict[str, ModuleType]) -> ModuleType:
    return modules["lang_cpp"]


# ------------------------------------------------------------------------ Go
def test_go_cell_without_package_clause_gets_one_on_its_first_line(go: ModuleType) -> None:
    source, prefixed = go.prepare_source('import "fmt"\nfunc main() { fmt.Println(1) }')
    assert prefixed and source == 'package main; import "fmt"\nfunc main() { fmt.Println(1) }'
    assert source.count("\n") == 1  # line numbers unchanged
    code = "// a program\npackage main\n\nfunc main() {}\n"
    assert go.prepare_source(code) == (code, False)
    # a package clause in a comment or a string is none
    assert go.prepare_source("/*\npackage foo\n*/\nfunc main() { _ = `\npackage x` }")[1] is True


def test_go_build_errors_name_the_first_diagnostic(go: ModuleType) -> None:
    output = "# command-line-arguments\n./main.go:7:2: undefined: boomFromGo\n./main.go:8:6: x declared but not used\n"
    err = go.parse_build_output(output)
    assert (err.ename, err.evalue) == ("CompileError", "main.go:7:2: undefined: boomFromGo")
    assert err.traceback == ["main.go:7:2: undefined: boomFromGo", "main.go:8:6: x declared but not used"]


def test_go_columns_on_a_prefixed_first_line_are_the_cells(go: ModuleType) -> None:
    prefix = len(go.PACKAGE_PREFIX)
    err = go.parse_build_output(f"# command-line-arguments\n./main.go:1:{prefix + 5}: undefined: y\n", prefixed=True)
    assert err.evalue == "main.go:1:5: undefined: y"
    assert go.parse_build_output("./main.go:2:3: undefined: y\n", prefixed=True).evalue == "main.go:2:3: undefined: y"


def test_go_build_failure_without_diagnostics_keeps_its_text(go: ModuleType) -> None:
    err = go.parse_build_output("main.go:3:8: package github.com/x/y is not in GOROOT\n")
    assert err.evalue.startswith("main.go:3:8: package github.com/x/y")
    other = go.parse_build_output("go: cannot find main module\n")
    assert other.evalue == "go: cannot find main module" and other.ename == "CompileError"
    assert go.parse_build_output("").evalue == "go build failed"


def test_go_panics_and_fatal_errors_are_named(go: ModuleType) -> None:
    stderr = (
        "panic: runtime error: index out of range [5] with length 1\n\n"
        "goroutine 1 [running]:\nmain.main()\n\tmain.go:2 +0x1d\n\n"
        "goroutine 5 [sleep]:\nmain.other()\n"
    )
    err = go.parse_runtime_error(2, stderr)
    assert (err.ename, err.evalue) == ("panic", "runtime error: index out of range [5] with length 1")
    assert err.traceback[-2] == "\tmain.go:2 +0x1d" and err.traceback[-1] == "exit status 2"
    assert not any("goroutine 5" in line for line in err.traceback)
    dead = go.parse_runtime_error(
        2, "fatal error: all goroutines are asleep - deadlock!\n\ngoroutine 1 [chan receive]:\n"
    )
    assert (dead.ename, dead.evalue) == ("fatal error", "all goroutines are asleep - deadlock!")
    plain = go.parse_runtime_error(3, "some output\n")
    assert (plain.ename, plain.evalue) == ("ExitCode", "the program exited with code 3")


# ----------------------------------------------------------------------- C++
def test_cpp_compile_error_is_the_first_error(cpp: ModuleType) -> None:
    output = (
        "main.cpp: In function \u2018int main()\u2019:\n"
        "main.cpp:6:5: error: \u2018boom_from_cpp\u2019 was not declared in this scope\n"
        "    6 |     boom_from_cpp();\n"
        "      |     ^~~~~~~~~~~~~\n"
        "main.cpp:7:5: error: \u2018y\u2019 was not declared in this scope\n"
    )
    err = cpp.parse_compile_output(output)
    assert (err.ename, err.evalue) == (
        "CompileError",
        "main.cpp:6:5: \u2018boom_from_cpp\u2019 was not declared in this scope",
    )
    assert err.traceback[0] == "main.cpp: In function \u2018int main()\u2019:" and len(err.traceback) == 5
    fatal = cpp.parse_compile_output("main.cpp:1:10: fatal error: nope.h: No such file or directory\n")
    assert fatal.evalue == "main.cpp:1:10: nope.h: No such file or directory"


def test_cpp_link_error_is_the_undefined_reference(cpp: ModuleType) -> None:
    output = (
        "/usr/bin/ld: /tmp/kernelgw-cpp-x/ccdJxOSF.o: in function `main':\n"
        "main.cpp:(.text.startup+0x1): undefined reference to `foo()'\n"
        "collect2: error: ld returned 1 exit status\n"
    )
    err = cpp.parse_compile_output(output)
    assert (err.ename, err.evalue) == ("CompileError", "undefined reference to `foo()'")
    assert err.traceback[-1] == "collect2: error: ld returned 1 exit status"


def test_cpp_uncaught_exception_is_named_by_its_type(cpp: ModuleType) -> None:
    stderr = "partial output\nterminate called after throwing an instance of 'std::runtime_error'\n  what():  boom\n"
    err = cpp.parse_runtime_error(-signal.SIGABRT, stderr)
    assert (err.ename, err.evalue) == ("std::runtime_error", "boom")
    assert err.traceback[-1] == "Signal: the program was killed by SIGABRT (signal 6)"
    thrown_int = cpp.parse_runtime_error(-6, "terminate called after throwing an instance of 'int'\n")
    assert (thrown_int.ename, thrown_int.evalue) == ("int", "uncaught exception")
    segv = cpp.parse_runtime_error(-signal.SIGSEGV, "")
    assert (segv.ename, segv.evalue) == ("Signal", "the program was killed by SIGSEGV (signal 11)")


def test_cpp_compiler_argv_uses_the_precompiled_headers_when_present(
    cpp: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    support = tmp_path
    (support / "pch").mkdir()
    (support / "linebuf.o").write_bytes(b"")
    monkeypatch.setattr(cpp, "SUPPORT_DIR", str(support))
    argv = cpp.CppKernel.compile_argv(object.__new__(cpp.CppKernel))
    assert argv[0] == "g++" and argv[1 : 1 + len(cpp.CXXFLAGS)] == cpp.CXXFLAGS
    assert ["-I", f"{support}/pch"] == argv[argv.index("-I") : argv.index("-I") + 2]
    assert argv[-1] == f"{support}/linebuf.o"


# ---------------------------------------------------------------- the base
def test_exit_errors(base: ModuleType) -> None:
    assert base.exit_error(1).ename == "ExitCode"
    killed = base.exit_error(-signal.SIGKILL)
    assert killed.ename == "Signal" and "out of memory?" in killed.evalue
    assert "out of memory" not in base.exit_error(-signal.SIGKILL, interrupted=True).evalue
    err = base.interrupted_error("the program")
    assert (err.ename, err.evalue) == ("KeyboardInterrupt", "the program was interrupted")


def test_traceback_lines_are_capped(base: ModuleType) -> None:
    lines = [str(i) for i in range(1000)]
    capped = base.cap_lines(lines, 10)
    assert len(capped) == 10 and capped[:8] == lines[:8] and capped[-1] == "999" and "cut" in capped[8]
    err = base.CellError("E", "v", lines)
    assert len(err.content()["traceback"]) == base.MAX_TRACEBACK_LINES


def test_capture_and_tail_keep_what_they_should(base: ModuleType) -> None:
    capture = base.Capture(limit=10)
    capture("stderr", "0123456")
    capture("stdout", "789abc")
    assert capture.text() == "0123456789\n... [3 characters cut]\n"
    tail = base.Tail(5)
    for part in ("abc", "defgh", "ij"):
        tail.add(part)
    assert tail.text() == "fghij"


def test_noexec_build_directory_is_explained(base: ModuleType) -> None:
    mounts = "tmpfs /tmp tmpfs rw,nosuid,nodev,noexec,size=262144k 0 0\ntmpfs /tmp/x tmpfs rw,exec 0 0\n"
    assert "noexec" in base.check_exec_mount("/tmp/kernelgw-go-1", mounts)
    assert base.check_exec_mount("/tmp/x/build", mounts) is None
    assert base.check_exec_mount("/tmp/b", "tmpfs /tmp tmpfs rw,exec,nosuid,nodev 0 0\n") is None


def test_child_output_is_handed_on_while_the_child_runs(base: ModuleType) -> None:
    """The first line arrives before the child ends, not with its end."""
    got: list[tuple[float, str, str]] = []

    async def main() -> int:
        loop = asyncio.get_running_loop()
        proc, out_r, err_r = base.spawn(
            ["sh", "-c", "echo first; echo oops >&2; sleep 0.5; printf 'sec'; printf 'ond\\n'"],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
        )
        pump = base.OutputPump(
            loop, {"stdout": out_r, "stderr": err_r}, lambda n, t: got.append((time.monotonic(), n, t))
        )
        status: int = await loop.run_in_executor(None, proc.wait)
        await pump.finish(1.0)
        return status

    start = time.monotonic()
    assert asyncio.run(main()) == 0
    end = time.monotonic()
    assert "".join(t for _, n, t in got if n == "stdout") == "first\nsecond\n"
    assert "".join(t for _, n, t in got if n == "stderr") == "oops\n"
    first = next(at for at, n, t in got if t.startswith("first"))
    assert first - start < end - start - 0.3


def test_pump_decodes_utf8_split_across_reads_and_survives_bad_bytes(base: ModuleType) -> None:
    got: list[str] = []

    async def main() -> None:
        import os

        loop = asyncio.get_running_loop()
        r, w = os.pipe()
        pump = base.OutputPump(loop, {"stdout": r}, lambda n, t: got.append(t))
        data = "é€".encode()
        os.write(w, data[:1])
        await asyncio.sleep(0.05)
        os.write(w, data[1:] + b"\xff!")
        os.close(w)
        await pump.finish(1.0)

    asyncio.run(main())
    assert "".join(got) == "é€\ufffd!"


def test_group_leftovers_are_killed_and_the_pipes_end(base: ModuleType) -> None:
    """A program that leaves a background child holding its stdout does not keep
    the cell open: the group is killed when the program ends."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        proc, out_r, err_r = base.spawn(["sh", "-c", "sleep 30 & echo started"], cwd="/", env={"PATH": "/usr/bin:/bin"})
        pump = base.OutputPump(loop, {"stdout": out_r, "stderr": err_r}, lambda n, t: None)
        await loop.run_in_executor(None, proc.wait)
        t0 = time.monotonic()
        base.kill_group(proc.pid)
        await pump.finish(5.0)
        return time.monotonic() - t0

    assert asyncio.run(main()) < 2.0
