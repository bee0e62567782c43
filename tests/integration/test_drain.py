"""SIGTERM to a real ``kernelgw serve``: it drains (readiness off at once, new work
refused with 503 + Retry-After, the running cell streams to its ``done``, then
the WebSocket closes with 1012 and the process exits 0); a second signal during
the drain exits at once."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.integration.conftest import IMAGE, RUNTIME
from tests.support.crash_loop import LABEL_GATEWAY, gateway_process

pytestmark = pytest.mark.integration

DEADLINE_S = 90


def receive(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=DEADLINE_S))  # type: ignore[no-any-return]


def until_stdout(ws: ClientConnection, text: str) -> None:
    while True:
        event = receive(ws)
        if event["type"] == "stream" and text in event["text"]:
            return


def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def containers(docker_client: docker.DockerClient, name: str) -> list[str]:
    return [
        c.name or c.id for c in docker_client.containers.list(all=True, filters={"label": f"{LABEL_GATEWAY}={name}"})
    ]


def test_sigterm_drains_then_exits_and_a_second_signal_exits_at_once(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    name = f"drain{os.getpid()}"
    env = {"KERNELGW_RUNTIME": RUNTIME, "KERNELGW_ON_SHUTDOWN": "stop", "KERNELGW_SHUTDOWN_GRACE_S": "60"}
    log = tmp_path / "gateway.log"

    # 1. one SIGTERM: a drain
    with gateway_process(name, tmp_path / "data", log, IMAGE, **env) as (proc, url):
        with httpx.Client(base_url=url, timeout=60) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            with connect(f"ws{url[len('http') :]}/v1/sessions/{sid}/ws") as ws:
                code = "import time\nprint('started', flush=True)\ntime.sleep(2)\nprint('finished', flush=True)"
                ws.send(json.dumps({"type": "execute", "code": code, "execution_id": "long"}))
                until_stdout(ws, "started")
                proc.send_signal(signal.SIGTERM)

                until(lambda: http.get("/readyz").status_code == 503, "/readyz turns 503")
                health = http.get("/healthz")
                assert health.status_code == 200 and health.json()["draining"] is True
                refused = http.post(f"/v1/sessions/{sid}/execute", json={"code": "1"})
                assert refused.status_code == 503 and refused.json()["error"]["code"] == "gateway_draining"
                assert int(refused.headers["retry-after"]) > 0
                assert http.post("/v1/sessions", json={}).status_code == 503

                events = []
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        events.append(receive(ws))
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
            assert "".join(e["text"] for e in events if e["type"] == "stream") == "finished\n"
            done = [e for e in events if e["type"] == "done"]
            assert len(done) == 1 and done[0]["status"] == "ok"
            assert proc.wait(timeout=DEADLINE_S) == 0
    assert containers(docker_client, name) == []  # on_shutdown=stop

    # 2. a second signal during the drain: out at once, the cell still running (a
    # grace longer than the wait below: an ignored second signal fails the wait)
    long_grace = {**env, "KERNELGW_SHUTDOWN_GRACE_S": "600"}
    with gateway_process(name, tmp_path / "data", log, IMAGE, **long_grace) as (proc, url):
        with httpx.Client(base_url=url, timeout=60) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            with connect(f"ws{url[len('http') :]}/v1/sessions/{sid}/ws") as ws:
                ws.send(
                    json.dumps({"type": "execute", "code": "import time\nprint('up', flush=True)\ntime.sleep(600)"})
                )
                until_stdout(ws, "up")
                proc.send_signal(signal.SIGTERM)
                until(lambda: http.get("/readyz").status_code == 503, "/readyz turns 503")
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=DEADLINE_S)  # long before the cell's 600 s or the 600 s grace
    # what a forced exit leaves, the next gateway of the name takes over (here: ends)
    with gateway_process(name, tmp_path / "data", log, IMAGE, **env) as (proc, url):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE_S) == 0
    assert containers(docker_client, name) == []
