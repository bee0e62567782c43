"""The real ``jupyter server --gateway-url`` against kernelgw on kernel
subprocesses (tests/integration/test_jupyter_server_gateway.py runs it on Docker
with the image's pandas and matplotlib)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.server.jupyter.conftest import Gateway
from tests.unit.server.jupyter.jupyter_server_client import drive, jupyter_server


async def test_jupyter_server_drives_kernelgw_as_its_gateway(gw: Gateway, tmp_path: Path) -> None:
    async with jupyter_server(gw.url, gw.alice, tmp_path / "js") as server, gw.client(gw.alice) as gateway:
        await drive(server, gateway, rich=False)
