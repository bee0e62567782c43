"""Threat: a kernel filling the host's disk through its container's log.

What a kernel process writes to its own stdout or stderr outside Jupyter (the
fds ipykernel keeps from before its capture, a subprocess given them, R's
``system()``) goes to the engine's log driver, on the host. Every container the
gateway starts logs to one json-file of at most 1 MiB.
"""

from __future__ import annotations

import os
import time

import docker
import httpx
import pytest

from tests.security.conftest import (
    LABEL_GATEWAY,
    RUNTIME,
    MiB,
    RunningGateway,
    run,
    run_json,
    session_containers,
)

pytestmark = pytest.mark.integration

BOUNDED_LOG = {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "1"}}
LOG_SLACK = 64 * 1024
"""json-file checks the size before each message: the file may pass 1 MiB by one
message (at most 16 KiB read from the pipe, JSON-escaped)."""
LABEL_STORE = "kernelgw.store"

FLOOD = """\
fd = getattr(sys, {stream!r})._original_stdstream_copy
written = 0
chunk = (b'x' * 1023 + b'\\n') * 1024
for _ in range(50):
    view = memoryview(chunk)
    while view:  # a pipe may take part of a write (gVisor: about 64 KiB)
        n = os.write(fd, view)
        written, view = written + n, view[n:]
# a subprocess with the kernel's real fd (what a bash kernel's commands or R's system() get)
subprocess.run(['sh', '-c', 'head -c 20000000 /dev/zero | tr "\\\\0" y'], stdout=fd, check=True)
written += 20_000_000
os.write(fd, b'\\n{tail}\\n')
print(json.dumps({{'fd': fd, 'written': written}}))
"""
"""Kernel code: 70 MB to the kernel's real stdout or stderr, then a last line."""


def wait_for_log_line(client: docker.DockerClient, container_id: str, line: str) -> None:
    """Until ``line`` is in the container's log: the engine copies the pipe into the
    log after the kernel's writes returned. One stream at a time, so nothing is
    written after ``line`` to rotate it away."""
    deadline = time.monotonic() + 60
    while line not in client.api.logs(container_id, stdout=True, stderr=True, tail=3).decode(errors="replace"):
        assert time.monotonic() < deadline, f"{line!r} never reached the container's log"
        time.sleep(0.1)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_what_a_kernel_writes_to_its_real_stdout_stays_bounded_on_the_host(
    http: httpx.Client, session_id: str, docker_client: docker.DockerClient, stream: str
) -> None:
    tail = f"kgw-log-tail-{stream}"
    got = run_json(http, session_id, FLOOD.format(stream=stream, tail=tail), timeout=120)
    assert isinstance(got["fd"], int) and got["fd"] > 2, got
    assert got["written"] == 50 * MiB + 20_000_000
    (container,) = session_containers(docker_client, session_id)
    wait_for_log_line(docker_client, container.id, tail)
    container.reload()
    size = os.path.getsize(container.attrs["LogPath"])
    assert size <= MiB + LOG_SLACK, f"{size} bytes of log on the host for {got['written']} written"
    assert container.attrs["HostConfig"]["LogConfig"] == BOUNDED_LOG


def test_every_container_of_the_gateway_has_a_bounded_log(
    http: httpx.Client, session_id: str, gateway: RunningGateway, docker_client: docker.DockerClient
) -> None:
    # a file in the workspace starts the session's store container (runc only: see workspace_store.py)
    result = run(http, session_id, "open('/workspace/f', 'w').write('x')")
    assert result["status"] == "ok", result["events"][-1]
    if RUNTIME == "runc":
        deadline = time.monotonic() + 60
        while not docker_client.containers.list(all=True, filters={"label": f"{LABEL_STORE}={session_id}"}):
            assert time.monotonic() < deadline, "the session's store container never started"
            time.sleep(0.1)
    name = gateway.settings.gateway_name
    containers = docker_client.containers.list(all=True, filters={"label": f"{LABEL_GATEWAY}={name}"})
    assert containers
    unbounded = {c.name: c.attrs["HostConfig"]["LogConfig"] for c in containers}
    assert {n: cfg for n, cfg in unbounded.items() if cfg != BOUNDED_LOG} == {}
