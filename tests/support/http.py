"""The HTTP client fixture, made in one place for every test gateway.

Why a factory and not one fixture in tests/conftest.py: the gateways differ in
scope (the shared session-wide one, module-wide ones with their own settings),
and a session-scoped ``http`` that depended on an overridden ``gateway`` would
be cached with the first directory's gateway and handed to the next.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import httpx
import pytest

Scope = Literal["session", "package", "module", "class", "function"]


def http_fixture(gateway: str = "gateway", *, scope: Scope = "session", timeout: float = 120) -> Any:
    """An ``http`` fixture: an ``httpx.Client`` on the gateway fixture named ``gateway``
    (anything with a ``url``), closed when its scope ends."""

    @pytest.fixture(scope=scope, name="http")
    def http(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
        gw = request.getfixturevalue(gateway)
        with httpx.Client(base_url=gw.url, timeout=timeout) as client:
            yield client

    return http
