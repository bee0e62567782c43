"""Authentication before work, against real ``kernelgw serve`` processes that require keys.

Threats: clients without a key that send huge request bodies and stall (the
gateway must not read them: six such 31 MiB bodies once grew it by 183 MB,
never given back); a made-up forwarding header that turned a bad credential
into a 403 blaming the cluster's secret; a local process that writes any
address into ``X-Forwarded-For`` to have it logged as the client.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import httpx
import pytest

from kernelgw.cluster import proof
from tests.integration.conftest import IMAGE, RUNTIME, assert_nothing_left
from tests.support.processes import gateway_process

pytestmark = pytest.mark.integration

SECRET = "auth-before-work-secret"
BODY_BYTES = 31 * 1024 * 1024
SENT_BYTES = 24 * 1024 * 1024
"""What each stalled client sends of its announced 31 MiB before it stalls."""
CLIENTS = 6
JSON = {"Content-Type": "application/json"}


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    url: str
    port: int
    log: Path
    key: str
    name: str


def _create_key(data_dir: Path) -> str:
    env = {**os.environ, "KERNELGW_DATA_DIR": str(data_dir)}
    env.pop("KERNELGW_API_KEY", None)
    env.pop("KERNELGW_DATABASE_URL", None)
    out = subprocess.run(
        [sys.executable, "-m", "kernelgw", "keys", "create", "abw", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return str(json.loads(out.stdout)["key"])


@contextmanager
def served(tmp_path: Path, docker_client: docker.DockerClient, suffix: str, **env: str) -> Iterator[Served]:
    name = f"abw{os.getpid()}{suffix}"
    data_dir = tmp_path / name
    key = _create_key(data_dir)
    log = tmp_path / f"{name}.log"
    with gateway_process(
        name,
        data_dir,
        log,
        image=IMAGE,
        runtime=RUNTIME,
        runtime_dir=Path(f"/tmp/kgwa{os.getpid() % 1000}{suffix}"),
        KERNELGW_ON_SHUTDOWN="stop",
        KERNELGW_LOG_FORMAT="json",  # with each record's extra fields (the client's address)
        **env,
    ) as (proc, url):
        try:
            yield Served(proc, url, int(url.rsplit(":", 1)[1]), log, key, name)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
            assert_nothing_left(docker_client, name)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def unread_bytes_at(port: int) -> int:
    """Bytes sitting in the receive queues of the gateway's connections on ``port``
    (sent by clients, not yet read by the gateway process)."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port:
                total += int(fields[4].split(":")[1], 16)  # tx_queue:rx_queue
    return total


def unsent_bytes(sock: socket.socket) -> int:
    import fcntl
    import struct
    import termios

    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except OSError:
        return 0  # closed


def wait_until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.05)


