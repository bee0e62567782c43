"""The drain `kernelgw serve` runs on SIGTERM, in-process: `DrainingServer` (real
uvicorn on a loopback port, real kernel subprocesses) gets the signal through
its handler. The running cell streams to its ``done``, then the WebSocket
closes with 1012; meanwhile ``/readyz`` is 503, ``/healthz`` answers, and new
work gets 503 with ``Retry-After``; at the end of the grace every open request
is answered 503 and the server exits. (Not yet here: a second signal's forced
exit, and real signals to a real `kernelgw serve` subprocess.)"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from kernelgw.server import create_app
from kernelgw.server.serving import DrainingServer
from tests.support.app import local_settings
from tests.support.local_backend import LocalBackend

DEADLINE_S = 60.0


def waiting_cell(flag: Path) -> str:
    """A cell that runs until the test creates ``flag``: running for as long as the test needs."""
    return f"import os, time\nprint('start', flush=True)\nwhile not os.path.exists({str(flag)!r}):\n    time.sleep(0.01)\nprint('end')"


@asynccontextmanager
async def draining_server(
    tmp_path: Path, backend: LocalBackend, grace_s: float = DEADLINE_S
) -> AsyncIterator[tuple[DrainingServer, str]]:
    settings = local_settings(tmp_path, on_shutdown="stop", shutdown_grace_s=grace_s)
    app = create_app(settings, backend=backend)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", ws="websockets-sansio")
    server = DrainingServer(config, app, settings.shutdown_grace_s)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(DEADLINE_S):
        while not server.started:
            assert not task.done(), "uvicorn stopped before it started"
            await asyncio.sleep(0.01)
    (sock,) = server.servers[0].sockets
    host, port = sock.getsockname()[:2]
    try:
        yield server, f"{host}:{port}"
        async with asyncio.timeout(DEADLINE_S):
            await task  # the drain ends the server by itself
    finally:
        if not task.done():
            server.force_exit = server.should_exit = True
            await task


async def next_event(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(DEADLINE_S):
        return json.loads(await ws.recv())  # type: ignore[no-any-return]


async def wait_for_status(http: httpx.AsyncClient, path: str, status: int) -> httpx.Response:
    deadline = time.monotonic() + DEADLINE_S
    while (resp := await http.get(path)).status_code != status:
        assert time.monotonic() < deadline, f"{path} never answered {status}"
        await asyncio.sleep(0.02)
    return resp


async def test_sigterm_lets_the_running_cell_finish_then_closes_websockets_with_1012(
    local_backend: LocalBackend, tmp_path: Path
) -> None:
    flag = tmp_path / "finish"
    async with draining_server(tmp_path, local_backend) as (server, address):
        async with httpx.AsyncClient(base_url=f"http://{address}", timeout=DEADLINE_S) as http:
            sid = (await http.post("/v1/sessions", json={})).json()["id"]
            assert (await http.get("/readyz")).status_code == 200
            async with connect(f"ws://{address}/v1/sessions/{sid}/ws") as ws:
                await ws.send(json.dumps({"type": "execute", "code": waiting_cell(flag), "execution_id": "long"}))
                printed = ""
                while not printed.endswith("\n"):  # print's two writes may come as two events
                    if (event := await next_event(ws)).get("type") == "stream":
                        printed += event["text"]
                assert printed == "start\n"

                server.handle_exit(signal.SIGTERM, None)
                ready = await wait_for_status(http, "/readyz", 503)
                assert ready.json()["draining"] is True and "draining" in ready.json()["detail"]
                live = await http.get("/healthz")
                assert live.status_code == 200 and live.json()["draining"] is True
                refused = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})
                assert refused.status_code == 503 and refused.json()["error"]["code"] == "gateway_draining"
                assert int(refused.headers["Retry-After"]) > 0
                created = await http.post("/v1/sessions", json={})
                assert created.status_code == 503 and "Retry-After" in created.headers

                flag.touch()  # the running cell may end now
                events = [await next_event(ws)]
                while events[-1]["type"] != "done":
                    events.append(await next_event(ws))
                assert events[-1]["status"] == "ok" and events[-1]["execution_id"] == "long"
                assert "".join(e["text"] for e in events if e["type"] == "stream").endswith("end\n")
                with pytest.raises(ConnectionClosed) as closed:
                    await next_event(ws)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012


async def test_at_the_end_of_the_grace_every_open_request_is_answered_and_the_server_exits(
    local_backend: LocalBackend, tmp_path: Path
) -> None:
    """uvicorn waits for open requests when it stops: a REST execute of a long cell,
    or a request whose body stalls, held the process past ``shutdown_grace_s``."""
    flag = tmp_path / "finish"
    async with draining_server(tmp_path, local_backend, grace_s=0.5) as (server, address):
        async with httpx.AsyncClient(base_url=f"http://{address}", timeout=DEADLINE_S) as http:
            sid = (await http.post("/v1/sessions", json={})).json()["id"]
            body = {"code": waiting_cell(flag), "execution_id": "held"}
            execute = asyncio.create_task(http.post(f"/v1/sessions/{sid}/execute", json=body))
            deadline = time.monotonic() + DEADLINE_S
            while (await http.get(f"/v1/sessions/{sid}")).json()["state"] != "busy":
                assert time.monotonic() < deadline, "the cell never ran"
                await asyncio.sleep(0.02)
            # a request whose body never completes: its handler waits for the rest
            stalled_requests = []
            for path in ("/v1/sessions", "/api/kernels"):  # each face's error shape
                reader, writer = await asyncio.open_connection(*address.rsplit(":", 1))
                head = f"POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
                writer.write(f"{head}Content-Length: 100\r\n\r\n{{".encode())
                await writer.drain()
                stalled_requests.append((reader, writer))

            channels = await connect(f"ws://{address}/api/kernels/{sid}/channels")  # a Jupyter client

            server.handle_exit(signal.SIGTERM, None)
            answer = await execute
            assert answer.status_code == 503, answer.text  # the cell is still running
            error = answer.json()["error"]
            assert error["code"] == "gateway_restarting" and error["execution_id"] == "held"
            assert f"/v1/sessions/{sid}/history" in error["message"] and int(answer.headers["Retry-After"]) > 0
            answers = []
            for reader, writer in stalled_requests:
                async with asyncio.timeout(DEADLINE_S):
                    answers.append(await reader.read())  # to the end: the gateway closes the connection
                writer.close()
            v1, jupyter = answers
            assert v1.startswith(b"HTTP/1.1 503 ") and jupyter.startswith(b"HTTP/1.1 503 "), answers
            assert b'"code":"gateway_restarting"' in v1 and b"before sending it again" in v1
            assert b'"reason":"Service Unavailable"' in jupyter and b"before sending it again" in jupyter
            with pytest.raises(ConnectionClosed) as closed:  # its cell still running: closed all the same
                while True:
                    async with asyncio.timeout(DEADLINE_S):
                        await channels.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
        flag.touch()
    # draining_server's exit waited for the server task: the drain ended it by itself
