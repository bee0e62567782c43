"""E2B's own SDKs (`e2b`, `e2b-code-interpreter` from PyPI), unchanged, against a
real gateway's /e2b face: only the environment variables a user would set."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from e2b_code_interpreter import Sandbox

from tests.integration.conftest import RunningGateway, gateway_with_key

E2B_ENV = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY", "E2B_HTTP_VERSION", "E2B_DOMAIN", "E2B_DEBUG")


@dataclass
class E2BGateway:
    gateway: RunningGateway
    key: str
    """An API key of the gateway (authentication required), as ``E2B_API_KEY``."""

    @property
    def url(self) -> str:
        """``E2B_API_URL`` and ``E2B_SANDBOX_URL``: the face's one base URL."""
        return f"{self.gateway.url}/e2b"

    def use(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point E2B's SDK here: the environment variables a user sets to move to
        kernelgw, and none of theirs from the machine running the tests."""
        for name in E2B_ENV:
            monkeypatch.delenv(name, raising=False)
        for name, value in self.env().items():
            monkeypatch.setenv(name, value)

    def env(self) -> dict[str, str]:
        return {
            "E2B_API_URL": self.url,
            "E2B_SANDBOX_URL": self.url,
            "E2B_API_KEY": self.key,
            "E2B_HTTP_VERSION": "1.1",  # http:// without TLS (the SDK's HTTP/2 needs TLS or prior knowledge)
        }


@pytest.fixture(scope="module")
def e2b_gateway(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2BGateway]:
    """A gateway with authentication on; no container of its name is left after."""
    data_dir: Path = tmp_path_factory.mktemp("e2b-data")
    with gateway_with_key(docker_client, data_dir, f"e2b{os.getpid()}") as (gw, key):
        yield E2BGateway(gw, key)


@pytest.fixture
def e2b_env(e2b_gateway: E2BGateway, monkeypatch: pytest.MonkeyPatch) -> E2BGateway:
    """The environment variables an E2B user sets to move to kernelgw (and none of
    theirs from the machine running the tests)."""
    e2b_gateway.use(monkeypatch)
    return e2b_gateway


@pytest.fixture
def sbx(e2b_env: E2BGateway) -> Iterator[Sandbox]:
    """A code-interpreter sandbox of the module's gateway (E2B's default timeout), killed after."""
    sandbox = Sandbox.create(timeout=300)
    try:
        yield sandbox
    finally:
        sandbox.kill()
