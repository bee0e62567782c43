"""The gateway's FastAPI app in-process, on kernels from :class:`LocalBackend`."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from kernelgw.config import Settings
from kernelgw.server import create_app
from kernelgw.server.serving import uvicorn_config
from tests.support.local_backend import LocalBackend

_names = itertools.count()


def local_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings for an in-process gateway: quick state polls, history in ``data_dir``."""
    base: dict[str, Any] = dict(
        # a name of its own: one live gateway holds a name per host (a developer's
        # `kernelgw serve` holds "default")
        gateway_name=f"unit{os.getpid()}{next(_names)}",
        data_dir=data_dir,
        max_memory_mb=2048,
        state_poll_s=0.1,
        interrupt_grace_s=1,
        idle_timeout_s=3600,
        on_shutdown="stop",  # in-process test gateways leave no kernel behind
        pool_size=0,  # tests that want a pool ask for one
    )
    base.update(overrides)
    return Settings(**base)


@asynccontextmanager
async def serve(
    settings: Settings, backend: LocalBackend, headers: dict[str, str] | None = None
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app with its lifespan running, and a client that calls it in-process."""
    app = create_app(settings, backend=backend)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost", headers=headers, timeout=60
        ) as client:
            yield app, client


@asynccontextmanager
async def serve_tcp(settings: Settings, backend: LocalBackend) -> AsyncIterator[str]:
    """The app behind a real uvicorn on 127.0.0.1 (an ephemeral port); yields host:port."""
    app = create_app(settings, backend=backend)
    # the options `kernelgw serve` uses (header deadline, WebSocket implementation)
    server = uvicorn.Server(uvicorn_config(app, settings, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:
                assert not task.done(), "uvicorn stopped before it started"
                await asyncio.sleep(0.01)
        (sock,) = server.servers[0].sockets
        host, port = sock.getsockname()[:2]
        yield f"{host}:{port}"
    finally:
        server.should_exit = True
        await task
