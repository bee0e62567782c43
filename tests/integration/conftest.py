"""A real gateway on a real Docker engine, shared by the integration tests.

The gateway runs in this process on its own thread and event loop (uvicorn), so
tests talk to it exactly as clients do: HTTP and WebSocket over loopback.
Integration tests are never skipped for lack of an engine: they fail, and the
message says how to start one.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
import uvicorn

from kernelgw.config import Settings
from kernelgw.server import create_app
from kernelgw.server.serving import uvicorn_config
from kernelgw.storage import Store
from kernelgw.storage.keys import KeyStore
from tests.support.http import http_fixture
from tests.support.processes import free_port

IMAGE = os.environ.get("KERNELGW_IMAGE", "kernelgw/python:latest")
# The container runtime of every test gateway: runc (default) or runsc (gVisor);
# scripts/test.sh runs the suite a second time with KERNELGW_TEST_RUNTIME=runsc.
RUNTIME = os.environ.get("KERNELGW_TEST_RUNTIME", "runc")


def gateway_settings(**overrides: Any) -> Settings:
    base: dict[str, Any] = dict(
        gateway_name=f"t{os.getpid()}",
        runtime_dir="/tmp/kgwt",
        image=IMAGE,
        runtime=RUNTIME,
        memory_mb=512,
        max_memory_mb=2048,
        max_sessions=40,
        exec_timeout_s=60,
        interrupt_grace_s=3,
        idle_timeout_s=3600,
        data_dir=f"/tmp/kgwt-data-{os.getpid()}",  # history (SQLite) of the test gateways
        on_shutdown="stop",  # in-process test gateways leave no kernel behind
        pool_size=0,  # tests that want a pool ask for one
    )
    # E2B's default template runs the code-interpreter image where the engine has
    # it, which scripts/test.sh's languages pass builds while the others run: it
    # is pinned to the Python image unless a test names its templates, so a test
    # sees one image whenever it runs (languages/test_code_interpreter.py has the other)
    base["e2b_templates"] = {"code-interpreter-v1": "python3"}
    base.update(overrides)
    return Settings(**base)


@dataclass
class RunningGateway:
    url: str
    settings: Settings
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def ws_url(self) -> str:
        return "ws" + self.url[len("http") :]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


def start_gateway(settings: Settings) -> RunningGateway:
    port = free_port()
    # as `kernelgw serve` runs it (header deadline, WebSocket implementation and cap)
    config = uvicorn_config(create_app(settings), settings, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"gateway-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test gateway did not start")
        time.sleep(0.02)
    return RunningGateway(f"http://127.0.0.1:{port}", settings, server, thread)


def assert_nothing_left(docker_client: docker.DockerClient, gateway_name: str) -> None:
    """No container (kernel or workspace store) and no volume of the name remains."""
    label = {"label": f"kernelgw.gateway={gateway_name}"}
    left = [c.name for c in docker_client.containers.list(all=True, filters=label)]
    left += [f"volume {v.name}" for v in docker_client.volumes.list(filters=label)]
    assert not left, f"left behind by gateway {gateway_name}: {left}"


def conn_dir_of(container: Any) -> str:
    """The host directory of a kernel container's sockets (its ``/conn`` mount)."""
    (source,) = [m["Source"] for m in container.attrs["Mounts"] if m["Destination"] == "/conn"]
    return str(source)


def remove_everything(docker_client: docker.DockerClient, gateway_name: str) -> None:
    """Remove every container, then every volume, of the name: never leave them,
    even when a test fails."""
    label = {"label": f"kernelgw.gateway={gateway_name}"}
    for container in docker_client.containers.list(all=True, filters=label):
        container.remove(force=True)
    for volume in docker_client.volumes.list(filters=label):
        volume.remove(force=True)


def make_key(data_dir: Path, name: str) -> str:
    """A new API key named ``name`` in the store under ``data_dir``; its text."""

    async def create() -> str:
        store = Store.from_settings(gateway_settings(data_dir=data_dir))
        await store.start()
        try:
            return (await KeyStore(store).create(name))[1]
        finally:
            await store.close()

    return asyncio.run(create())


@contextmanager
def gateway_with_key(
    docker_client: docker.DockerClient, data_dir: Path, name: str, **overrides: Any
) -> Iterator[tuple[RunningGateway, str]]:
    """A gateway that requires API keys (with ``overrides`` of its settings), and
    one key's text; afterwards no container of its name may be left."""
    key = make_key(data_dir, name)
    gw = start_gateway(gateway_settings(gateway_name=name, data_dir=data_dir, auth="required", **overrides))
    try:
        yield gw, key
    finally:
        gw.stop()
    assert_nothing_left(docker_client, name)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"No Docker engine answers ({exc}); run scripts/ensure-docker.sh", pytrace=False)
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"Kernel image {IMAGE} missing; run `kernelgw image build`", pytrace=False)
    yield client
    client.close()


@pytest.fixture(scope="session")
def gateway(docker_client: docker.DockerClient) -> Iterator[RunningGateway]:
    gw = start_gateway(gateway_settings())
    yield gw
    gw.stop()
    assert_nothing_left(docker_client, gw.settings.gateway_name)
    assert not (gw.settings.runtime_dir / gw.settings.gateway_name).exists(), "runtime directory left behind"


@pytest.fixture(scope="session")
def gateway_url(gateway: RunningGateway) -> str:
    return gateway.url


http = http_fixture("gateway")


@pytest.fixture
def session_id(http: httpx.Client) -> Iterator[str]:
    """A fresh session, deleted after the test."""
    resp = http.post("/v1/sessions", json={})
    assert resp.status_code == 201, resp.text
    sid = resp.json()["id"]
    yield sid
    http.delete(f"/v1/sessions/{sid}")


def run(http: httpx.Client, sid: str, code: str, **extra: Any) -> dict[str, Any]:
    """Blocking execute; returns the JSON body (status, events, ...)."""
    resp = http.post(f"/v1/sessions/{sid}/execute", json={"code": code, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def stdout(result: dict[str, Any]) -> str:
    return "".join(e["text"] for e in result["events"] if e["type"] == "stream" and e["name"] == "stdout")
