"""SIGTERM to a real ``kernelgw serve``: it drains (readiness off at once, new work
refused with 503 + Retry-After, the running cell streams to its ``done``, then
the WebSocket closes with 1012 and the process exits 0); a second signal during
the drain exits at once; a REST execute still running when the grace ends is
answered 503 naming its execution, and the process exits without waiting for it;
with on_shutdown=keep the next gateway follows that cell to its end and completes
its record (its later output, its real status), which its notebook shows."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.integration.conftest import IMAGE, RUNTIME, remove_everything
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


def test_the_grace_ends_a_rest_execute_with_503_naming_it_and_the_cell_goes_on_kept(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """An open HTTP request once held the process until its cell ended (uvicorn
    waits for open requests): a 20 s cell with a 10 s grace exited after 18.3 s. The cell runs on in the
    kept kernel, and the next gateway follows it: its record ends ok with all its output."""
    name = f"drainx{os.getpid()}"
    env = {"KERNELGW_RUNTIME": RUNTIME, "KERNELGW_ON_SHUTDOWN": "keep", "KERNELGW_SHUTDOWN_GRACE_S": "10"}
    try:
        kept_then_ended(name, env, tmp_path, docker_client)
    finally:  # on_shutdown=keep: a failure half-way must not leave the kernel behind
        left = containers(docker_client, name)
        remove_everything(docker_client, name)
    assert left == []  # the second gateway ran with on_shutdown=stop


GO_FILE = "/tmp/kgw-test-go"
"""The kept cell goes on once this file exists in its container: the test creates
it once the next gateway has reattached (output sent while no gateway listens is
lost, so the cell must not print its end before)."""


def kept_then_ended(name: str, env: dict[str, str], tmp_path: Path, docker_client: docker.DockerClient) -> None:
    """SIGTERM during the cell, then the next gateway of the name (on_shutdown=stop),
    which follows the cell the first one left running to its end."""
    code = (
        "import os, time\nprint('started', flush=True)\n"
        f"while not os.path.exists({GO_FILE!r}):\n    time.sleep(0.05)\n"
        "finished = 'yes'\nprint('finished', flush=True)"
    )
    answers: list[tuple[httpx.Response, int | None]] = []
    grace_s = float(env["KERNELGW_SHUTDOWN_GRACE_S"])
    log = tmp_path / "gateway.log"
    with gateway_process(name, tmp_path / "data", log, IMAGE, **env) as (proc, url):
        with httpx.Client(base_url=url, timeout=DEADLINE_S) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]

            def post() -> None:
                resp = http.post(f"/v1/sessions/{sid}/execute", json={"code": code, "execution_id": "cell20"})
                answers.append((resp, proc.poll()))  # answered while the process still ran?

            poster = threading.Thread(target=post)
            poster.start()
            until(lambda: http.get(f"/v1/sessions/{sid}").json()["state"] == "busy", "the cell runs")
            signalled = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            poster.join(timeout=DEADLINE_S)
            assert proc.wait(timeout=DEADLINE_S) == 0
            exited_s = time.monotonic() - signalled
        ((resp, exit_code_then),) = answers
        assert exit_code_then is None, "the answer came only as the process exited"
        assert resp.status_code == 503, resp.text  # not 200: the cell had not ended
        error = resp.json()["error"]
        assert error["code"] == "gateway_restarting" and error["execution_id"] == "cell20"
        assert "'cell20'" in error["message"] and f"/v1/sessions/{sid}/history" in error["message"]
        assert int(resp.headers["retry-after"]) > 0
        print(f"\nSIGTERM to exit with a {grace_s:g} s grace during a running cell: {exited_s:.1f} s")

    # the next gateway of the name: the cell's record in history, the cell itself
    # runs on in the kept kernel, followed by the new gateway to its end
    stop = {**env, "KERNELGW_ON_SHUTDOWN": "stop"}
    with gateway_process(name, tmp_path / "data", log, IMAGE, **stop) as (proc, url):
        with httpx.Client(base_url=url, timeout=DEADLINE_S) as http:
            interim = cell_record(http, sid)
            assert interim["code"] == code and interim["status"] == "dead"
            assert "next gateway" in interim["reason"]  # the interim end says it is followed
            # reattached and following it: now let the cell finish
            (kernel,) = docker_client.containers.list(filters={"label": f"{LABEL_GATEWAY}={name}"})
            assert kernel.exec_run(["touch", GO_FILE]).exit_code == 0
            until(lambda: cell_record(http, sid)["reason"] != interim["reason"], "the followed cell's real end")
            cell = cell_record(http, sid)
            assert cell["status"] == "ok", (cell["reason"], cell["events"])
            assert cell["reason"] is None and isinstance(cell["execution_count"], int)
            texts = "".join(
                (e["event"] if e["type"] == "late" else e).get("text", "")
                for e in cell["events"]
                if (e["event"] if e["type"] == "late" else e)["type"] == "stream"
            )
            assert texts == "started\nfinished\n", cell["events"]
            # the notebook says the same: its real end, and all its output its own
            # (no note that it came after the cell ended, no interim dead)
            (nb_cell,) = [c for c in notebook_of(http, sid)["cells"] if c["id"] == "cell20"]
            streams = [(o["output_type"], o.get("name"), "".join(o.get("text", ""))) for o in nb_cell["outputs"]]
            ended = (nb_cell["metadata"]["kernelgw"]["status"], nb_cell["execution_count"], streams)
            assert ended == ("ok", cell["execution_count"], [("stream", "stdout", "started\nfinished\n")]), nb_cell
            # the next cell ran after it, and sees what it set
            after = http.post(f"/v1/sessions/{sid}/execute", json={"code": "print(finished)"})
            assert after.status_code == 200, after.text
            assert [e["text"] for e in after.json()["events"] if e["type"] == "stream"] == ["yes\n"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE_S) == 0


def notebook_of(http: httpx.Client, sid: str) -> dict[str, Any]:
    resp = http.get(f"/v1/sessions/{sid}/notebook")
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def cell_record(http: httpx.Client, sid: str) -> dict[str, Any]:
    history = http.get(f"/v1/sessions/{sid}/history")
    assert history.status_code == 200, history.text
    (cell,) = [e for e in history.json()["executions"] if e["execution_id"] == "cell20"]
    return cell  # type: ignore[no-any-return]
