"""Reattach after restart: a real ``kernelgw serve`` stopped (SIGTERM) or killed
(SIGKILL) leaves its kernels running, and the next process of its name takes
them over with their state; sessions whose container is gone are ended with a
recorded reason; ``on_shutdown=stop`` leaves nothing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from kernelgw.runtime.manager import KERNEL_GONE_REASON
from tests.integration.conftest import IMAGE, RUNTIME, free_port
from tests.security.conftest import gateway_containers, session_containers

pytestmark = pytest.mark.integration

RUNTIME_DIR = Path("/tmp/kgwr")


@contextmanager
def serve(name: str, data_dir: Path, log: Path, **env: str) -> Iterator[tuple[subprocess.Popen[bytes], httpx.Client]]:
    """``kernelgw serve`` in its own process; killed at the end if still running."""
    port = free_port()
    full_env = {
        **os.environ,
        "KERNELGW_GATEWAY_NAME": name,
        "KERNELGW_IMAGE": IMAGE,
        "KERNELGW_RUNTIME": RUNTIME,
        "KERNELGW_RUNTIME_DIR": str(RUNTIME_DIR),
        "KERNELGW_DATA_DIR": str(data_dir),
        "KERNELGW_MEMORY_MB": "256",
        "KERNELGW_LOG_FORMAT": "text",
        **env,
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernelgw", "serve", "--port", str(port)], env=full_env, stdout=out, stderr=out
        )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http.get("/healthz", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "the gateway did not start"
                time.sleep(0.1)
            yield proc, http
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _execute(http: httpx.Client, sid: str, code: str) -> dict[str, Any]:
    response = http.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _stdout(body: dict[str, Any]) -> str:
    return "".join(e["text"] for e in body["events"] if e["type"] == "stream" and e["name"] == "stdout")


def _sessions(http: httpx.Client) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in http.get("/v1/sessions").json()["sessions"]}


def _running(client: docker.DockerClient, sid: str) -> bool:
    return [c.status for c in session_containers(client, sid)] == ["running"]


def test_sessions_survive_sigterm_and_kill9_and_stop_ends_them(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    name = f"reat{os.getpid()}"
    data, log = tmp_path / "data", tmp_path / "gateway.log"
    try:
        with serve(name, data, log) as (proc, http):
            sids = [http.post("/v1/sessions", json={}).json()["id"] for _ in range(3)]
            for sid in sids:
                assert _execute(http, sid, "x = 42")["execution_count"] == 1
            owners = {sid: s["owner"] for sid, s in _sessions(http).items()}
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM), log.read_text()[-3000:]
        # on_shutdown=keep (the default): the kernels outlive the gateway
        assert all(_running(docker_client, sid) for sid in sids)

        with serve(name, data, log) as (proc, http):
            listed = _sessions(http)
            assert set(listed) == set(sids)
            assert {sid: s["owner"] for sid, s in listed.items()} == owners
            assert all(s["execution_count"] == 1 for s in listed.values())
            for sid in sids:
                body = _execute(http, sid, "print(x)")
                assert _stdout(body) == "42\n" and body["execution_count"] == 2
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert all(_running(docker_client, sid) for sid in sids)
        # meanwhile an operator removes one kernel by hand
        gone = sids.pop()
        for container in session_containers(docker_client, gone):
            container.remove(force=True)

        with serve(name, data, log, KERNELGW_ON_SHUTDOWN="stop") as (proc, http):
            assert set(_sessions(http)) == set(sids)
            for sid in sids:
                body = _execute(http, sid, "print(x)")
                assert _stdout(body) == "42\n" and body["execution_count"] == 3
            history = http.get(f"/v1/sessions/{gone}/history").json()
            assert history["ended_at"] is not None and history["end_reason"] == KERNEL_GONE_REASON
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM), log.read_text()[-3000:]
        # on_shutdown=stop: nothing survives
        assert gateway_containers(docker_client, name) == []

        with serve(name, data, log) as (proc, http):
            assert _sessions(http) == {}
            for sid in sids:
                assert http.get(f"/v1/sessions/{sid}/history").json()["end_reason"] == "gateway shutdown"
    finally:
        for container in gateway_containers(docker_client, name):  # never leave them, even on failure
            container.remove(force=True)
        shutil.rmtree(RUNTIME_DIR / name, ignore_errors=True)
    assert gateway_containers(docker_client, name) == []
