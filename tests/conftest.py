"""Fixtures shared by every test directory, and CI's rule on skips: under
``CI=true`` a skip nobody planned fails the test (``pytest_runtest_makereport``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

PLANNED_SKIP_MARKER = "planned_skip"
"""``@pytest.mark.planned_skip(reason)``: a test whose skip CI expects, with why.
None is planned today: every skip in the suite (no PostgreSQL, not root, an
extra not installed) means CI did not set up what the lock and scripts/test.sh
promise, and would hide that behind a green run."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{PLANNED_SKIP_MARKER}(reason): a skip CI expects (see tests/conftest.py); any other fails under CI"
    )


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"true", "1"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under CI, a skip that is not planned (no ``planned_skip`` marker) is
    reported as a failure naming its reason: the condition that caused it (no
    PostgreSQL, not root, a package of the lock missing) is CI's to fix. An
    expected failure (xfail) is not a skip and is left as it is."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or not _in_ci():
        return
    if item.get_closest_marker(PLANNED_SKIP_MARKER) is not None:
        return
    _fail_the_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """The same for a whole module skipped while collected (a module-level
    ``importorskip`` of a package the lock installs)."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if report.skipped and _in_ci():
        _fail_the_skip(report)


def _fail_the_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under CI without being planned: {reason}\n"
        "Set up what the test needs in CI (scripts/test.sh, the lock), or mark the test "
        f"@pytest.mark.{PLANNED_SKIP_MARKER}(reason) with why CI expects the skip (tests/conftest.py)."
    )


@pytest.fixture(scope="session")
def output_dir() -> Path:
    """Where tests leave artefacts for people to look at (screenshots, notebooks)."""
    path = Path(os.environ.get("KERNELGW_TEST_OUTPUT", "test-output"))
    path.mkdir(parents=True, exist_ok=True)
    return path
