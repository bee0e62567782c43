"""Session lifecycle: concurrency, limits, clean-up, orphans, idle reaping."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import httpx
import pytest

from tests.integration.conftest import (
    RunningGateway,
    conn_dir_of,
    free_port,
    gateway_settings,
    run,
    start_gateway,
    stdout,
)

pytestmark = pytest.mark.integration


def _containers(client: docker.DockerClient, label: str) -> list:
    return client.containers.list(all=True, filters={"label": label})


def test_ten_concurrent_sessions_without_cross_talk(http: httpx.Client) -> None:
    def lifecycle(i: int) -> tuple[int, str, str]:
        sid = http.post("/v1/sessions", json={}).json()["id"]
        try:
            run(http, sid, f"secret = {i}\nopen('mine.txt', 'w').write(str({i}))")
            out = stdout(run(http, sid, "import os\nprint(secret, open('mine.txt').read(), sorted(os.listdir('.')))"))
            return i, sid, out
        finally:
            http.delete(f"/v1/sessions/{sid}")

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lifecycle, range(10)))
    assert len({sid for _, sid, _ in results}) == 10
    for i, _, out in results:
        assert out == f"{i} {i} ['mine.txt']\n"


def test_delete_removes_container_and_connection_directory(
    docker_client: docker.DockerClient, http: httpx.Client
) -> None:
    sid = http.post("/v1/sessions", json={}).json()["id"]
    (container,) = _containers(docker_client, f"kernelgw.session={sid}")
    conn_dir = Path(conn_dir_of(container))
    assert conn_dir.is_dir()
    assert http.delete(f"/v1/sessions/{sid}").status_code == 204
    assert _containers(docker_client, f"kernelgw.session={sid}") == []
    assert not conn_dir.exists()
    resp = http.get(f"/v1/sessions/{sid}")
    assert resp.status_code == 404
    assert resp.json()["error"]["code"] == "session_not_found"
    assert http.delete(f"/v1/sessions/{sid}").status_code == 404


def test_session_limit_gives_429(gateway: RunningGateway) -> None:
    gw = start_gateway(gateway_settings(gateway_name=f"{gateway.settings.gateway_name}l", max_sessions=2))
    try:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            ids = [http.post("/v1/sessions", json={}).json()["id"] for _ in range(2)]
            resp = http.post("/v1/sessions", json={})
            assert resp.status_code == 429
            assert "maximum of 2 sessions" in resp.json()["error"]["message"]
            assert int(resp.headers["Retry-After"]) > 0  # as docs/reference/rest-api.md promises
            http.delete(f"/v1/sessions/{ids[0]}")
            assert http.post("/v1/sessions", json={}).status_code == 201
    finally:
        gw.stop()


def test_limits_beyond_the_maximum_are_refused(http: httpx.Client) -> None:
    resp = http.post("/v1/sessions", json={"memory_mb": 10**6})
    assert resp.status_code == 400
    assert "memory_mb" in resp.json()["error"]["message"]
    resp = http.post("/v1/sessions", json={"image": "alpine:latest"})
    assert resp.status_code == 400
    assert "not allowed" in resp.json()["error"]["message"]


def test_env_vars_reach_the_kernel(http: httpx.Client) -> None:
    sid = http.post("/v1/sessions", json={"env": {"GREETING": "hello"}}).json()["id"]
    try:
        assert stdout(run(http, sid, "import os\nprint(os.environ['GREETING'])")) == "hello\n"
    finally:
        http.delete(f"/v1/sessions/{sid}")


def test_idle_sessions_are_reaped(docker_client: docker.DockerClient, gateway: RunningGateway) -> None:
    gw = start_gateway(
        gateway_settings(gateway_name=f"{gateway.settings.gateway_name}r", idle_timeout_s=1, reap_interval_s=0.3)
    )
    try:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            deadline = time.monotonic() + 30
            while http.get(f"/v1/sessions/{sid}").status_code == 200:
                assert time.monotonic() < deadline, "idle session was not reaped"
                time.sleep(0.2)
            assert _containers(docker_client, f"kernelgw.session={sid}") == []
    finally:
        gw.stop()


def test_containers_left_by_a_killed_gateway_are_removed_at_next_start(
    docker_client: docker.DockerClient, gateway: RunningGateway, tmp_path: Path
) -> None:
    name = f"{gateway.settings.gateway_name}k"
    port = free_port()
    env = {
        **os.environ,
        "KERNELGW_GATEWAY_NAME": name,
        "KERNELGW_RUNTIME_DIR": str(gateway.settings.runtime_dir),
        "KERNELGW_IMAGE": gateway.settings.image,
        "KERNELGW_RUNTIME": gateway.settings.runtime,
        "KERNELGW_POOL_SIZE": "0",
    }
    log = tmp_path / "gateway.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernelgw", "serve", "--port", str(port)],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline
                time.sleep(0.2)
        sid = httpx.post(f"{url}/v1/sessions", json={}, timeout=120).json()["id"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (orphan,) = _containers(docker_client, f"kernelgw.session={sid}")
    conn_dir = Path(conn_dir_of(orphan))
    assert orphan.status == "running" and conn_dir.exists()
    assert orphan.attrs["HostConfig"]["Runtime"] == gateway.settings.runtime

    successor = start_gateway(gateway_settings(gateway_name=name))
    try:
        assert _containers(docker_client, f"kernelgw.gateway={name}") == []
        assert not conn_dir.exists()
    finally:
        successor.stop()
