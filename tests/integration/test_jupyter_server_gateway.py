"""The real ``jupyter server --gateway-url=<kernelgw>`` on Docker kernels: a
kernel started, run (stream, a pandas DataFrame's HTML, a matplotlib PNG, an
error), interrupted, restarted and shut down through jupyter_server's own REST
API and channels WebSocket, with keys required (jupyter_server sends the key
as ``Authorization: token <key>``)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest

from tests.integration.conftest import RunningGateway, gateway_with_key
from tests.unit.server.jupyter.jupyter_server_client import drive, jupyter_server


@pytest.fixture(scope="module")
def keyed_gateway(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, str]]:
    with gateway_with_key(docker_client, tmp_path_factory.mktemp("jupyter-gw"), f"tj{os.getpid()}") as pair:
        yield pair


def test_jupyter_server_drives_kernelgw(keyed_gateway: tuple[RunningGateway, str], tmp_path: Path) -> None:
    gw, key = keyed_gateway

    async def scenario() -> dict[str, float]:
        async with (
            jupyter_server(gw.url, key, tmp_path) as server,
            httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"token {key}"}, timeout=60) as gateway,
        ):
            return await drive(server, gateway, rich=True)

    timings = asyncio.run(scenario())
    print("jupyter_server via kernelgw:", {k: round(v, 3) for k, v in timings.items()})
