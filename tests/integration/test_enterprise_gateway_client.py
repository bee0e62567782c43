"""Jupyter Enterprise Gateway's own client against kernelgw's ``/api/kernels`` face.

``enterprise_gateway.client.gateway_client.GatewayClient`` (the client Enterprise
Gateway's integration tests drive) runs unchanged against a real gateway on
Docker kernels, with the workload of its ``itests/test_python_kernel.py``: start a
kernel, print, keep state across cells, an error, interrupt a running cell,
restart (state gone), shut down. It sends every message with ``"session": ""``
in its header, which kernelgw once dropped, so every execute timed out.

Enterprise Gateway is not in .venv: its pins (jupyter-client<7, jupyter-server<2,
pyzmq<25) and its server's dependencies (kubernetes, paramiko, yarn-api-client)
live in a tool venv of their own, ``scripts/ensure-enterprise-gateway.sh``, whose
python runs the workload (tests/fixtures/enterprise_gateway_workload.py) as a
subprocess and prints what each step returned as JSON. scripts/test.sh exports
that python as KERNELGW_ENTERPRISE_GATEWAY_PYTHON; without it, the test runs the
ensure script itself (the first time: a couple of minutes, from PyPI).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest

from tests.integration.conftest import RunningGateway, assert_nothing_left, gateway_settings, start_gateway

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ENSURE = ROOT / "scripts" / "ensure-enterprise-gateway.sh"
WORKLOAD = ROOT / "tests" / "fixtures" / "enterprise_gateway_workload.py"


def enterprise_gateway_python() -> str:
    python = os.environ.get("KERNELGW_ENTERPRISE_GATEWAY_PYTHON")
    if not python:
        done = subprocess.run(
            ["bash", str(ENSURE)], stdout=subprocess.PIPE, stderr=None, text=True, timeout=900, check=True
        )
        python = done.stdout.strip().splitlines()[-1]
    assert os.access(python, os.X_OK), f"no Enterprise Gateway python at {python}"
    return python


@pytest.fixture
def eg_gateway(docker_client: docker.DockerClient, tmp_path: Path) -> Iterator[RunningGateway]:
    name = f"teg{os.getpid()}"
    gw = start_gateway(
        gateway_settings(gateway_name=name, data_dir=tmp_path / "data")
    )  # no keys: the client sends none
    try:
        yield gw
    finally:
        gw.stop()
    assert_nothing_left(docker_client, name)


def test_enterprise_gateway_client_runs_its_python_kernel_workload(eg_gateway: RunningGateway) -> None:
    python = enterprise_gateway_python()
    # the client is not importable here: it stays in its own venv. -I: neither
    # PYTHONPATH nor the script's directory on its sys.path, only that venv's packages
    t0 = time.monotonic()
    done = subprocess.run(
        [python, "-I", str(WORKLOAD), eg_gateway.url], capture_output=True, text=True, timeout=600, check=False
    )
    print(f"Enterprise Gateway's GatewayClient: its Python workload in {time.monotonic() - t0:.2f}s")
    lines = done.stdout.strip().splitlines()
    assert lines, f"no result (exit {done.returncode}): {done.stderr[-3000:]}"
    seen = json.loads(lines[-1])
    assert "exception" not in seen, seen["exception"] + done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]

    # hello world, and state across cells; an execute_result is its text/plain
    assert seen["hello"] == ["Hello World\n", False]
    assert seen["assign"] == ["", False]
    assert seen["print_x"] == ["123\n", False]
    assert seen["result"] == ["124", False]

    # an error: has_error, with the exception's name and value
    text, has_error = seen["error"]
    assert has_error and "ZeroDivisionError:division by zero" in text

    # interrupt of a running cell (its client's REST call), once the kernel said busy
    assert seen["busy_after_s"] is not None, "the kernel never reported 'busy' for the running cell"
    assert seen["interrupt"] is True
    assert seen["interrupted_cell_ended"], "the interrupted cell never ended"
    assert seen["interrupted"] is not None, "the interrupted cell returned nothing"
    text, has_error = seen["interrupted"]
    # the kernel says busy before the cell's first line runs: the interrupt may
    # land before print('begin') (CI#21, under load) or after it; never after 'end'
    assert has_error and text.removeprefix("begin\n").startswith("KeyboardInterrupt:"), text
    assert "end" not in text.split("\n"), text
    assert seen["after_interrupt"] == ["124\n", False]  # the state survived

    # restart: a fresh kernel, the state gone
    assert seen["restart"] is True
    assert seen["idle_after_restart_s"] is not None, "the kernel never reported 'idle' after its restart"
    text, has_error = seen["after_restart_name"]
    assert has_error and "NameError" in text
    assert seen["after_restart_print"] == ["after restart\n", False]

    # shutdown: DELETE answered 204 (else the client raises), and the kernel is gone
    assert seen["shutdown"] == "ok"
    gone = httpx.get(f"{eg_gateway.url}/api/kernels/{seen['kernel_id']}", timeout=30)
    assert gone.status_code == 404, gone.text
