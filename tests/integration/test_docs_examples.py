"""The examples of the getting-started page (docs/getting-started.md) and of the
README run against a real gateway, as a reader would paste them, so the docs
cannot rot. A fenced block right after a ``<!-- example -->`` line is an example:
``bash`` blocks run in bash (curl and jq, ``set -euo pipefail``), ``python`` blocks
in this process; the gateway's address, ``127.0.0.1:8000`` / ``localhost:8000`` on
the page, is the test gateway's. Each runs in a fresh directory (a saved chart
lands there)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "docs" / "getting-started.md", ROOT / "README.md"]
MARKER = "<!-- example -->"


def examples(page: Path) -> list[tuple[str, str]]:
    """(language, code) of every fenced block that follows the marker line."""
    found = re.findall(re.escape(MARKER) + r"\n```(\w+)\n(.*?)\n```", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return [(language, code) for language, code in found]


CASES = [
    pytest.param(page, language, code, id=f"{page.name}-{index}-{language}")
    for page in PAGES
    for index, (language, code) in enumerate(examples(page))
]


def test_the_pages_have_examples() -> None:
    for page in PAGES:
        languages = {language for language, _ in examples(page)}
        assert {"bash", "python"} <= languages, f"{page.name}: no {MARKER} bash and python blocks found"


def _pointed_at(code: str, url: str) -> str:
    host_port = url.removeprefix("http://")
    code = code.replace("http://127.0.0.1:8000", url).replace("http://localhost:8000", url)
    return code.replace("127.0.0.1:8000", host_port).replace("localhost:8000", host_port)


@pytest.mark.parametrize(("page", "language", "code"), CASES)
def test_example_runs(
    page: Path, language: str, code: str, gateway_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = _pointed_at(code, gateway_url)
    monkeypatch.chdir(tmp_path)
    if language == "bash":
        for tool in ("curl", "jq"):
            if shutil.which(tool) is None:
                pytest.fail(f"the example needs {tool}: apt-get install {tool}", pytrace=False)
        done = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + code],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "KERNELGW_API_KEY": ""},
        )
        assert done.returncode == 0, (
            f"{page.name} example failed:\n{code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )
        assert done.stdout.strip(), f"{page.name} example printed nothing:\n{code}"
        assert "null" not in done.stdout.split(), f"{page.name} example printed null:\n{done.stdout}"
    elif language == "python":
        namespace: dict[str, object] = {"__name__": "__docs_example__"}
        exec(compile(code, f"<{page.name} example>", "exec"), namespace)
        if "chart.png" in code:
            assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG"), "the saved chart is not a PNG"
    else:
        pytest.fail(f"{page.name}: an example in {language!r}, which this test cannot run", pytrace=False)
