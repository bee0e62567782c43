"""CI's rule on skips (tests/conftest.py): under ``CI=true`` a skip nobody planned
fails the run, whether it comes from a test, a fixture, a ``skipif`` mark or a
module-level ``importorskip``; a ``planned_skip`` test and an xfail do not.
Outside CI every skip stays a skip. Checked on a real pytest run in a subprocess
with the suite's own conftest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

SKIPPING = """
import pytest

def test_unplanned():
    pytest.skip("no thing")

@pytest.mark.planned_skip("the reason CI expects it")
def test_planned():
    pytest.skip("planned thing")

@pytest.mark.skipif(True, reason="a mark")
def test_marked():
    pass

@pytest.fixture
def needs():
    pytest.skip("a fixture's condition")

def test_fixture(needs):
    pass

@pytest.mark.xfail(strict=True, reason="known")
def test_expected_failure():
    assert False

def test_passing():
    pass
"""


def outcomes(tmp_path: Path, ci: str | None, files: dict[str, str]) -> str:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_an_unplanned_skip_fails(tmp_path: Path, ci: str) -> None:
    out = outcomes(tmp_path, ci, {"test_skipping.py": SKIPPING})
    assert "FAILED test_skipping.py::test_unplanned - skipped under CI without being planned" in out, out
    assert "ERROR test_skipping.py::test_marked - skipped under CI without being planned" in out, out
    assert "ERROR test_skipping.py::test_fixture - skipped under CI without being planned" in out, out
    assert "SKIPPED [1] test_skipping.py" in out and "planned thing" in out, out
    assert "XFAIL test_skipping.py::test_expected_failure" in out, out
    assert "PASSED test_skipping.py::test_passing" in out, out


def test_under_ci_a_module_skipped_at_collection_fails(tmp_path: Path) -> None:
    module = 'import pytest\npytest.importorskip("kgw_no_such_module")\n\ndef test_x():\n    pass\n'
    out = outcomes(tmp_path, "true", {"test_module.py": module})
    assert "ERROR test_module.py - skipped under CI without being planned" in out, out


def test_outside_ci_skips_stay_skips(tmp_path: Path) -> None:
    out = outcomes(tmp_path, None, {"test_skipping.py": SKIPPING})
    assert "1 passed, 4 skipped, 1 xfailed" in out, out
