"""Two gateways, one name, one host: the second must not start, and must not
touch the first one's kernels (it used to remove them all at start-up)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import docker
import httpx
import pytest

from kernelgw.errors import GatewayNameInUse
from kernelgw.server import create_app
from tests.integration.conftest import RunningGateway, gateway_settings, run, stdout

pytestmark = pytest.mark.integration


def test_a_second_gateway_with_the_same_name_is_refused_and_the_first_keeps_its_kernels(
    gateway: RunningGateway, http: httpx.Client, docker_client: docker.DockerClient
) -> None:
    sid = http.post("/v1/sessions", json={}).json()["id"]
    try:
        assert stdout(run(http, sid, "x = 6 * 7\nprint(x)")) == "42\n"
        label = f"kernelgw.session={sid}"
        (container,) = docker_client.containers.list(filters={"label": label})

        second = create_app(gateway_settings(gateway_name=gateway.settings.gateway_name))

        async def start_second() -> None:
            async with second.router.lifespan_context(second):
                pytest.fail("a second gateway with a live gateway's name started")

        with pytest.raises(GatewayNameInUse, match="is running on this host"):
            asyncio.run(start_second())

        env = dict(
            os.environ,
            KERNELGW_GATEWAY_NAME=gateway.settings.gateway_name,
            KERNELGW_RUNTIME_DIR=str(gateway.settings.runtime_dir),
            KERNELGW_DATA_DIR=str(gateway.settings.data_dir),
        )
        cli = subprocess.run(
            [sys.executable, "-m", "kernelgw", "serve", "--port", "1"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode != 0
        assert f"Another gateway named {gateway.settings.gateway_name!r} is running on this host" in cli.stderr
        assert f"pid {os.getpid()}" in cli.stderr

        container.reload()
        assert container.status == "running"
        assert stdout(run(http, sid, "print(x)")) == "42\n"  # same kernel, state intact
    finally:
        http.delete(f"/v1/sessions/{sid}")
