"""kernelgw's C++ kernel: every cell is a complete program (with ``main``),
compiled with g++ and run; nothing is kept between cells.

``python -m kernelgw_kernel.lang_cpp -f CONNECTION_FILE``

g++ runs with ``-std=gnu++20 -O2 -pipe``. The image has precompiled headers
for ``<iostream>`` and ``<bits/stdc++.h>`` in a directory of its own that is
searched first: g++ uses one when it is the program's first include and
otherwise finds the real header as always (a hello world compiles in about
0.2 s instead of 0.7 s, ``bits/stdc++.h`` in 0.5 s instead of 4 s). Every
program is linked with a small object that makes stdout line-buffered, so
output streams while the program runs (as on a terminal).

A compile or link error is a ``CompileError`` (the first error as evalue, the
compiler's output as traceback); an uncaught exception is an error named by its
type with ``what()`` as evalue; a signal or a non-zero exit status fails the
cell too.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

from kernelgw_kernel.lang_kernel import CellError, CompiledKernel, exit_error, launch

SUPPORT_DIR = os.environ.get("KERNELGW_CPP_SUPPORT", "/opt/kernelgw/cpp")
"""Made by images/cpp/install.sh: ``pch/`` (precompiled headers) and ``linebuf.o``."""
STD = "gnu++20"
STD_VERSION = "20"
"""language_info's version: the C++ standard, as xeus-cling gives it (g++'s own
version is in the banner)."""
OPT = "-O2"
CXXFLAGS = [f"-std={STD}", OPT, "-pipe", "-fdiagnostics-color=never"]
"""The flags the precompiled headers were made with (install.sh uses the same)."""
ERROR = re.compile(r"^(?P<where>[^\s:][^:]*:\d+:\d+): (?:fatal )?error: (?P<msg>.*)$")
LINK_ERROR = re.compile(r"(undefined reference to|multiple definition of|cannot find -l)")
TERMINATE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']*)'")
WHAT = re.compile(r"^\s*what\(\):\s*(?P<msg>.*)$")


def parse_compile_output(output: str) -> CellError:
    """g++'s failure as a Jupyter error: evalue is the first error
    (``main.cpp:3:5: 'x' was not declared in this scope``) or the first link
    error, traceback the compiler's output lines."""
    lines = [line.rstrip() for line in output.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    first = ""
    for line in lines:
        m = ERROR.match(line)
        if m:
            first = f"{m.group('where')}: {m.group('msg')}"
            break
    if not first:
        for line in lines:
            m = LINK_ERROR.search(line)
            if m:
                first = line[m.start() :].strip()
                break
    if not first:
        for line in lines:
            if "error" in line:
                first = line.strip()
                break
    if not first:
        first = lines[0] if lines else "g++ failed"
    return CellError("CompileError", first, lines or [first])


def parse_runtime_error(returncode: int, stderr_tail: str, interrupted: bool = False) -> CellError:
    """An uncaught exception (``terminate called after throwing an instance of
    'std::runtime_error'`` and ``what():  boom``) is named by its type, with
    its message as evalue; otherwise the exit status or the signal."""
    lines = stderr_tail.splitlines()
    for i, line in enumerate(lines):
        m = TERMINATE.search(line)
        if m:
            message = ""
            block = [line.strip()]
            if i + 1 < len(lines):
                w = WHAT.match(lines[i + 1])
                if w:
                    message = w.group("msg")
                    block.append(lines[i + 1].rstrip())
            base = exit_error(returncode, interrupted)
            return CellError(m.group("type"), message or "uncaught exception", [*block, base.traceback[0]])
    return exit_error(returncode, interrupted)


def gxx_version() -> str:
    try:
        out = subprocess.run(["g++", "-dumpfullversion"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


class CppKernel(CompiledKernel):
    implementation = "kernelgw-cpp"
    language_name = "cpp"
    source_name = "main.cpp"
    stateful = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.version = gxx_version()

    @property
    def language_info(self) -> dict[str, Any]:  # type: ignore[override]  # ipykernel: a plain attribute
        return {
            "name": "c++",
            "version": STD_VERSION,
            "mimetype": "text/x-c++src",
            "file_extension": ".cpp",
            "codemirror_mode": "text/x-c++src",
            "pygments_lexer": "cpp",
        }

    @property
    def banner(self) -> str:  # type: ignore[override]  # ipykernel: a plain attribute
        return (
            f"C++ (g++ {self.version}, {STD} {OPT}) (kernelgw): each cell is a complete program with main, "
            "compiled and run on its own; nothing is kept between cells."
        )

    def compile_argv(self) -> list[str]:
        argv = ["g++", *CXXFLAGS]
        pch = os.path.join(SUPPORT_DIR, "pch")
        if os.path.isdir(pch):
            argv += ["-I", pch]
        argv += ["-o", self.program_name, self.source_name]
        linebuf = os.path.join(SUPPORT_DIR, "linebuf.o")
        if os.path.exists(linebuf):
            argv.append(linebuf)
        return argv

    def compile_env(self) -> dict[str, str]:
        env = self.child_env()
        env["TMPDIR"] = self.build_dir
        return env

    def compile_error(self, output: str) -> CellError:
        return parse_compile_output(output)

    def runtime_error(self, returncode: int, stderr_tail: str) -> CellError:
        return parse_runtime_error(returncode, stderr_tail, self._interrupted)


def main() -> None:
    launch(CppKernel)


if __name__ == "__main__":
    main()
