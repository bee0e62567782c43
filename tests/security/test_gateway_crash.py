"""Threat: sandboxes that outlive the gateway that was supposed to police them.

A real ``kernelgw serve`` process with two sessions is SIGKILLed: its containers
really are left behind (still running). The next gateway of the same name
reattaches the live one and removes the dead one while it starts, and a clean
shutdown with ``on_shutdown=stop`` must leave no container at all.
(tests/integration/test_sessions.py covers a container no store knows, with an
in-process successor; tests/integration/test_reattach.py the reattachment.)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import docker
import httpx
import pytest

from kernelgw.runtime.backends.labels import LABEL_KERNEL
from tests.integration.conftest import IMAGE, RUNTIME, assert_nothing_left, remove_everything
from tests.security.conftest import gateway_containers, session_containers
from tests.support import processes

pytestmark = pytest.mark.integration

RUNTIME_DIR = Path("/tmp/kgwk")


@contextmanager
def gateway_process(
    name: str, data_dir: Path, log: Path, **extra_env: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    with processes.gateway_process(
        name, data_dir, log, image=IMAGE, runtime=RUNTIME, runtime_dir=RUNTIME_DIR, **extra_env
    ) as running:
        yield running


def test_a_killed_gateways_live_kernels_are_reattached_and_dead_ones_removed(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    name = f"crash{os.getpid()}"
    log = tmp_path / "gateway.log"
    try:
        with gateway_process(name, tmp_path / "data", log) as (proc, url):
            with httpx.Client(base_url=url, timeout=120) as http:
                sids = [http.post("/v1/sessions", json={}).json()["id"] for _ in range(2)]
                for sid in sids:
                    assert http.post(f"/v1/sessions/{sid}/execute", json={"code": "x = 1"}).json()["status"] == "ok"
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        # the crash is real: the sandboxes are still there, still running
        orphans = [c for sid in sids for c in session_containers(docker_client, sid)]
        assert len(orphans) == 2 and all(c.status == "running" for c in orphans), orphans
        live, dead = sids
        session_containers(docker_client, dead)[0].kill()  # its kernel dies while no gateway runs

        with gateway_process(name, tmp_path / "data", log, KERNELGW_ON_SHUTDOWN="stop") as (proc, url):
            # while starting: the live kernel is reattached, the dead one removed
            assert [s["id"] for s in httpx.get(f"{url}/v1/sessions", timeout=10).json()["sessions"]] == [live]
            assert session_containers(docker_client, dead) == []
            assert [c.status for c in session_containers(docker_client, live)] == ["running"]
            # the successor works, and stops cleanly
            with httpx.Client(base_url=url, timeout=120) as http:
                sid = http.post("/v1/sessions", json={}).json()["id"]
                assert http.post(f"/v1/sessions/{sid}/execute", json={"code": "1"}).json()["status"] == "ok"
            kernels = [c for c in gateway_containers(docker_client, name) if LABEL_KERNEL in c.labels]
            assert len(kernels) == 2
            proc.send_signal(signal.SIGTERM)
            # uvicorn shuts down gracefully, then re-raises the signal (exit -15)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM), log.read_text()[-2000:]
            assert "Application shutdown complete" in log.read_text()
        assert_nothing_left(docker_client, name)
    finally:
        remove_everything(docker_client, name)
        shutil.rmtree(RUNTIME_DIR / name, ignore_errors=True)
