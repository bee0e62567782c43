"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def output_dir() -> Path:
    """Where tests leave artefacts for people to look at (screenshots, notebooks)."""
    path = Path(os.environ.get("KERNELGW_TEST_OUTPUT", "test-output"))
    path.mkdir(parents=True, exist_ok=True)
    return path