# ---------------------------------------------------------------- bodies
@pytest.mark.parametrize(
    "path", ["/v1/sessions", "/v1/sessions/nope/execute", "/api/kernels", "/v1/sessions/nope/files/big.bin"]
)
def test_stalled_unauthenticated_bodies_are_not_read(
    tmp_path: Path, docker_client: docker.DockerClient, path: str
) -> None:
    with served(tmp_path, docker_client, "b", KERNELGW_CLUSTER_SECRET=SECRET) as gw:
        method = "PUT" if "/files/" in path else "POST"
        # warm up the refusal's code paths (imports, logging) before the baseline
        small = httpx.request(method, gw.url + path, content=b"{}", timeout=30)
        assert small.status_code == 401, small.text
        before = rss_bytes(gw.proc.pid)
        chunk = b"x" * (1024 * 1024)
        socks: list[socket.socket] = []
        outcomes: list[str] = []
        cut: set[socket.socket] = set()  # reset by the gateway: nothing of theirs is in flight

        def stall() -> None:
            sock = socket.create_connection(("127.0.0.1", gw.port), timeout=60)
            socks.append(sock)
            head = (
                f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {BODY_BYTES}\r\n\r\n"
            ).encode()
            try:
                sock.sendall(head)
                for _ in range(SENT_BYTES // len(chunk)):
                    sock.sendall(chunk)
                outcomes.append("sent")
            except OSError as exc:  # the gateway answered and closed: the rest was never wanted
                cut.add(sock)
                outcomes.append(type(exc).__name__)

        threads = [threading.Thread(target=stall) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        try:
            assert len(outcomes) == CLIENTS, outcomes
            # everything the clients sent is either read by the gateway or refused by it:
            # nothing left in flight when its memory is measured
            wait_until(
                lambda: unread_bytes_at(gw.port) == 0 and all(s in cut or unsent_bytes(s) == 0 for s in socks),
                60,
                "the clients' bytes consumed or refused",
            )
            grown = rss_bytes(gw.proc.pid) - before
            print(f"{path}: outcomes {outcomes}, RSS grew by {grown / 2**20:.1f} MiB")
            assert grown < 20 * 2**20, f"the gateway grew by {grown / 2**20:.0f} MiB reading unauthenticated bodies"
            for sock in socks:  # each was answered 401 (or cut off) without waiting for the rest
                sock.settimeout(30)
                try:
                    answer = sock.recv(4096)
                except ConnectionResetError:
                    continue
                assert answer == b"" or answer.startswith(b"HTTP/1.1 401"), answer[:200]
        finally:
            for sock in socks:
                sock.close()
        # the gateway still serves keyed requests
        ok = httpx.get(gw.url + "/v1/sessions", headers={"Authorization": f"Bearer {gw.key}"}, timeout=30)
        assert ok.status_code == 200, ok.text


def test_keyed_bodies_keep_the_full_limit_and_unkeyed_small_ones_get_401(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    with served(tmp_path, docker_client, "k") as gw:
        auth = {"Authorization": f"Bearer {gw.key}"}
        big = json.dumps({"env": {"PAD": "x" * (200 * 1024)}})
        # a keyed body over 64 KiB reaches validation (422 for the over-long value), not a 401
        keyed = httpx.post(gw.url + "/v1/sessions", content=big, headers=auth | JSON, timeout=60)
        assert keyed.status_code == 422 and "PAD" in keyed.text, keyed.text
        unkeyed = httpx.post(gw.url + "/v1/sessions", content=big, headers=JSON, timeout=60)
        assert unkeyed.status_code == 401 and unkeyed.json()["error"]["code"] == "unauthorized"
        assert unkeyed.headers["www-authenticate"].startswith("Bearer")
        jupyter = httpx.post(gw.url + "/api/kernels", content=big, timeout=60)
        assert jupyter.status_code == 401 and jupyter.json()["reason"] == "Unauthorized", jupyter.text
        chunked = httpx.post(gw.url + "/v1/sessions", content=iter([b"{" + b" " * 50_000] * 3), timeout=60)
        assert chunked.status_code == 401
        small = httpx.post(gw.url + "/v1/sessions", json={}, headers={"Authorization": "Bearer kgw_bad"}, timeout=60)
        assert small.status_code == 401


# ---------------------------------------------------------------- forged forwarding headers
def test_a_forged_forwarding_header_without_a_key_is_the_usual_401(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    with served(tmp_path, docker_client, "f", KERNELGW_CLUSTER_SECRET=SECRET) as gw:
        path = "/v1/sessions/0123456789ab"
        forged = proof.proof_headers(b"not the secret", "mallory", "GET", path)
        for p, headers in (
            (path, forged),
            (path, {"X-Kernelgw-Forwarded-By": "mallory"}),
            ("/api/kernels/0123456789ab", {"X-Kernelgw-Forwarded-By": "mallory"}),
            ("/v1/sessions", {"X-Kernelgw-Forwarded-By": "mallory"}),
        ):
            refused = httpx.get(gw.url + p, headers=headers, timeout=30)
            assert refused.status_code == 401, (p, refused.text)
            assert "secret" not in refused.text.lower()
        # /healthz is public and never forwarded: the header means nothing there
        health = httpx.get(gw.url + "/healthz", headers={"X-Kernelgw-Forwarded-By": "mallory"}, timeout=30)
        assert health.status_code == 200, health.text
        # with a valid key the operator hears what is wrong
        keyed = httpx.get(gw.url + path, headers=forged | {"Authorization": f"Bearer {gw.key}"}, timeout=30)
        assert keyed.status_code == 403 and keyed.json()["error"]["code"] == "forward_refused", keyed.text
        # a genuine proof: its X-Forwarded-For names the client
        genuine = proof.proof_headers(SECRET.encode(), "peer", "GET", path)
        httpx.get(gw.url + path, headers=genuine | {"X-Forwarded-For": "198.51.100.23"}, timeout=30)
        wait_until(lambda: _refusal_lines(gw.log, '"198.51.100.23:0"'), 30, "the peer's client logged")


# ---------------------------------------------------------------- X-Forwarded-For
def _refusal_lines(log: Path, marker: str) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if "unauthorized" in line and marker in line]


def test_x_forwarded_for_is_believed_only_from_trusted_proxies(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    with ExitStack() as stack:
        plain = stack.enter_context(served(tmp_path, docker_client, "x"))
        behind = stack.enter_context(served(tmp_path, docker_client, "t", KERNELGW_TRUSTED_PROXIES='["127.0.0.0/8"]'))
        spoof = {"X-Forwarded-For": "203.0.113.66"}
        for gw in (plain, behind):
            marker = f"/v1/sessions/marker{gw.name}"
            assert httpx.get(gw.url + marker, headers=spoof, timeout=30).status_code == 401
            wait_until(lambda gw=gw, m=marker: _refusal_lines(gw.log, m), 30, "the refusal logged")
        (line,) = _refusal_lines(plain.log, f"/v1/sessions/marker{plain.name}")
        assert json.loads(line)["client"].startswith("127.0.0.1:"), line
        assert "203.0.113.66" not in line
        (line,) = _refusal_lines(behind.log, f"/v1/sessions/marker{behind.name}")
        assert json.loads(line)["client"] == "203.0.113.66:0", line
