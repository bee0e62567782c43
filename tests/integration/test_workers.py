"""``kernelgw serve --workers 2``, with real parts: the CLI as a subprocess, its
two gateway processes on one port, SQLite shared between them (the cluster's
registry included), real kernels in Docker.

Through the one port: sessions created over new connections land on both
workers; on each session, dependent cells over REST answer whether the request
lands on the owner or is forwarded (both seen), and over the /v1 WebSocket;
one worker killed with SIGKILL is restarted by the supervisor and its session
answers again with its state; SIGTERM to the supervisor ends every process and
leaves no container or volume of either worker (``on_shutdown=stop``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from websockets.sync.client import connect

from kernelgw.runtime.ownership import lock_path
from tests.integration.conftest import IMAGE, RUNTIME, assert_nothing_left, remove_everything
from tests.support.processes import free_port

pytestmark = pytest.mark.integration

GATEWAY = "gateway"
"""The header naming the worker that served an answer (x-kernelgw-gateway)."""
VIA = "x-kernelgw-via"
"""Present when the request landed on another worker and was forwarded."""


def eventually(check: Callable[[], bool], deadline_s: float, what: str, log: Path) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if check():
                return
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(0.2)
    pytest.fail(f"{what} within {deadline_s} s; the gateway's log:\n{log.read_text()[-4000:]}")


def fresh(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """One request on a new connection: the kernel picks the worker (SO_REUSEPORT)."""
    with httpx.Client(timeout=60) as client:
        return client.request(method, url, **kwargs)


def result_text(body: dict[str, Any]) -> str:
    return "".join(e["data"].get("text/plain", "") for e in body["events"] if e["type"] == "result")


def ws_result(base: str, sid: str, code: str) -> str:
    """One cell over the /v1 WebSocket (a new connection): its result's text."""
    text = ""
    with connect(f"ws{base[len('http') :]}/v1/sessions/{sid}/ws", open_timeout=30) as ws:
        ws.send(json.dumps({"type": "execute", "code": code}))
        while True:
            event = json.loads(ws.recv(timeout=60))
            if event.get("type") == "result":
                text += event["data"].get("text/plain", "")
            if event.get("type") == "done":
                assert event["status"] == "ok", event
                return text


def worker_pid(runtime_dir: Path, name: str) -> int:
    """The pid of the process holding the worker's instance lock (it writes itself there)."""
    return int(json.loads(lock_path(runtime_dir, name).read_text())["pid"])


@contextmanager
def workers_gateway(tmp_path: Path, name: str, port: int) -> Iterator[subprocess.Popen[bytes]]:
    log = tmp_path / "gateway.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELGW_")}
    env |= {
        "KERNELGW_GATEWAY_NAME": name,
        "KERNELGW_IMAGE": IMAGE,
        "KERNELGW_RUNTIME": RUNTIME,
        "KERNELGW_RUNTIME_DIR": str(tmp_path / "run"),
        "KERNELGW_DATA_DIR": str(tmp_path / "data"),
        "KERNELGW_MEMORY_MB": "512",
        "KERNELGW_POOL_SIZE": "0",
        "KERNELGW_ON_SHUTDOWN": "stop",
        "KERNELGW_CLUSTER_HEARTBEAT_S": "1",
        "KERNELGW_CLUSTER_GONE_AFTER_S": "4",
        "KERNELGW_LOG_FORMAT": "text",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernelgw", "serve", "--port", str(port), "--workers", "2"],
            env=env,
            stdout=out,
            stderr=out,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)  # the test failed before its own SIGTERM
            proc.wait()


