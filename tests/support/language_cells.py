"""Cells in every kernel's language that the promise suite
(``tests/integration/languages/test_promises.py``) and ``benchmarks/bench_languages.py``
both run: a cell that prints ``said``, and a memory bomb, with the session memory
limit the bombs are run under. Plain data (no pytest, no gateway), so a benchmark
can import it as ``benchmarks/bench_crash.py`` imports ``crash_loop``.
"""

from __future__ import annotations

BOMB_MEMORY_MB = 384
"""A memory bomb's session limit (``memory_mb``): every kernel starts under it."""


def go(body: str, imports: str = '"fmt"') -> str:
    """A Go cell: a whole program whose ``main`` is ``body``."""
    return f"package main\n\nimport ({imports})\n\nfunc main() {{\n{body}\n}}\n"


def cpp(body: str) -> str:
    """A C++ cell: a whole program whose ``main`` is ``body``."""
    return (
        "#include <cstdio>\n#include <cstdlib>\n#include <string>\n#include <vector>\n"
        "#include <unistd.h>\n#include <signal.h>\n\n"
        f"int main() {{\n{body}\n}}\n"
    )


SAID = "said\n"
SAY: dict[str, str] = {
    "python3": "print('said')",
    "deno": "console.log('said');",
    "ir": "cat('said\\n')",
    "bash": "echo said",
    "java": 'System.out.println("said");',
    "go": go('\tfmt.Println("said")'),
    "cpp": cpp('    std::puts("said");'),
    "ruby": "puts 'said'",
}
"""By kernel: a cell that prints ``SAID`` and nothing else."""

MEMORY_BOMBS: dict[str, str] = {
    "python3": "chunks = []\nwhile True:\n    chunks.append(b'x' * (50 * 1024 * 1024))",
    "deno": "const chunks: Uint8Array[] = [];\nwhile (true) chunks.push(new Uint8Array(50 * 1024 * 1024).fill(1));",
    "ir": "chunks <- list()\nrepeat chunks[[length(chunks) + 1]] <- runif(5e6)",
    "bash": "s=x; while true; do s=$s$s; done",
    "java": "java.util.List<long[]> chunks = new java.util.ArrayList<>();\nwhile (true) chunks.add(new long[5_000_000]);",
    "go": go(
        "\tvar chunks [][]byte\n\tfor {\n\t\tb := make([]byte, 50<<20)\n\t\tfor i := range b {\n\t\t\tb[i] = 1\n"
        "\t\t}\n\t\tchunks = append(chunks, b)\n\t}",
        "",
    ),
    "cpp": cpp("    std::vector<std::vector<char>> chunks;\n    for (;;) chunks.emplace_back(50 << 20, 'x');"),
    "ruby": "chunks = []\nloop { chunks << 'x' * (50 * 1024 * 1024) }",
}
"""By kernel: a cell that allocates (and touches) memory until something stops it."""
