"""The packaging tests: the wheel's extras installed into fresh virtualenvs."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "packaging: installs the wheel into fresh virtualenvs (pip, the lock as constraints); no Docker engine",
    )
