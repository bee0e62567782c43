"""The HTTP layer in-process: error shapes and status codes.

The backend here is an engine that is down, the one situation a unit test can
stand for honestly; everything that needs a kernel is in tests/integration.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from kernelgw.config import Settings
from kernelgw.errors import EngineUnavailable
from kernelgw.runtime.backends.base import EngineHealth, KernelHandle, KernelSpec, KernelState
from kernelgw.server import create_app


class EngineDown:
    async def start(self, spec: KernelSpec) -> KernelHandle:
        raise EngineUnavailable("The Docker engine does not answer.")

    async def stop(self, handle: KernelHandle) -> None: ...

    async def signal(self, handle: KernelHandle, signum: int) -> None: ...

    async def state(self, handle: KernelHandle, oom_seen: int = 0) -> KernelState:
        return KernelState(status="missing")

    def oom_kills(self, handle: KernelHandle) -> int:
        return 0

    async def seal(self, handle: KernelHandle) -> None: ...

    async def reap_orphans(self) -> list[str]:
        raise EngineUnavailable("The Docker engine does not answer.")

    async def list_kernels(self) -> list[object]:
        raise EngineUnavailable("The Docker engine does not answer.")

    async def keep_workspace(self, spec: KernelSpec) -> None:
        return None

    async def end_session(self, session_id: str) -> None:
        return None

    async def reap_except(self, keep: set[str]) -> list[str]:
        raise EngineUnavailable("The Docker engine does not answer.")

    async def health(self, image: str) -> EngineHealth:
        return EngineHealth(engine=False, image=False, detail="connection refused")

    async def close(self) -> None: ...


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(max_memory_mb=2048, data_dir=tmp_path, pool_size=0), backend=EngineDown())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            yield c


async def test_unknown_session_is_404_with_json_message(client: httpx.AsyncClient) -> None:
    for method, path in [
        ("GET", "/v1/sessions/abc"),
        ("DELETE", "/v1/sessions/abc"),
        ("POST", "/v1/sessions/abc/interrupt"),
        ("POST", "/v1/sessions/abc/restart"),
    ]:
        resp = await client.request(method, path)
        assert resp.status_code == 404, path
        assert resp.json()["error"]["code"] == "session_not_found"
        assert "POST /v1/sessions" in resp.json()["error"]["message"]


async def test_execute_on_unknown_session_is_404(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/sessions/abc/execute", json={"code": "1"})
    assert resp.status_code == 404


async def test_invalid_bodies_are_422_with_readable_message(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/sessions/abc/execute", json={"cod": "1"})
    assert resp.status_code == 422
    body = resp.json()["error"]
    assert body["code"] == "invalid_request"
    assert "code: Field required" in body["message"]
    resp = await client.post("/v1/sessions", json={"memory_mb": "lots"})
    assert resp.status_code == 422 and "memory_mb" in resp.json()["error"]["message"]
    resp = await client.post("/v1/sessions", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 422


async def test_limits_are_checked_before_touching_the_engine(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/sessions", json={"memory_mb": 4096})
    assert resp.status_code == 400
    assert resp.json()["error"] == {
        "code": "limit_exceeded",
        "message": "memory_mb must be between 64 and 2048; got 4096",
    }


async def test_engine_down_is_503_and_healthz_says_degraded(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/sessions", json={})
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "engine_unavailable"
    health = await client.get("/healthz")
    assert health.status_code == 503
    assert health.json()["status"] == "degraded" and health.json()["engine"] is False
    # every 503 says when to come back, on both faces
    jupyter = await client.post("/api/kernels", json={})
    assert jupyter.status_code == 503 and "message" in jupyter.json()
    for answer in (resp, health, await client.get("/readyz"), jupyter):
        assert int(answer.headers["Retry-After"]) > 0, answer.request.url


def test_every_429_and_503_carries_retry_after() -> None:
    from kernelgw import errors
    from kernelgw.server.availability import retry_after_s

    kinds = [
        k
        for k in vars(errors).values()
        if isinstance(k, type) and issubclass(k, errors.KernelGWError) and k.status_code in (429, 503)
    ]
    assert {errors.SessionLimitReached, errors.EngineUnavailable, errors.GatewayDraining} <= set(kinds)
    for kind in kinds:
        exc = kind("x", 0.2) if kind is errors.RateLimited else kind("x")
        assert (retry_after_s(exc) or 0) >= 1, kind
    assert retry_after_s(errors.SessionNotFound("x")) is None


async def test_unknown_route_is_json_404(client: httpx.AsyncClient) -> None:
    resp = await client.get("/v2/nothing")
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


async def test_openapi_documents_the_api(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert {"/v1/sessions", "/v1/sessions/{session_id}/execute", "/healthz"} <= set(paths)


# --- history (a real SQLite file in tmp_path; the kernel-side flows are in
# tests/integration/test_history.py)


async def test_history_of_an_unknown_session_is_404(client: httpx.AsyncClient, tmp_path: Path) -> None:
    for path in ("/v1/sessions/abc/notebook", "/v1/sessions/abc/history"):
        resp = await client.get(path)
        assert resp.status_code == 404, path
        assert resp.json()["error"]["code"] == "history_not_found"
    resp = await client.post("/v1/sessions/abc/notes", json={"markdown": "x"})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "session_not_found"
    assert (tmp_path / "kernelgw.db").exists()  # created on first start


async def test_restores_are_checked_before_touching_the_engine(client: httpx.AsyncClient) -> None:
    # the engine is down: a 400/404 here proves no kernel start was attempted
    resp = await client.post("/v1/sessions", json={"notebook": {"nbformat": 4, "cells": [{"cell_type": "x"}]}})
    assert resp.status_code == 400 and resp.json()["error"]["message"].startswith("notebook: not a valid")
    resp = await client.post("/v1/sessions", json={"from_session": "gone"})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "history_not_found"
    resp = await client.post("/v1/sessions", json={"from_session": "a", "notebook": {}})
    assert (
        resp.status_code == 422 and "at most one of notebook, from_session and from" in resp.json()["error"]["message"]
    )
