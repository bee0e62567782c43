"""kernelgw's Go kernel: every cell is a complete program (``package main``
with ``func main``), compiled and run; nothing is kept between cells.

``python -m kernelgw_kernel.lang_go -f CONNECTION_FILE``

The program is built in the kernel's build directory under /tmp (mounted
exec), with cgo off and no network (``GOPROXY=off``: only the standard
library). The image installed the standard library built for cgo off and an
importcfg naming its archives, so a cell is compiled and linked by Go's
compiler and linker directly (about 80 ms); what they cannot do alone (an
import that is not in the standard library, ``go:embed``) goes through ``go
build``, which also gives the clearer message. A cell without a package clause
gets ``package main;`` in front of its first line (line numbers stay right).
A build error is a ``CompileError`` (the first diagnostic as evalue, the
compiler's output as traceback); a panic, a fatal error or a non-zero exit
status fails the cell too.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from kernelgw_kernel.lang_kernel import CellError, CompiledKernel, exit_error, launch

PACKAGE_CLAUSE = re.compile(r"^\s*package\s+\w+", re.MULTILINE)
PACKAGE_PREFIX = "package main; "
DIAGNOSTIC = re.compile(r"^(?:\./)?(?P<file>[^\s:]+\.go):(?P<line>\d+)(?::(?P<col>\d+))?: (?P<msg>.*)$")


def strip_comments(code: str) -> str:
    """``code`` without Go comments and string literals' contents (enough to
    look for a package clause)."""
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|`[^`]*`', " ", code, flags=re.DOTALL)


def prepare_source(code: str) -> tuple[str, bool]:
    """The file to build and whether ``package main; `` was put in front."""
    if PACKAGE_CLAUSE.search(strip_comments(code)):
        return code, False
    return PACKAGE_PREFIX + code, True


def parse_build_output(output: str, prefixed: bool = False) -> CellError:
    """``go build``'s failure as a Jupyter error: evalue is the first diagnostic
    (``main.go:5:2: undefined: x``), traceback the diagnostics. When the source
    was prefixed, columns on line 1 are given back as the cell has them."""
    lines: list[str] = []
    first = ""
    for raw in output.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("# command-line-arguments"):
            continue
        m = DIAGNOSTIC.match(line)
        if m:
            col = m.group("col")
            if prefixed and m.group("line") == "1" and col is not None and int(col) > len(PACKAGE_PREFIX):
                col = str(int(col) - len(PACKAGE_PREFIX))
            where = f"{m.group('file')}:{m.group('line')}" + (f":{col}" if col is not None else "")
            line = f"{where}: {m.group('msg')}"
            first = first or line
        lines.append(line)
    if not first:
        first = lines[0] if lines else "go build failed"
    return CellError("CompileError", first, lines or [first])


def parse_runtime_error(returncode: int, stderr_tail: str, interrupted: bool = False) -> CellError:
    """A failed program's error: a panic (``panic``, its message), a runtime
    fatal error (``fatal error``), else the exit status or signal."""
    lines = stderr_tail.splitlines()
    for i, line in enumerate(lines):
        for kind in ("panic", "fatal error"):
            if line.startswith(kind + ": "):
                message = line[len(kind) + 2 :]
                if message.endswith(" [recovered]"):
                    message = message[: -len(" [recovered]")]
                # the first goroutine's frames, up to the blank line after them
                block = [line]
                for more in lines[i + 1 : i + 40]:
                    block.append(more)
                block = _first_goroutine(block)
                status = f"exit status {returncode}" if returncode >= 0 else f"killed by signal {-returncode}"
                return CellError(kind, message, [*block, status])
    return exit_error(returncode, interrupted)


def _first_goroutine(block: list[str]) -> list[str]:
    out: list[str] = []
    seen_goroutine = False
    for line in block:
        if line.startswith("goroutine "):
            if seen_goroutine:
                break
            seen_goroutine = True
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return out


TOOLCHAIN = os.environ.get("KERNELGW_GO_TOOLCHAIN", "/opt/kernelgw/go/toolchain.json")
"""Written by images/go/install.sh: the Go version, its compiler and linker, and
an importcfg naming every standard library archive."""
FALLBACK = re.compile(r"could not import|go:embed|cgo")
"""What the compiler alone cannot do: `go build` says it better (or does it)."""


NO_MODULES = "only Go's standard library is available: there is no network to download modules from"


def load_toolchain(path: str = TOOLCHAIN) -> dict[str, str]:
    """The image's toolchain description; empty when there is none or it names
    tools that are not there (then every cell goes through `go build`)."""
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(info, dict):
        return {}
    tools = [str(info.get(k, "")) for k in ("compile", "link", "importcfg")]
    if not all(tools) or not all(os.path.exists(t) for t in tools):
        return {}
    return {str(k): str(v) for k, v in info.items()}


def go_version() -> str:
    root = os.environ.get("GOROOT") or "/usr/lib/go"
    for candidate in (Path(root, "VERSION"), Path("/usr/lib/go/VERSION")):
        try:
            text = candidate.read_text().split()[0]
            return text.removeprefix("go")
        except (OSError, IndexError):
            continue
    return ""


class GoKernel(CompiledKernel):
    implementation = "kernelgw-go"
    language_name = "go"
    source_name = "main.go"
    stateful = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.toolchain = load_toolchain()
        self.version = self.toolchain.get("version") or go_version()
        self._prefixed = False

    @property
    def language_info(self) -> dict[str, Any]:  # type: ignore[override]  # ipykernel: a plain attribute
        return {
            "name": "go",
            "version": self.version,
            "mimetype": "text/x-go",
            "file_extension": ".go",
            "codemirror_mode": "go",
            "pygments_lexer": "go",
        }

    @property
    def banner(self) -> str:  # type: ignore[override]  # ipykernel: a plain attribute
        return (
            f"Go {self.version} (kernelgw): each cell is a complete program (package main with func main), "
            "built and run on its own; nothing is kept between cells. Standard library only."
        )

    def prepare_source(self, code: str) -> str:
        source, self._prefixed = prepare_source(code)
        return source

    def compile_env(self) -> dict[str, str]:
        env = self.child_env()
        env.setdefault("GOCACHE", os.path.join(self.build_dir, "cache"))
        env.setdefault("GOPATH", os.path.join(self.build_dir, "gopath"))
        env["GOTMPDIR"] = self.build_dir
        env["CGO_ENABLED"] = "0"
        env["GOPROXY"] = "off"
        env["GOSUMDB"] = "off"
        env["GOTOOLCHAIN"] = "local"
        env.setdefault("GOFLAGS", "-mod=mod")
        return env

    def compile_argv(self) -> list[str]:
        # -trimpath for the cell's package only (all of them would make the standard
        # library stale): a panic's frames say main.go:5, not the build directory
        return [
            "go",
            "build",
            f"-gcflags=-trimpath={self.build_dir}",
            "-ldflags=-s -w",
            "-o",
            self.program_name,
            self.source_name,
        ]

    def direct_steps(self) -> list[list[str]]:
        """The compiler and the linker run directly on the image's prebuilt
        standard library: about 80 ms for a hello world, where `go build` takes
        250 ms (it hashes the sources of every package the program imports to
        see that none is stale). -s -w: no symbol table and DWARF (a panic still
        names files and lines), which halves the link."""
        tc = self.toolchain
        archive = "main.a"
        return [
            [
                tc["compile"],
                "-o",
                archive,
                "-p",
                "main",
                "-complete",
                "-pack",
                "-importcfg",
                tc["importcfg"],
                "-trimpath",
                self.build_dir,
                self.source_name,
            ],
            [tc["link"], "-s", "-w", "-buildmode=exe", "-importcfg", tc["importcfg"], "-o", self.program_name, archive],
        ]

    async def build(self) -> None:
        if self.toolchain:
            status, output = 0, ""
            for argv in self.direct_steps():
                status, output = await self.compile_step(argv)
                if status != 0:
                    break
            if status == 0:
                return
            if not FALLBACK.search(output):
                raise self.compile_error(output)
        status, output = await self.compile_step(self.compile_argv())
        if status != 0:
            raise self.explained(self.compile_error(output))

    def explained(self, error: CellError) -> CellError:
        """What a build error means here, where it is not plain."""
        text = "\n".join(error.traceback)
        if "no Go source files" in text:
            error.evalue = 'cgo is not available: there is no C compiler (CGO_ENABLED=0); import "C" cannot build'
            error.traceback.append(error.evalue)
        elif "cannot find module providing package" in text or "is not in GOROOT" in text:
            error.traceback.append(NO_MODULES)
        return error

    def compile_error(self, output: str) -> CellError:
        return parse_build_output(output, self._prefixed)

    def runtime_error(self, returncode: int, stderr_tail: str) -> CellError:
        return parse_runtime_error(returncode, stderr_tail, self._interrupted)


def main() -> None:
    launch(GoKernel)


if __name__ == "__main__":
    main()
