"""Two more real Jupyter clients of kernelgw's ``/api/kernels`` face, on Docker
kernels with keys required:

* AutoGen: ``autogen-ext``'s ``DockerJupyterCodeExecutor`` pointed at kernelgw
  with a ``JupyterConnectionInfo`` (its ``JupyterClient``: requests and aiohttp
  for REST, ``websockets`` for the channels, ``Authorization: token <key>``).
  The package itself runs, nothing reproduced.
* Open WebUI's jupyter engine call sequence (open_webui/utils/code_interpreter.py),
  reproduced: open-webui is too big to install for a test, so ``_open_webui_execute``
  makes its calls with httpx and websockets (``?token=`` on both, no subprotocol,
  one JSON ``execute_request``, messages of its parent until ``status: idle``,
  then ``DELETE``).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker
import httpx
import pytest
from websockets.asyncio.client import connect

from tests.integration.conftest import RunningGateway, gateway_with_key

pytestmark = [
    pytest.mark.integration,
    # autogen-ext 0.7.5's executor config still uses a class-based pydantic Config (on import)
    pytest.mark.filterwarnings("ignore:Support for class-based `config`:pydantic.warnings.PydanticDeprecatedSince20"),
]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def keyed_gateway(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, str]]:
    with gateway_with_key(docker_client, tmp_path_factory.mktemp("jupyter-clients-gw"), f"tjc{os.getpid()}") as pair:
        yield pair


def _containers(docker_client: docker.DockerClient, gw: RunningGateway) -> list[str]:
    found = docker_client.containers.list(all=True, filters={"label": f"kernelgw.gateway={gw.settings.gateway_name}"})
    return [c.name for c in found]


# ---------------------------------------------------------------------- AutoGen


def test_autogen_docker_jupyter_code_executor(
    keyed_gateway: tuple[RunningGateway, str], docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    from autogen_core import CancellationToken
    from autogen_core.code_executor import CodeBlock
    from autogen_ext.code_executors.docker_jupyter import DockerJupyterCodeExecutor
    from autogen_ext.code_executors.docker_jupyter._jupyter_server import JupyterConnectionInfo

    gw, key = keyed_gateway
    where = urlsplit(gw.url)
    info = JupyterConnectionInfo(host=where.hostname or "", use_https=False, port=where.port, token=key)

    async def scenario() -> None:
        # kernelgw's own view of it (/v1 takes the key as Bearer; /api takes both)
        headers = {"Authorization": f"Bearer {key}"}
        executor = DockerJupyterCodeExecutor(jupyter_server=info, timeout=60, output_dir=tmp_path)
        cancel = CancellationToken()
        stopped = False
        async with httpx.AsyncClient(base_url=gw.url, headers=headers, timeout=60) as http:
            try:
                await executor.start()
                kernels = (await http.get("/api/kernels")).json()
                assert len(kernels) == 1, kernels
                kid = kernels[0]["id"]
                # the kernel is a kernelgw session: the same id on the /v1 face
                sessions = (await http.get("/v1/sessions")).json()
                assert kid in json.dumps(sessions), sessions

                result = await executor.execute_code_blocks(
                    [CodeBlock(code="x = 6 * 7\nprint('hello from autogen')", language="python")], cancel
                )
                assert result.exit_code == 0, result.output
                assert "hello from autogen" in result.output

                # state persists between calls; an expression's value comes back as text/plain
                result = await executor.execute_code_blocks([CodeBlock(code="x", language="python")], cancel)
                assert result.exit_code == 0 and "42" in result.output, result.output

                result = await executor.execute_code_blocks(
                    [
                        CodeBlock(
                            code="%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
                            language="python",
                        )
                    ],
                    cancel,
                )
                assert result.exit_code == 0, result.output
                pngs = [p for p in result.output_files if p.suffix == ".png"]
                assert pngs and pngs[0].read_bytes().startswith(PNG_MAGIC), result

                result = await executor.execute_code_blocks([CodeBlock(code="1/0", language="python")], cancel)
                assert result.exit_code == 1
                assert "ZeroDivisionError" in result.output, result.output

                # restart: a fresh kernel under the same id, state gone
                await executor.restart()
                result = await executor.execute_code_blocks(
                    [CodeBlock(code="print('x' in dir())", language="python")], cancel
                )
                assert result.exit_code == 0 and "False" in result.output, result.output

                await executor.stop()
                stopped = True
                assert (await http.get(f"/api/kernels/{kid}")).status_code == 404
                assert (await http.get("/api/kernels")).json() == []
            finally:
                if not stopped:
                    await executor.stop()

    asyncio.run(scenario())
    assert not _containers(docker_client, gw)


# ------------------------------------------------------------ Open WebUI (reproduced)


@dataclass
class OpenWebUIResult:
    kernel_id: str
    stdout: str = ""
    stderr: str = ""
    results: list[str] = field(default_factory=list)
    pngs: list[bytes] = field(default_factory=list)
    error: dict[str, Any] | None = None


async def _open_webui_execute(base_url: str, token: str, code: str, timeout: float = 90) -> OpenWebUIResult:
    """Open WebUI's jupyter engine, one code run: a kernel per run, ``?token=``
    on every call, no WebSocket subprotocol, JSON text frames."""
    params = {"token": token}
    async with httpx.AsyncClient(timeout=timeout) as http:
        resp = await http.post(f"{base_url}/api/kernels", params=params)
        assert resp.status_code == 201, resp.text
        kernel_id = resp.json()["id"]
        out = OpenWebUIResult(kernel_id)
        try:
            ws_url = "ws" + base_url[len("http") :] + f"/api/kernels/{kernel_id}/channels?token={token}"
            async with connect(ws_url, max_size=None) as ws:
                msg_id = uuid.uuid4().hex
                await ws.send(
                    json.dumps(
                        {
                            "header": {
                                "msg_id": msg_id,
                                "msg_type": "execute_request",
                                "username": "user",
                                "session": uuid.uuid4().hex,
                                "date": datetime.datetime.now(datetime.UTC).isoformat(),
                                "version": "5.3",
                            },
                            "parent_header": {},
                            "metadata": {},
                            "content": {
                                "code": code,
                                "silent": False,
                                "store_history": True,
                                "user_expressions": {},
                                "allow_stdin": False,
                                "stop_on_error": True,
                            },
                            "channel": "shell",
                        }
                    )
                )
                async with asyncio.timeout(timeout):
                    while True:
                        msg = json.loads(await ws.recv())
                        if msg.get("parent_header", {}).get("msg_id") != msg_id:
                            continue
                        kind, content = msg.get("msg_type"), msg.get("content", {})
                        if kind == "stream":
                            if content["name"] == "stdout":
                                out.stdout += content["text"]
                            elif content["name"] == "stderr":
                                out.stderr += content["text"]
                        elif kind in ("execute_result", "display_data"):
                            data = content.get("data", {})
                            if "image/png" in data:
                                out.pngs.append(base64.b64decode(data["image/png"]))
                            elif "text/plain" in data:
                                out.results.append(data["text/plain"])
                        elif kind == "error":
                            out.error = content
                        elif kind == "status" and content["execution_state"] == "idle":
                            break
        finally:
            await http.delete(f"{base_url}/api/kernels/{kernel_id}", params=params)
        return out


def test_open_webui_jupyter_engine_call_sequence(
    keyed_gateway: tuple[RunningGateway, str], docker_client: docker.DockerClient
) -> None:
    gw, key = keyed_gateway

    async def scenario() -> list[OpenWebUIResult]:
        ran = [
            await _open_webui_execute(gw.url, key, "print('hello from open webui')\n6 * 7"),
            await _open_webui_execute(
                gw.url, key, "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"
            ),
            await _open_webui_execute(gw.url, key, "import sys\nprint('to stderr', file=sys.stderr)\n1/0"),
        ]
        async with httpx.AsyncClient(base_url=gw.url, params={"token": key}, timeout=30) as http:
            for run in ran:
                assert (await http.get(f"/api/kernels/{run.kernel_id}")).status_code == 404
            assert (await http.get("/api/kernels")).json() == []
        return ran

    text, plot, failed = asyncio.run(scenario())
    assert text.stdout == "hello from open webui\n" and text.results == ["42"] and text.error is None, text
    assert plot.pngs and plot.pngs[0].startswith(PNG_MAGIC) and plot.error is None, plot
    assert failed.stderr == "to stderr\n", failed
    assert failed.error is not None and failed.error["ename"] == "ZeroDivisionError", failed
    assert len({text.kernel_id, plot.kernel_id, failed.kernel_id}) == 3
    assert not _containers(docker_client, gw)
