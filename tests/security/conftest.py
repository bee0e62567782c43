"""The adversarial suite's own gateway, sessions and helpers.

Every test here runs hostile code (or hostile requests) against a real gateway
with real containers and asserts the safe outcome. Two things are checked
around every test, whatever it did:

* a long-lived *bystander* session still answers (``x += 1``, counting up) and
  ``/healthz`` is 200: one session's attack never hurts the gateway or another
  session;
* when the suite ends, no container of this gateway is left.

The gateway process carries a recognisable secret in its environment
(``KERNELGW_TEST_SECRET_MARKER``) so tests can prove it never reaches a sandbox.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.integration import conftest as integration
from tests.integration.conftest import (
    RUNTIME as RUNTIME,  # re-exported: the container runtime under test
)
from tests.integration.conftest import (
    RunningGateway,
    gateway_settings,
    run,
    start_gateway,
    stdout,
)
from tests.support.http import http_fixture

docker_client = integration.docker_client
"""The engine fixture (session-scoped), shared with the integration tests."""

MiB = 1024 * 1024
SECRET_ENV = "KERNELGW_TEST_SECRET_MARKER"
SECRET_MARKER = f"kgw-secret-{secrets.token_hex(12)}"
"""In the gateway's environment; must never show up inside a container."""

UNREACHABLE = {"ENETUNREACH", "EHOSTUNREACH"}
"""What a connection to a routed address may fail with: runc says there is no
network, gVisor (runsc) that there is no route to the host. Nothing else is safe."""

LABEL_GATEWAY = "kernelgw.gateway"
LABEL_SESSION = "kernelgw.session"

# Defined in the kernel before a probe: outcome(fn) is 'ok' or the errno name of
# the OSError fn raised; libc(name, *args) calls libc and raises OSError on -1.
PROBE = """\
import ctypes, errno, json, os, socket, subprocess, sys
def outcome(fn):
    try:
        fn()
        return 'ok'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
_libc = ctypes.CDLL(None, use_errno=True)
def libc(name, *args):
    if getattr(_libc, name)(*args) == -1:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
"""

LIST_PROCESSES = """\
cmds = {}
for _pid in os.listdir('/proc'):
    if _pid.isdigit():
        try:
            cmds[_pid] = open(f'/proc/{_pid}/cmdline').read().replace('\\0', ' ').strip()
        except OSError:
            pass
print(json.dumps(cmds))
"""
"""Kernel code (for run_json): {pid: command line} of every process the
container shows. (The engine's ``docker top`` is no use under gVisor, where it
lists the host's processes.)"""


# --------------------------------------------------------------------- gateway


@pytest.fixture(scope="session")
def gateway(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SECRET_ENV, SECRET_MARKER)
        gw = start_gateway(
            gateway_settings(
                gateway_name=f"sec{os.getpid()}",
                data_dir=str(tmp_path_factory.mktemp("sec-data")),
                # small tmpfs mounts: filling them ends in ENOSPC long before the
                # session's memory limit (tmpfs pages count against it)
                tmp_size_mb=32,
                workspace_size_mb=32,
                shm_size_mb=16,
                max_output_bytes=4 * MiB,
                max_image_bytes=1 * MiB,
                interrupt_grace_s=2,
            )
        )
        try:
            yield gw
        finally:
            gw.stop()
    integration.assert_nothing_left(docker_client, gw.settings.gateway_name)
    # the gateway removes its runtime directory once every session is gone
    assert not (gw.settings.runtime_dir / gw.settings.gateway_name).exists()


http = http_fixture("gateway")


@pytest.fixture
def session_id(http: httpx.Client) -> Iterator[str]:
    """A fresh session, deleted after the test."""
    with new_session(http) as sid:
        yield sid


@dataclass
class Bystander:
    session_id: str
    count: int = 0


@pytest.fixture(scope="session")
def bystander(http: httpx.Client) -> Iterator[Bystander]:
    with new_session(http) as sid:
        run(http, sid, "x = 0")
        yield Bystander(sid)


