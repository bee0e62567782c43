"""Building FastAPI's routes before the first request, beside the start-up.

FastAPI (0.16x) prepares an included router's routes (their parameters'
pydantic adapters) when a request first walks past them: after a restart, the
first execute paid 40-50 ms for the 49 routes before its own. The app's own
routers are added as plain routes now (`kernelgw.server.app.include_routes`),
built once when their modules are imported; a router included into another
(Jupyter's sessions, under its kernels API) is still built late. A request
that matches no route walks past all of them, so one such request, made at
start in a thread while the lifespan waits on the store, Docker and the
kernels, leaves nothing to build.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.types import ASGIApp, Message

log = logging.getLogger(__name__)

WARM_UP_PATH = "/.kernelgw-route-warm-up"
"""Matches no route (the request never leaves the router: no middleware, no handler)."""


def build_routes(router: ASGIApp) -> None:
    """Walk ``router`` (the app's router, not the app: its middleware needs the
    gateway) with one unmatched request, in its own event loop (blocking: for a
    thread). FastAPI guards its route building with a lock: safe beside requests."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": WARM_UP_PATH,
        "raw_path": WARM_UP_PATH.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": None,
        "server": None,
    }

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        pass

    async def walk() -> None:
        await router(scope, receive, send)

    try:
        asyncio.run(walk())
    except Exception:  # an optimisation only: the first request builds what this did not
        log.debug("building the routes ahead of the first request failed", exc_info=True)
