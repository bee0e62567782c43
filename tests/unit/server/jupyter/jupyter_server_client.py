"""The real ``jupyter server --gateway-url=<kernelgw>``, driven through its own
REST API and channels WebSocket as JupyterLab drives it. Shared by the unit
test (kernel subprocesses) and tests/integration/test_jupyter_server_gateway.py
(Docker)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from tests.support.processes import free_port

JUPYTER_SERVER = Path(sys.executable).with_name("jupyter-server")
RECEIVE_TIMEOUT_S = 90


@dataclass
class JupyterServer:
    url: str
    token: str
    process: asyncio.subprocess.Process
    log: Path

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, headers={"Authorization": f"token {self.token}"}, timeout=RECEIVE_TIMEOUT_S
        )

    def channels(self, kernel_id: str) -> str:
        ws = "ws" + self.url[len("http") :]
        return f"{ws}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4()}&token={self.token}"


@asynccontextmanager
async def jupyter_server(gateway_url: str, key: str, workdir: Path) -> AsyncIterator[JupyterServer]:
    """``jupyter-server`` in a subprocess with ``--gateway-url`` and the key as its
    gateway token (sent as ``Authorization: token <key>``)."""
    port, token = free_port(), secrets.token_hex(16)
    for sub in ("config", "data", "runtime", "root"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(workdir / "config"),
        "JUPYTER_DATA_DIR": str(workdir / "data"),
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    log = workdir / "jupyter-server.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            str(JUPYTER_SERVER),
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={workdir / 'root'}",
            f"--gateway-url={gateway_url}",
            f"--GatewayClient.auth_token={key}",
            "--GatewayClient.request_timeout=120",
            "--GatewayClient.connect_timeout=60",
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    server = JupyterServer(f"http://127.0.0.1:{port}", token, process, log)
    try:
        deadline = time.monotonic() + 60
        async with server.http() as http:
            while True:
                assert process.returncode is None, f"jupyter server exited:\n{log.read_text()[-3000:]}"
                try:
                    if (await http.get("/api/status")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"jupyter server did not start:\n{log.read_text()[-3000:]}"
                await asyncio.sleep(0.2)
        yield server
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(20):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()


async def _recv(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(RECEIVE_TIMEOUT_S):
        frame = await ws.recv()
    msg: dict[str, Any] = json.loads(frame)
    return msg


async def execute(ws: ClientConnection, code: str, session: str = "driver") -> list[dict[str, Any]]:
    """An execute_request as JupyterLab sends it; the messages of its parent until idle and reply."""
    msg_id = uuid.uuid4().hex
    await ws.send(
        json.dumps(
            {
                "channel": "shell",
                "header": {
                    "msg_id": msg_id,
                    "msg_type": "execute_request",
                    "session": session,
                    "username": "",
                    "version": "5.3",
                    "date": "2024-01-01T00:00:00.000Z",
                },
                "parent_header": {},
                "metadata": {},
                "content": {"code": code, "silent": False, "store_history": True, "allow_stdin": False},
                "buffers": [],
            }
        )
    )
    got: list[dict[str, Any]] = []
    idle = replied = False
    while not (idle and replied):
        msg = await _recv(ws)
        if (msg.get("parent_header") or {}).get("msg_id") != msg_id:
            continue
        got.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
        replied = replied or msg["msg_type"] == "execute_reply"
    return got


def of_type(msgs: list[dict[str, Any]], msg_type: str) -> list[dict[str, Any]]:
    return [m for m in msgs if m["msg_type"] == msg_type]


def stdout(msgs: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in of_type(msgs, "stream") if m["content"]["name"] == "stdout")


async def drive(server: JupyterServer, gateway: httpx.AsyncClient, *, rich: bool) -> dict[str, float]:
    """Start, execute (stream, error, and with ``rich`` a DataFrame's HTML and a
    PNG), interrupt, restart and shut down a kernel through jupyter_server's own
    API; ``gateway`` (with the key) checks what kernelgw saw. Returns timings."""
    timings: dict[str, float] = {}
    async with server.http() as http:
        specs = (await http.get("/api/kernelspecs")).json()
        assert specs["default"] == "python3", specs
        assert "kernelgw" in specs["kernelspecs"]["python3"]["spec"]["display_name"]

        started = time.perf_counter()
        resp = await http.post("/api/kernels", json={"name": "python3"})
        assert resp.status_code == 201, resp.text
        timings["start_s"] = time.perf_counter() - started
        kid = resp.json()["id"]
        assert [k["id"] for k in (await gateway.get("/api/kernels")).json()] == [kid]
        # jupyter_server's kernel list refreshes each model from the gateway (last_activity parsed)
        listed = await http.get("/api/kernels")
        assert listed.status_code == 200 and [k["id"] for k in listed.json()] == [kid], listed.text

        async with connect(server.channels(kid), max_size=None) as ws:
            started = time.perf_counter()
            msgs = await execute(ws, "print('hello from kernelgw')")
            timings["first_execute_s"] = time.perf_counter() - started
            assert stdout(msgs) == "hello from kernelgw\n", msgs
            assert of_type(msgs, "execute_reply")[0]["content"]["status"] == "ok"

            started = time.perf_counter()
            for _ in range(10):
                await execute(ws, "1")
            timings["execute_roundtrip_ms"] = (time.perf_counter() - started) * 100

            msgs = await execute(ws, "1/0")
            (error,) = of_type(msgs, "error")
            assert error["content"]["ename"] == "ZeroDivisionError"
            assert of_type(msgs, "execute_reply")[0]["content"]["status"] == "error"

            if rich:
                msgs = await execute(ws, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
                (result,) = of_type(msgs, "execute_result")
                assert "<table" in result["content"]["data"]["text/html"]
                msgs = await execute(
                    ws, "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"
                )
                pngs = [m for m in of_type(msgs, "display_data") if "image/png" in m["content"]["data"]]
                assert pngs, [m["msg_type"] for m in msgs]

            await execute(ws, "marker = 1")
            # interrupt through jupyter_server while a cell sleeps
            sleeper = asyncio.create_task(execute(ws, "import time\ntime.sleep(60)"))
            deadline = time.monotonic() + RECEIVE_TIMEOUT_S
            while (await gateway.get(f"/api/kernels/{kid}")).json()["execution_state"] != "busy":  # the cell runs
                assert time.monotonic() < deadline, "the sleeping cell never started"
                await asyncio.sleep(0.05)
            assert (await http.post(f"/api/kernels/{kid}/interrupt")).status_code == 204
            msgs = await asyncio.wait_for(sleeper, RECEIVE_TIMEOUT_S)
            assert of_type(msgs, "error")[0]["content"]["ename"] == "KeyboardInterrupt"
            assert stdout(await execute(ws, "print(marker)")) == "1\n"

            started = time.perf_counter()
            resp = await http.post(f"/api/kernels/{kid}/restart")
            assert resp.status_code == 200, resp.text
            timings["restart_s"] = time.perf_counter() - started
            assert stdout(await execute(ws, "print('marker' in dir())")) == "False\n"

        assert (await http.delete(f"/api/kernels/{kid}")).status_code == 204
        assert (await gateway.get("/api/kernels")).json() == []
    return timings
