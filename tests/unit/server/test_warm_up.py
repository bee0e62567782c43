"""The routes are built before the first request (kernelgw.server.warm_up)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest
from pydantic import TypeAdapter
from starlette.types import Message

from kernelgw.server import create_app
from kernelgw.server.warm_up import build_routes


def _adapters_built_by_a_request(app: Any, monkeypatch: pytest.MonkeyPatch) -> int:
    """How many pydantic adapters FastAPI makes while routing one request that
    matches no route (it walks past all of them: a router included into another,
    Jupyter's sessions under its kernels API, is built at that moment)."""
    made = 0
    original = TypeAdapter.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal made
        made += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(TypeAdapter, "__init__", counting)
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/no-such-route",
        "raw_path": b"/v1/no-such-route",
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": None,
        "server": None,
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app.router(scope, receive, send))
    monkeypatch.setattr(TypeAdapter, "__init__", original)
    assert sent and sent[0]["status"] == 404
    return made


FRESH = "KERNELGW_TEST_WARM_UP_FRESH"
"""Set in the interpreter the test starts for itself (see below)."""


def test_after_the_warm_up_a_first_request_builds_no_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """In an interpreter of its own: routes are module-level objects, and once any
    earlier test's app has routed a request, they are built for every app after."""
    if not os.environ.get(FRESH):
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{__file__}::{_this_test()}"],
            env={**os.environ, FRESH: "1"},
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert run.returncode == 0 and "1 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
        return
    cold = _adapters_built_by_a_request(create_app(), monkeypatch)
    assert cold > 0, "a cold app's first request built no route: the warm-up has nothing left to do"
    app = create_app()
    build_routes(app.router)
    assert _adapters_built_by_a_request(app, monkeypatch) == 0, f"a cold app built {cold}"


def _this_test() -> str:
    return test_after_the_warm_up_a_first_request_builds_no_route.__name__
