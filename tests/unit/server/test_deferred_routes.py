"""How the app gets its routes: added as they are (not through FastAPI's
``include_router``, which builds each one again), and with
``create_app(defer_routes=True)`` (what `kernelgw serve` makes) by the
lifespan's start-up thread, all there before it yields."""

from __future__ import annotations

from pathlib import Path

import httpx
from fastapi import FastAPI

from kernelgw.config import Settings
from kernelgw.server import create_app
from kernelgw.server.app import routers
from tests.support.routes import endpoints
from tests.unit.server.test_api import EngineDown


def test_the_routes_are_those_include_router_gives() -> None:
    ours = create_app()
    reference = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    for router in routers():
        reference.include_router(router)
    assert endpoints(ours) == endpoints(reference)
    assert ours.openapi()["paths"] == reference.openapi()["paths"]
    assert ours.openapi()["components"] == reference.openapi()["components"]


async def test_the_lifespan_adds_the_same_routes_before_it_yields(tmp_path: Path) -> None:
    settings = Settings(max_memory_mb=2048, data_dir=tmp_path, pool_size=0, gateway_name=f"deferred{id(tmp_path)}")
    eager = endpoints(create_app(settings, backend=EngineDown()))
    app = create_app(settings, backend=EngineDown(), defer_routes=True)
    assert len(eager) > 40
    assert not any(e.path.startswith("/v1/") for e in endpoints(app))
    async with app.router.lifespan_context(app):
        assert endpoints(app) == eager
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            resp = await client.get("/v1/sessions/abc")
            assert resp.status_code == 404
            assert resp.json()["error"]["code"] == "session_not_found"
            assert (await client.get("/healthz")).status_code in (200, 503)
    async with app.router.lifespan_context(app):  # started again: the same routes, not twice
        assert endpoints(app) == eager
        assert len(app.routes) == len(create_app(settings, backend=EngineDown()).routes)
