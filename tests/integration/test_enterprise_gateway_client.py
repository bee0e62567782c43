"""Jupyter Enterprise Gateway's own client against kernelgw's ``/api/kernels`` face.

``enterprise_gateway.client.gateway_client.GatewayClient`` (the client Enterprise
Gateway's integration tests drive) runs unchanged against a real gateway on
Docker kernels, with the workload of its ``itests/test_python_kernel.py``: start a
kernel, print, keep state across cells, an error, interrupt a running cell,
restart (state gone), shut down. It sends every message with ``"session": ""``
in its header, which kernelgw once dropped, so every execute timed out.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import docker
import pytest

from tests.integration.conftest import RunningGateway, assert_nothing_left, gateway_settings, start_gateway

pytestmark = pytest.mark.integration

DEADLINE_S = 90
EXECUTE_TIMEOUT_S = 60
"""Per message of a cell: GatewayClient's ``execute`` waits this long for each one."""


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


def wait_for_state(kernel: Any, state: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while kernel.get_state() != state:
        assert time.monotonic() < deadline, f"the kernel never reported {state!r}"
        time.sleep(0.05)


def test_enterprise_gateway_client_runs_its_python_kernel_workload(eg_gateway: RunningGateway) -> None:
    from enterprise_gateway.client.gateway_client import GatewayClient

    client = GatewayClient(host=urlsplit(eg_gateway.url).netloc)
    kernel = client.start_kernel("python3", timeout=EXECUTE_TIMEOUT_S)
    try:
        # hello world, and state across cells
        assert kernel.execute("print('Hello World')") == ("Hello World\n", False)
        assert kernel.execute("x = 123") == ("", False)
        assert kernel.execute("print(x)") == ("123\n", False)
        assert kernel.execute("x + 1") == ("124", False)  # an execute_result

        # an error: has_error, with the exception's name and value
        text, has_error = kernel.execute("1/0")
        assert has_error and "ZeroDivisionError:division by zero" in text

        # interrupt a running cell (its client's REST call), once the kernel says busy
        outcome: list[tuple[str, bool]] = []
        cell = threading.Thread(
            target=lambda: outcome.append(kernel.execute("import time\nprint('begin')\ntime.sleep(30)\nprint('end')"))
        )
        cell.start()
        wait_for_state(kernel, "busy")
        assert kernel.interrupt()
        cell.join(timeout=DEADLINE_S)
        assert not cell.is_alive()
        ((text, has_error),) = outcome
        assert has_error and text.startswith("begin\nKeyboardInterrupt:")  # 'end' never printed
        assert kernel.execute("y = x + 1\nprint(y)") == ("124\n", False)  # the state survived

        # restart: a fresh kernel, the state gone
        assert kernel.restart(timeout=EXECUTE_TIMEOUT_S)
        wait_for_state(kernel, "idle")
        text, has_error = kernel.execute("y = x + 1")
        assert has_error and "NameError" in text
        assert kernel.execute("print('after restart')") == ("after restart\n", False)
    finally:
        client.shutdown_kernel(kernel)  # DELETE, 204 (else it raises)
