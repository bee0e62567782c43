"""Threat: one session reaching another: its files, sockets, shared memory,
processes, or the connection directory through which the gateway drives its
kernel. A *neighbour* session plants one of each; a fresh session must find
none of them.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import docker
import httpx
import pytest

from tests.security.conftest import (
    LIST_PROCESSES,
    RunningGateway,
    new_session,
    run_json,
    session_containers,
)

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Neighbour:
    session_id: str
    token: str
    shm_key: int
    kernel_id: str
    conn_dir: str

    @property
    def sleep_seconds(self) -> str:
        return f"4242.{int(self.token[:6], 16)}"


@pytest.fixture(scope="module")
def neighbour(http: httpx.Client, docker_client: docker.DockerClient) -> Iterator[Neighbour]:
    token = secrets.token_hex(8)
    with new_session(http) as sid:
        (container,) = session_containers(docker_client, sid)
        (mount,) = [m for m in container.attrs["Mounts"] if m["Destination"] == "/conn"]
        n = Neighbour(sid, token, int(token[:7], 16), container.labels["kernelgw.kernel"], mount["Source"])
        code = (
            f"token = {token!r}\n"
            f"open(f'/tmp/kgw-{{token}}', 'w').write(token)\n"
            f"open(f'/workspace/kgw-{{token}}', 'w').write(token)\n"
            f"open(f'/dev/shm/kgw-{{token}}', 'w').write(token)\n"
            "path_listener = socket.socket(socket.AF_UNIX)\n"
            "path_listener.bind(f'/tmp/kgw-{token}.sock')\n"
            "path_listener.listen()\n"
            "abstract_listener = socket.socket(socket.AF_UNIX)\n"
            "abstract_listener.bind(f'\\0kgw-{token}')\n"
            "abstract_listener.listen()\n"
            f"shm_id = _libc.shmget({n.shm_key}, 4096, 0o1000 | 0o666)  # IPC_CREAT\n"
            f"sleeper = subprocess.Popen(['sleep', {n.sleep_seconds!r}])\n"
            "print(json.dumps({'shm_id': shm_id, 'sleeper': sleeper.pid}))\n"
        )
        planted = run_json(http, sid, code)
        assert planted["shm_id"] >= 0, "the neighbour could not make its shared memory segment"
        yield n


def test_neighbour_files_and_sockets_are_invisible(http: httpx.Client, session_id: str, neighbour: Neighbour) -> None:
    t = neighbour.token
    code = (
        f"t = {t!r}\n"
        "def connect(address):\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    s.settimeout(3)\n"
        "    s.connect(address)\n"
        "print(json.dumps({\n"
        "    'files': [p for p in (f'/tmp/kgw-{t}', f'/workspace/kgw-{t}', f'/dev/shm/kgw-{t}', f'/tmp/kgw-{t}.sock')\n"
        "              if os.path.lexists(p)],\n"
        "    'path_socket': outcome(lambda: connect(f'/tmp/kgw-{t}.sock')),\n"
        "    'abstract_socket': outcome(lambda: connect(f'\\0kgw-{t}')),\n"
        "    'listed': [l for l in open('/proc/net/unix') if t in l],\n"
        "}))\n"
    )
    seen = run_json(http, session_id, code)
    assert seen == {"files": [], "path_socket": "ENOENT", "abstract_socket": "ECONNREFUSED", "listed": []}


def test_neighbour_shared_memory_is_invisible(http: httpx.Client, session_id: str, neighbour: Neighbour) -> None:
    code = (
        f"found = _libc.shmget({neighbour.shm_key}, 0, 0)\n"
        "err = errno.errorcode.get(ctypes.get_errno()) if found == -1 else None\n"
        "try:\n"
        "    listed = [l.split()[0] for l in open('/proc/sysvipc/shm').readlines()[1:]]\n"
        "except OSError:\n"
        "    listed = []\n"
        f"print(json.dumps({{'found': found, 'err': err, 'listed': str({neighbour.shm_key}) in listed}}))\n"
    )
    assert run_json(http, session_id, code) == {"found": -1, "err": "ENOENT", "listed": False}


def test_neighbour_processes_are_invisible(http: httpx.Client, session_id: str, neighbour: Neighbour) -> None:
    mine = run_json(http, session_id, LIST_PROCESSES)
    theirs = run_json(http, neighbour.session_id, LIST_PROCESSES)
    assert any(neighbour.sleep_seconds in c for c in theirs.values())  # the probe sees processes
    assert not any(neighbour.sleep_seconds in c for c in mine.values()), mine
    # only this container's own: its init, its kernel, and the probe's children
    assert mine["1"].startswith("/sbin/docker-init"), mine
    assert all("docker-init" in c or "python" in c for c in mine.values()), mine


def test_no_other_connection_directory_is_mounted(
    http: httpx.Client,
    gateway: RunningGateway,
    session_id: str,
    neighbour: Neighbour,
    docker_client: docker.DockerClient,
) -> None:
    (container,) = session_containers(docker_client, session_id)
    own_kernel = container.labels["kernelgw.kernel"]
    runtime_base = str(gateway.settings.runtime_dir / gateway.settings.gateway_name)
    code = (
        "mounts = [l.split()[3:5] for l in open('/proc/self/mountinfo')]\n"  # root in its fs, mount point
        f"reach = outcome(lambda: os.stat({neighbour.conn_dir + '/k-1'!r}))\n"
        "print(json.dumps({'mounts': mounts, 'reach': reach, 'conn': outcome(lambda: os.listdir('/conn'))}))\n"
    )
    seen = run_json(http, session_id, code)
    conn_mounts = [root for root, point in seen["mounts"] if point == "/conn"]
    assert len(conn_mounts) == 1, seen["mounts"]
    everything = " ".join(" ".join(m) for m in seen["mounts"])
    assert neighbour.kernel_id not in everything
    # on runc the mount's root names the host directory: it must be this kernel's own
    assert conn_mounts[0] in ("/", f"{runtime_base}/{own_kernel}"), conn_mounts
    assert not [root for root, _ in seen["mounts"] if root.rstrip("/") == runtime_base], seen["mounts"]
    assert seen["reach"] == "ENOENT"
    assert seen["conn"] == "EACCES"
