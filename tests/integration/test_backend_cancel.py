"""A kernel start cancelled midway leaves no container: the engine's calls run
on the backend's threads, which go on whatever the caller does, so a start
cancelled while its thread makes the container (a pool refilling as its
gateway stops) must remove what the thread made. Real engine, real image."""

from __future__ import annotations

import asyncio
import os
import secrets

import docker
import pytest

from kernelgw.runtime.backends.docker import DockerBackend
from tests.integration.conftest import IMAGE, assert_nothing_left, remove_everything
from tests.integration.languages import RUNTIME_DIR, kernel_spec

pytestmark = pytest.mark.integration


def test_a_start_cancelled_while_its_container_is_made_leaves_none(docker_client: docker.DockerClient) -> None:
    name = f"cancel{os.getpid() % 100000}{secrets.token_hex(2)}"
    backend = DockerBackend(gateway_name=name, runtime_dir=RUNTIME_DIR)
    label = {"label": f"kernelgw.gateway={name}"}

    async def scenario() -> None:
        spec = kernel_spec(IMAGE)
        starting = asyncio.create_task(backend.start(spec))
        # cancelled once the engine is making it (its container exists), before the start returned;
        # sparse: a full list inspects each container it found, and the start may remove it meanwhile
        # (CI#26: NotFound from the list itself)
        while not docker_client.containers.list(all=True, sparse=True, filters=label):
            assert not starting.done(), "the start ended before it could be cancelled midway"
            await asyncio.sleep(0.005)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        await backend.end_session(spec.session_id)
        # every engine call the backend started has ended: what they made is there to see
        await asyncio.to_thread(backend._pool.shutdown, wait=True)

    try:
        asyncio.run(scenario())
        left = docker_client.containers.list(all=True, sparse=True, filters=label)
        assert left == [], "the cancelled start left its container"
    finally:
        remove_everything(docker_client, name)
    assert_nothing_left(docker_client, name)
