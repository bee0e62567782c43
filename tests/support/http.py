"""The HTTP client fixture, made in one place for every test gateway.

Why a factory and not one fixture in tests/conftest.py: the gateways differ in
scope (the shared session-wide one, module-wide ones with their own settings),
and a session-scoped ``http`` that depended on an overridden ``gateway`` would
be cached with the first directory's gateway and handed to the next.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import pytest

Scope = Literal["session", "package", "module", "class", "function"]


def http_fixture(gateway: str = "gateway", *, scope: Scope = "session", timeout: float = 120) -> Any:
    """An ``http`` fixture: an ``httpx.Client`` on the gateway fixture named ``gateway``
    (anything with a ``url``), closed when its scope ends.

    The gateway is a declared argument (through the signature), not a
    ``request.getfixturevalue`` look-up, so pytest sees the dependency: a
    parametrized gateway (one per database) parametrizes the tests that ask only
    for ``http``."""

    def http(**fixtures: Any) -> Iterator[httpx.Client]:
        with httpx.Client(base_url=fixtures[gateway].url, timeout=timeout) as client:
            yield client

    http.__signature__ = inspect.Signature(  # type: ignore[attr-defined]  # read by pytest
        [inspect.Parameter(gateway, inspect.Parameter.KEYWORD_ONLY)]
    )
    return pytest.fixture(scope=scope, name="http")(http)


async def execute(http: httpx.AsyncClient, sid: str, code: str, **extra: Any) -> dict[str, Any]:
    """Blocking execute on an in-process gateway; the JSON body (status, events, ...)."""
    resp = await http.post(f"/v1/sessions/{sid}/execute", json={"code": code, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]
