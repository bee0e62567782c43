"""A session may ask for gVisor (runsc) when the gateway allows it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import docker
import httpx
import pytest

from tests.integration.conftest import (
    RunningGateway,
    gateway_settings,
    run,
    start_gateway,
    stdout,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gw(docker_client: docker.DockerClient) -> Iterator[RunningGateway]:
    runtimes = docker_client.info().get("Runtimes", {})
    assert "runsc" in runtimes, "gVisor is not registered with the engine: run scripts/ensure-runsc.sh"
    gateway = start_gateway(
        gateway_settings(gateway_name=f"rt{os.getpid()}", runtime="runc", allowed_runtimes=["runsc"], pids_limit=24)
    )
    yield gateway
    gateway.stop()


def _container(docker_client: docker.DockerClient, session_id: str) -> Any:
    (container,) = docker_client.containers.list(filters={"label": f"kernelgw.session={session_id}"})
    return container


def test_a_session_can_ask_for_gvisor(gw: RunningGateway, docker_client: docker.DockerClient) -> None:
    with httpx.Client(base_url=gw.url, timeout=120) as http:
        plain = http.post("/v1/sessions", json={}).json()
        boxed = http.post("/v1/sessions", json={"runtime": "runsc"})
        assert boxed.status_code == 201, boxed.text
        boxed_id = boxed.json()["id"]
        try:
            assert boxed.json()["runtime"] == "runsc" and plain["runtime"] == "runc"
            assert _container(docker_client, boxed_id).attrs["HostConfig"]["Runtime"] == "runsc"
            assert _container(docker_client, plain["id"]).attrs["HostConfig"]["Runtime"] == "runc"
            # gVisor's own kernel answers inside the sandbox
            out = stdout(
                run(
                    http,
                    boxed_id,
                    "import subprocess\nprint(subprocess.run(['dmesg'], capture_output=True, text=True).stdout)",
                )
            )
            assert "gVisor" in out
            assert stdout(run(http, plain["id"], "print(6 * 7)")) == "42\n"
        finally:
            http.delete(f"/v1/sessions/{boxed_id}")
            http.delete(f"/v1/sessions/{plain['id']}")


def test_a_runtime_the_gateway_does_not_allow_is_refused(http: httpx.Client) -> None:
    resp = http.post("/v1/sessions", json={"runtime": "runsc"})  # the shared gateway allows only its own
    if resp.status_code == 201:  # the shared gateway itself runs under runsc (the CI's second pass)
        http.delete(f"/v1/sessions/{resp.json()['id']}")
        resp = http.post("/v1/sessions", json={"runtime": "runc"})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "limit_exceeded" and "allowed runtimes" in resp.json()["error"]["message"]


def test_the_process_limit_holds_inside_gvisor(gw: RunningGateway) -> None:
    """Under runsc the limit is RLIMIT_NPROC inside the sandbox (the pids cgroup
    also counts gVisor's own threads): a fork bomb gets EAGAIN, the sandbox lives."""
    code = (
        "import os, signal, time\n"
        "children = []\n"
        "try:\n"
        "    for _ in range(500):\n"
        "        pid = os.fork()\n"
        "        if pid == 0:\n"
        "            time.sleep(30)\n"
        "            os._exit(0)\n"
        "        children.append(pid)\n"
        "except OSError as e:\n"
        "    print('STOPPED', type(e).__name__)\n"
        "print(len(children))\n"
        "for pid in children:\n"
        "    os.kill(pid, signal.SIGKILL)\n"
        "    os.waitpid(pid, 0)\n"
    )
    with httpx.Client(base_url=gw.url, timeout=120) as http:
        sid = http.post("/v1/sessions", json={"runtime": "runsc", "memory_mb": 2048}).json()["id"]
        try:
            out = stdout(run(http, sid, code, timeout=90)).splitlines()
            assert out[0] == "STOPPED BlockingIOError"
            assert 0 < int(out[1]) < 24
            assert stdout(run(http, sid, "print('alive')")) == "alive\n"
        finally:
            http.delete(f"/v1/sessions/{sid}")