def test_two_workers_are_one_gateway(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    name = f"w{os.getpid()}"
    workers = [name, f"{name}-w1"]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "gateway.log"
    t0 = time.monotonic()
    try:
        with workers_gateway(tmp_path, name, port) as supervisor:
            eventually(
                lambda: "with 2 worker processes" in log.read_text(), 90, "the supervisor announcing its workers", log
            )
            print(f"two workers serving after {time.monotonic() - t0:.1f} s")
            for path in ("/healthz", "/readyz"):
                for _ in range(6):  # whichever worker answers
                    assert fresh("GET", base + path).status_code == 200
            listing = fresh("GET", base + "/v1/gateways").json()
            assert {g["name"] for g in listing["gateways"] if g["live"]} == set(workers)

            # sessions over new connections, until both workers own some (each lands on one at random)
            owners: dict[str, str] = {}
            while set(owners.values()) != set(workers) or len(owners) < 4:
                assert len(owners) < 16, f"16 sessions all landed on one worker: {owners}"
                created = fresh("POST", base + "/v1/sessions", json={})
                assert created.status_code == 201, created.text
                owners[created.json()["id"]] = created.headers["x-kernelgw-" + GATEWAY]
            print(f"{len(owners)} sessions, per worker: {[list(owners.values()).count(w) for w in workers]}")

            # each over REST, on new connections: the owner answers, directly or forwarded by its sibling
            def plus_one(sid: str) -> str:
                answer = fresh("POST", f"{base}/v1/sessions/{sid}/execute", json={"code": "x + 1"})
                assert answer.status_code == 200, answer.text
                assert answer.headers["x-kernelgw-" + GATEWAY] == owners[sid]
                assert result_text(answer.json()) == "2"
                return "forwarded" if VIA in answer.headers else "direct"

            paths: list[str] = []
            for sid in owners:
                assert fresh("POST", f"{base}/v1/sessions/{sid}/execute", json={"code": "x = 1"}).status_code == 200
                paths += [plus_one(sid) for _ in range(2)]
            first = next(iter(owners))
            while set(paths) != {"direct", "forwarded"}:  # each way, at least once
                assert len(paths) < 40, f"40 requests all went one way: {paths[0]}"
                paths.append(plus_one(first))
            print(f"REST: {paths.count('direct')} answered by the owner, {paths.count('forwarded')} forwarded")

            # each over the /v1 WebSocket, on new connections (some land on the sibling, which relays)
            for sid in owners:
                for _ in range(2):
                    assert ws_result(base, sid, "x + 1") == "2"

            # kill -9 one worker: the supervisor restarts it, its session keeps its state
            victim = workers[1]
            sid = next(s for s, o in owners.items() if o == victim)
            assert fresh("POST", f"{base}/v1/sessions/{sid}/execute", json={"code": "x = 41"}).status_code == 200
            old_pid = worker_pid(tmp_path / "run", victim)
            os.kill(old_pid, signal.SIGKILL)
            killed = time.monotonic()

            def answers_again() -> bool:
                r = fresh("POST", f"{base}/v1/sessions/{sid}/execute", json={"code": "x + 1"})
                return r.status_code == 200 and result_text(r.json()) == "42"

            eventually(answers_again, 45, "the killed worker's session answering again", log)
            print(f"the killed worker's session answered again after {time.monotonic() - killed:.1f} s")
            assert worker_pid(tmp_path / "run", victim) != old_pid
            assert supervisor.poll() is None
            assert ws_result(base, sid, "x + 1") == "42"
            assert "restarting it" in log.read_text()
            # the restarted worker reaped nothing of its sibling's: those sessions kept their kernels and state
            for other, owner in owners.items():
                if owner != victim:
                    assert (
                        result_text(fresh("POST", f"{base}/v1/sessions/{other}/execute", json={"code": "x + 1"}).json())
                        == "2"
                    )

            # SIGTERM to the supervisor: every worker drains and ends, leaving no container
            supervisor.send_signal(signal.SIGTERM)
            assert supervisor.wait(timeout=60) == 0, log.read_text()[-4000:]
            assert "all 2 workers have ended" in log.read_text()
            with pytest.raises(httpx.ConnectError):
                fresh("GET", base + "/healthz")
            for worker in workers:
                assert_nothing_left(docker_client, worker)
    finally:
        for worker in workers:
            remove_everything(docker_client, worker)
    print(f"test took {time.monotonic() - t0:.1f} s")
