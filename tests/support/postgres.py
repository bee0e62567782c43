"""The test PostgreSQL server's URL, for the tests that run on SQLite and PostgreSQL."""

from __future__ import annotations

import os

import pytest

MISSING = (
    "KERNELGW_TEST_DATABASE_URL is not set: run scripts/ensure-postgres.sh and export the "
    "URL it prints (scripts/test.sh does both)"
)


def postgres_url() -> str:
    """The URL from ``KERNELGW_TEST_DATABASE_URL``; without one the test is skipped,
    or fails under CI, where PostgreSQL is always set up."""
    url = os.environ.get("KERNELGW_TEST_DATABASE_URL")
    if not url:
        if os.environ.get("CI") == "true":
            pytest.fail(MISSING, pytrace=False)
        pytest.skip(MISSING)
    return url