@pytest.fixture(autouse=True)
def other_sessions_keep_working(http: httpx.Client, bystander: Bystander) -> Iterator[None]:
    """After every test: the gateway is healthy and an unrelated session still
    has its state and answers."""
    yield
    bystander.count += 1
    result = run(http, bystander.session_id, "x += 1\nprint(x)")
    assert stdout(result) == f"{bystander.count}\n", f"the bystander session was hurt: {result['events'][-1]}"
    health = http.get("/healthz")
    assert health.status_code == 200, health.text


@pytest.fixture(scope="session")
def host_marker() -> Iterator[Path]:
    """A file on the host with random content: never readable from a sandbox."""
    path = Path("/tmp") / f"kgw-host-marker-{secrets.token_hex(6)}"
    path.write_text(f"host-only {secrets.token_hex(16)}\n")
    yield path
    path.unlink(missing_ok=True)


# --------------------------------------------------------------------- helpers


@contextmanager
def new_session(http: httpx.Client, **options: Any) -> Iterator[str]:
    resp = http.post("/v1/sessions", json=options)
    assert resp.status_code == 201, resp.text
    sid = resp.json()["id"]
    try:
        yield sid
    finally:
        http.delete(f"/v1/sessions/{sid}")


def run_json(http: httpx.Client, sid: str, code: str, **extra: Any) -> Any:
    """Run ``code`` (after PROBE), which must succeed and print JSON as its last line."""
    result = run(http, sid, PROBE + code, **extra)
    assert result["status"] == "ok", describe_failure(result)
    lines = stdout(result).strip().splitlines()
    assert lines, result["events"]
    return json.loads(lines[-1])


def describe_failure(result: dict[str, Any]) -> str:
    """The done reason and the error's last traceback lines, for assertion messages."""
    errors = ["\n".join(e["traceback_text"][-3:]) for e in result["events"] if e["type"] == "error"]
    return f"{result['events'][-1].get('reason')!r} {errors}"


def in_child(code: str) -> str:
    """Kernel code that runs ``code`` (after PROBE) in a fresh Python process and
    prints its last stdout line: for probes that would change the kernel itself
    (unshare, chroot)."""
    return (
        f"_child = subprocess.run([sys.executable, '-c', {PROBE + code!r}],\n"
        "                        capture_output=True, text=True, timeout=30)\n"
        "print((_child.stdout.strip().splitlines() or [json.dumps({'child_failed': _child.stderr[-500:]})])[-1])\n"
    )


def done_event(result: dict[str, Any]) -> dict[str, Any]:
    done = result["events"][-1]
    assert done["type"] == "done", result["events"][-3:]
    return done  # type: ignore[no-any-return]


def session_state(http: httpx.Client, sid: str) -> str:
    return http.get(f"/v1/sessions/{sid}").json()["state"]  # type: ignore[no-any-return]


def wait_for_state(http: httpx.Client, sid: str, state: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while session_state(http, sid) != state:
        assert time.monotonic() < deadline, f"session {sid} never became {state}"
        time.sleep(0.05)


def assert_error(resp: httpx.Response, *statuses: int) -> dict[str, Any]:
    """A JSON error of one of ``statuses`` in the gateway's shape; returns its body."""
    assert resp.status_code in statuses, (resp.status_code, resp.text[:500])
    body = resp.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"]["code"], str) and body["error"]["code"]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


def gateway_containers(client: docker.DockerClient, gateway_name: str) -> list[Any]:
    return client.containers.list(all=True, filters={"label": f"{LABEL_GATEWAY}={gateway_name}"})


def session_containers(client: docker.DockerClient, sid: str) -> list[Any]:
    return client.containers.list(all=True, filters={"label": f"{LABEL_SESSION}={sid}"})


def ws_connect(gateway: RunningGateway, sid: str, **kwargs: Any) -> ClientConnection:
    return connect(f"{gateway.ws_url}/v1/sessions/{sid}/ws", open_timeout=30, **kwargs)


def until_done(ws: ClientConnection, execution_id: str, timeout: float = 60) -> list[dict[str, Any]]:
    """Events received until the ``done`` of ``execution_id`` (others included)."""
    events = []
    while True:
        event = json.loads(ws.recv(timeout=timeout))
        events.append(event)
        if event["type"] == "done" and event["execution_id"] == execution_id:
            return events
