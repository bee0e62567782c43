"""JupyterLab's own client library, ``@jupyterlab/services`` (its
``SessionManager`` and ``KernelManager``: what JupyterLab's and VS Code's
notebooks use to talk to a Jupyter server directly), unmodified, in Node,
against kernelgw with a key required: it starts a notebook session (``POST
/api/sessions``), runs a cell over the channels, lists, renames and shuts the
session down, and the kernel is gone from kernelgw.

Needs Node and the library: ``scripts/ensure-node-clients.sh``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from tests.integration.conftest import RunningGateway, gateway_with_key

pytestmark = pytest.mark.integration

NODE_DIR = Path(os.environ.get("KERNELGW_NODE_DIR", "/var/cache/kernelgw/node"))
SCRIPT = Path(__file__).parent / "node" / "lab_services_sessions.js"


@pytest.fixture(scope="module")
def keyed_gateway(
    docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, str]]:
    with gateway_with_key(docker_client, tmp_path_factory.mktemp("labservices-gw"), f"tls{os.getpid()}") as pair:
        yield pair


def test_jupyterlab_services_session_manager_runs_a_notebook_session(
    keyed_gateway: tuple[RunningGateway, str],
) -> None:
    gw, key = keyed_gateway
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "@jupyterlab" / "services").is_dir():
        pytest.fail("No Node or @jupyterlab/services; run scripts/ensure-node-clients.sh", pytrace=False)
    env = {**os.environ, "NODE_PATH": str(NODE_DIR / "node_modules"), "KGW_URL": gw.url, "KGW_TOKEN": key}
    t0 = time.monotonic()
    done = subprocess.run([node, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300, check=False)
    print(f"@jupyterlab/services: session, cell, rename, shutdown in {time.monotonic() - t0:.2f}s")
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["language"] == "python"
    assert (seen["stdout"], seen["status"]) == ("42\n", "ok")
    assert seen["running"] == [{"id": seen["session"], "path": "work/analysis.ipynb", "kernel": seen["kernel"]}]
    assert seen["renamed"] == "work/renamed.ipynb"
    assert seen["after"] == 0
    assert seen["kernel"] not in seen["kernelsAfter"], "shutting the session down shut its kernel down"
