"""Many gateways as one service, with real parts: PostgreSQL, three ``kernelgw
serve`` processes (distinct names, ports and runtime directories on this one
machine, standing in for three hosts) and Debian's HAProxy in front,
round-robin without stickiness.

Through the proxy: sessions created, multi-turn cells whose turns land on
other gateways than the owner (state kept), the /v1 WebSocket streamed, the
listings of both faces; one gateway killed with SIGKILL: the others keep
serving theirs, its sessions answer 503 naming it; restarted: they come back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import docker
import httpx
import pytest
from sqlalchemy.engine import make_url
from websockets.sync.client import connect

from kernelgw.cluster import proof
from kernelgw.config import Settings
from kernelgw.storage import Store
from kernelgw.storage.keys import KeyStore
from tests.integration.conftest import IMAGE, RUNTIME, assert_nothing_left, remove_everything
from tests.support.processes import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "cluster-test-secret"
GONE_AFTER_S = 4.0


# ---------------------------------------------------------------- the parts
@contextmanager
def cluster_database() -> Iterator[str]:
    """A database of its own on the test PostgreSQL server (dropped afterwards):
    the test's API key must not turn authentication on for other tests' gateways."""
    base = os.environ.get("KERNELGW_TEST_DATABASE_URL")
    if not base:
        pytest.fail("KERNELGW_TEST_DATABASE_URL is not set: run scripts/ensure-postgres.sh (scripts/test.sh does)")
    url = make_url(base)
    name = f"kgw_cluster_{os.getpid()}"
    admin = url.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    asyncio.run(run(f"CREATE DATABASE {name}"))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(run(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def make_key(database_url: str, data_dir: Path, name: str = "cluster-test", role: str = "user") -> str:
    async def create() -> str:
        store = Store.from_settings(Settings(database_url=database_url, data_dir=data_dir))
        await store.start()  # migrates the new database
        try:
            return (await KeyStore(store).create(name, role))[1]  # type: ignore[arg-type]
        finally:
            await store.close()

    return asyncio.run(create())


@dataclass
class Gateway:
    name: str
    port: int
    runtime_dir: Path
    data_dir: Path
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, deadline_s: float = 90.0) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kernelgw", "serve", "--port", str(self.port)],
                env=self.env,
                stdout=out,
                stderr=out,
            )
        eventually(lambda: httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200, deadline_s, self)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def eventually(check: Callable[[], Any], deadline_s: float, gateway: Gateway | None = None) -> Any:
    """``check()``'s first truthy answer (transport errors count as not yet)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if result := check():
                return result
        except (httpx.TransportError, OSError):
            pass
        if gateway is not None and gateway.proc is not None and gateway.proc.poll() is not None:
            raise RuntimeError(f"gateway {gateway.name} exited: {gateway.tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s:g}s" + (f": {gateway.tail()}" if gateway else ""))
        time.sleep(0.2)


@contextmanager
def haproxy(ports: list[int], workdir: Path) -> Iterator[str]:
    """HAProxy, round-robin over the gateways, no stickiness, health checks on /healthz."""
    binary = subprocess.run(
        ["bash", str(ROOT / "scripts/ensure-haproxy.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    port = free_port()
    servers = "\n".join(f"    server g{i} 127.0.0.1:{p} check inter 1s fall 2 rise 1" for i, p in enumerate(ports))
    config = workdir / "haproxy.cfg"
    config.write_text(
        f"""global
    maxconn 512
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout tunnel 1h
    timeout check 10s
frontend lb
    bind 127.0.0.1:{port}
    default_backend gateways
backend gateways
    balance roundrobin
    option redispatch
    retries 2
    option httpchk GET /healthz
{servers}
"""
    )
    log = workdir / "haproxy.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([binary, "-f", str(config), "-db"], stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200, 30)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cluster_gateway(name: str, index: int, tmp_path: Path, database_url: str, **env: str) -> Gateway:
    """A gateway of the test's cluster (not started): its own name, port, runtime and data directories."""
    runtime_dir = Path(f"/tmp/kgwc{os.getpid() % 1000}-{index}")
    full_env = {
        **os.environ,
        "KERNELGW_GATEWAY_NAME": name,
        "KERNELGW_IMAGE": IMAGE,
        "KERNELGW_RUNTIME": RUNTIME,
        "KERNELGW_RUNTIME_DIR": str(runtime_dir),
        "KERNELGW_DATA_DIR": str(tmp_path / name),
        "KERNELGW_DATABASE_URL": database_url,
        "KERNELGW_MEMORY_MB": "256",
        "KERNELGW_LOG_FORMAT": "text",
        "KERNELGW_POOL_SIZE": "0",
        "KERNELGW_ON_SHUTDOWN": "stop",  # a clean stop at the end leaves nothing
        "KERNELGW_CLUSTER_SECRET": SECRET,
        "KERNELGW_CLUSTER_HEARTBEAT_S": "1",
        "KERNELGW_CLUSTER_GONE_AFTER_S": str(GONE_AFTER_S),
        **env,
    }
    return Gateway(name, free_port(), runtime_dir, tmp_path / name, tmp_path / f"{name}.log", full_env)


# ---------------------------------------------------------------- helpers
def execute(lb: httpx.Client, sid: str, code: str) -> tuple[httpx.Response, dict[str, Any]]:
    response = lb.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    return response, response.json()


def result_text(body: dict[str, Any]) -> str:
    return "".join(e["data"].get("text/plain", "") for e in body["events"] if e["type"] == "result")


def ws_execute(ws_base: str, key: str, sid: str, code: str) -> list[dict[str, Any]]:
    """One cell over the /v1 WebSocket: its events, up to and with ``done``."""
    events: list[dict[str, Any]] = []
    with connect(
        f"{ws_base}/v1/sessions/{sid}/ws", additional_headers={"Authorization": f"Bearer {key}"}, open_timeout=30
    ) as ws:
        ws.send(json.dumps({"type": "execute", "code": code}))
        while True:
            event = json.loads(ws.recv(timeout=60))
            if event.get("type") in ("stream", "result", "done", "error", "status"):
                events.append(event)
            if event.get("type") == "done":
                return events


def channels_execute(ws_base: str, key: str, kernel_id: str, code: str) -> list[str]:
    """One cell over Jupyter's channels WebSocket (``?token=``, JSON frames): its
    results' text/plain, up to the idle status."""
    msg_id = uuid.uuid4().hex
    request = {
        "header": {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "test",
            "session": uuid.uuid4().hex,
            "date": datetime.now(UTC).isoformat(),
            "version": "5.3",
        },
        "parent_header": {},
        "metadata": {},
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False},
        "channel": "shell",
    }
    results: list[str] = []
    with connect(f"{ws_base}/api/kernels/{kernel_id}/channels?token={key}", open_timeout=30) as ws:
        ws.send(json.dumps(request))
        while True:
            msg = json.loads(ws.recv(timeout=60))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "execute_result":
                results.append(msg["content"]["data"]["text/plain"])
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return results


# ---------------------------------------------------------------- the test
def test_three_gateways_behind_haproxy_are_one_service(docker_client: docker.DockerClient, tmp_path: Path) -> None:
    names = [f"c{os.getpid()}-{i}" for i in range(3)]
    with ExitStack() as stack:
        database_url = stack.enter_context(cluster_database())
        key = make_key(database_url, tmp_path / "keys")
        other_key = make_key(database_url, tmp_path / "keys", "someone-else")
        admin_key = make_key(database_url, tmp_path / "keys", "operator", "admin")
        gateways = [cluster_gateway(name, i, tmp_path, database_url) for i, name in enumerate(names)]
        for name in names:
            stack.callback(remove_everything, docker_client, name)
        for gw in gateways:
            stack.callback(gw.stop)
            gw.start()
        lb_url = stack.enter_context(haproxy([gw.port for gw in gateways], tmp_path))
        auth = {"Authorization": f"Bearer {key}"}
        lb = stack.enter_context(httpx.Client(base_url=lb_url, headers=auth, timeout=120))

        # --- sessions through the proxy: round-robin puts one on each gateway
        # (placement=local: a session runs where its create landed; should a health check have
        # taken a gateway out for a moment, more creates follow, and the extra sessions go)
        owners: dict[str, str] = {}
        for _ in range(12):
            created = lb.post("/v1/sessions", json={})
            assert created.status_code == 201, created.text
            sid, owner = created.json()["id"], created.headers["x-kernelgw-gateway"]
            if owner in owners.values():
                assert lb.delete(f"/v1/sessions/{sid}").status_code == 204
            else:
                owners[sid] = owner
            if len(owners) == len(names):
                break
        print("owners:", owners)
        assert sorted(owners.values()) == sorted(names), owners
        by_owner = {name: sid for sid, name in owners.items()}

        # --- multi-turn: x = 1 on the owner's kernel, x + 1 from wherever the proxy sends it
        for sid in owners:
            response, body = execute(lb, sid, "x = 1")
            assert response.status_code == 200 and body["status"] == "ok", body
        served_via: dict[str, set[str]] = {sid: set() for sid in owners}
        for sid, owner in owners.items():
            for _ in range(4):  # four turns in a row: round-robin over three sends them to all three
                response, body = execute(lb, sid, "x + 1")
                assert response.status_code == 200, response.text
                assert body["status"] == "ok" and result_text(body) == "2", body
                assert response.headers["x-kernelgw-gateway"] == owner  # the owner's kernel answered
                served_via[sid].add(response.headers.get("x-kernelgw-via", owner))
        print("received by:", served_via)
        for sid, owner in owners.items():
            assert served_via[sid] - {owner}, f"no turn of {sid} went through another gateway than {owner}"

        # --- streaming through the proxy, over the /v1 WebSocket (relayed when it lands elsewhere)
        ws_base = "ws" + lb_url[len("http") :]
        for sid in owners:
            for _ in range(3):
                events = ws_execute(ws_base, key, sid, "for i in range(3): print(i, flush=True)\nx + 1")
                stdout = "".join(e["text"] for e in events if e["type"] == "stream")
                assert stdout == "0\n1\n2\n", events
                assert next(e for e in events if e["type"] == "result")["data"]["text/plain"] == "2"
                assert events[-1]["type"] == "done" and events[-1]["status"] == "ok"

        # --- Jupyter's channels WebSocket through the proxy (relayed when it lands elsewhere)
        for sid in owners:
            for _ in range(3):
                assert channels_execute(ws_base, key, sid, "x + 1") == ["2"]

        # --- loop guard: a request with a valid proof is served where it lands, never forwarded
        # again (here: the 404 of a session this gateway does not run); a bad proof is refused
        stranger = gateways[0]
        elsewhere = by_owner[names[1]]
        path = f"/v1/sessions/{elsewhere}"
        signed = proof.proof_headers(SECRET.encode(), names[2], "GET", path)
        served = httpx.get(stranger.url + path, headers=auth | signed, timeout=30)
        assert served.status_code == 404 and served.headers["x-kernelgw-gateway"] == stranger.name, served.text
        assert "x-kernelgw-via" not in served.headers
        forged = proof.proof_headers(b"not the secret", names[2], "GET", path)
        refused = httpx.get(stranger.url + path, headers=auth | forged, timeout=30)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forward_refused", refused.text
        unsigned = httpx.get(stranger.url + path, headers=auth, timeout=30)
        assert unsigned.status_code == 200 and unsigned.headers["x-kernelgw-gateway"] == names[1]
        assert unsigned.headers["x-kernelgw-via"] == stranger.name
        # the owner checks the key itself: none is a 401, another key's session a 404
        assert httpx.get(stranger.url + path, timeout=30).status_code == 401
        theirs = httpx.get(stranger.url + path, headers={"Authorization": f"Bearer {other_key}"}, timeout=30)
        assert theirs.status_code == 404 and theirs.headers["x-kernelgw-gateway"] == names[1], theirs.text

        # --- a file up and down through non-owners: bodies streamed through the forward, both ways
        payload = os.urandom(3 * 1024 * 1024)
        for sid, owner in owners.items():
            uploaded = lb.put(f"/v1/sessions/{sid}/files/data/blob.bin", content=payload)
            assert uploaded.status_code in (200, 201), uploaded.text
            for _ in range(3):
                downloaded = lb.get(f"/v1/sessions/{sid}/files/data/blob.bin")
                assert downloaded.status_code == 200 and downloaded.content == payload
                assert downloaded.headers["x-kernelgw-gateway"] == owner
            response, body = execute(lb, sid, "import os; os.path.getsize('data/blob.bin')")
            assert result_text(body) == str(len(payload)), body

        # --- a fork runs where its source runs (its files are copied on that host), wherever it is asked
        source = by_owner[names[0]]
        forks = []
        for _ in range(3):
            fork = lb.post("/v1/sessions", json={"from": source})
            assert fork.status_code == 201, fork.text
            assert fork.headers["x-kernelgw-gateway"] == names[0]
            forks.append(fork.json()["id"])
        for fid in forks:
            response, body = execute(lb, fid, "x + 1")
            assert response.status_code == 200 and result_text(body) == "2", body
            assert lb.delete(f"/v1/sessions/{fid}").status_code == 204

        # --- listings through the proxy, from every gateway: all three sessions, both faces
        for _ in range(3):
            listed = lb.get("/v1/sessions")
            assert listed.status_code == 200
            assert {s["id"] for s in listed.json()["sessions"]} == set(owners), listed.json()
            kernels = lb.get("/api/kernels")
            assert kernels.status_code == 200
            assert {k["id"] for k in kernels.json()} == set(owners)
        other_listing = lb.get("/v1/sessions", headers={"Authorization": f"Bearer {other_key}"})
        assert other_listing.status_code == 200 and other_listing.json()["sessions"] == []
        # a gateway's own sessions and the others', directly
        for gw in gateways:
            direct = httpx.get(f"{gw.url}/v1/sessions/{by_owner[names[0]]}", headers=auth, timeout=30)
            assert direct.status_code == 200 and direct.json()["execution_count"] >= 5

        # --- the registry, as an operator reads it: all three live
        registry = lb.get("/v1/gateways", headers={"Authorization": f"Bearer {admin_key}"})
        assert registry.status_code == 200, registry.text
        assert {(g["name"], g["live"]) for g in registry.json()["gateways"]} == {(n, True) for n in names}
        assert lb.get("/v1/gateways").status_code == 403  # a user key

        # --- one gateway killed: the others keep serving theirs, its sessions answer 503
        dead = gateways[2]
        dead_sid = by_owner[dead.name]
        dead.kill9()
        started = time.monotonic()

        def dead_answers_503() -> httpx.Response | None:
            response = lb.post(f"/v1/sessions/{dead_sid}/execute", json={"code": "x + 1"})
            return response if response.status_code == 503 and "owner_gone" in response.text else None

        gone = eventually(dead_answers_503, 30)
        print(f"503 for the dead gateway's session {time.monotonic() - started:.1f}s after the kill: {gone.text}")
        error = gone.json()["error"]
        assert error["code"] == "owner_gone" and dead.name in error["message"], error
        assert gone.headers.get("retry-after")
        # once the heartbeat is stale, every gateway says so with when it was last seen
        eventually(lambda: "which is gone" in lb.get(f"/v1/sessions/{dead_sid}").text, GONE_AFTER_S + 10)
        for _ in range(3):
            jupyter = lb.get(f"/api/kernels/{dead_sid}")
            assert jupyter.status_code == 503 and dead.name in jupyter.json()["message"], jupyter.text
        with connect(f"{ws_base}/v1/sessions/{dead_sid}/ws", additional_headers=auth, open_timeout=30) as ws:
            with pytest.raises(Exception) as closed:
                ws.recv(timeout=30)
            print("WebSocket to the dead gateway's session:", closed.value)
            assert ws.close_code == 1013 and dead.name in (ws.close_reason or "")
        for _ in range(3):
            for sid, owner in owners.items():
                if owner == dead.name:
                    continue
                response, body = execute(lb, sid, "x + 1")
                assert response.status_code == 200 and result_text(body) == "2", response.text
        listed = lb.get("/v1/sessions").json()["sessions"]
        assert {s["id"] for s in listed} == set(owners) - {dead_sid}  # a gone gateway's sessions are not listed
        registry = lb.get("/v1/gateways", headers={"Authorization": f"Bearer {admin_key}"}).json()
        print("registry with one gateway gone:", registry)
        assert {g["name"]: g["live"] for g in registry["gateways"]}[dead.name] is False
        # its history and notebook are the store's: any gateway serves them meanwhile
        for _ in range(3):
            history = lb.get(f"/v1/sessions/{dead_sid}/history")
            assert history.status_code == 200, history.text
            notebook = lb.get(f"/v1/sessions/{dead_sid}/notebook")
            assert notebook.status_code == 200 and len(notebook.json()["cells"]) >= 5, notebook.text

        # --- restarted under its name (same runtime directory): it reattaches, its session comes back
        dead.start()
        started = time.monotonic()
        back = eventually(lambda: (r := execute(lb, dead_sid, "x + 1"))[0].status_code == 200 and r, 60)
        print(f"the dead gateway's session answered again {time.monotonic() - started:.1f}s after the restart")
        assert result_text(back[1]) == "2", back[1]  # its kernel kept x
        for _ in range(3):
            response, body = execute(lb, dead_sid, "x + 1")
            assert response.status_code == 200 and result_text(body) == "2", response.text

        # --- nothing left: sessions deleted through the proxy, gateways stopped cleanly
        for sid in owners:
            assert lb.delete(f"/v1/sessions/{sid}").status_code == 204
        assert lb.get("/v1/sessions").json()["sessions"] == []
    for gw in gateways:
        assert gw.proc is not None and gw.proc.poll() is not None, f"gateway {gw.name} still runs"
    for name in names:
        assert_nothing_left(docker_client, name)


def test_placement_by_load_forwards_a_create_to_the_least_loaded_gateway(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """``placement=load`` on A: once A runs a session and B none, a create sent to A
    runs on B (forwarded); B, with ``placement=local``, keeps what it gets."""
    names = [f"p{os.getpid()}-{i}" for i in range(2)]
    with ExitStack() as stack:
        database_url = stack.enter_context(cluster_database())
        a = cluster_gateway(names[0], 3, tmp_path, database_url, KERNELGW_PLACEMENT="load")
        b = cluster_gateway(names[1], 4, tmp_path, database_url)
        for gw in (a, b):
            stack.callback(remove_everything, docker_client, gw.name)
            stack.callback(gw.stop)
            gw.start()
        to_a = stack.enter_context(httpx.Client(base_url=a.url, timeout=120))
        first = to_a.post("/v1/sessions", json={})
        assert first.status_code == 201, first.text
        assert first.headers["x-kernelgw-gateway"] == a.name  # a tie stays where it was asked

        def placed_on_b() -> httpx.Response | None:
            # A's registry learns its own load at its next heartbeat; until then a create may stay on A
            created = to_a.post("/v1/sessions", json={})
            assert created.status_code == 201, created.text
            if created.headers["x-kernelgw-gateway"] == b.name:
                return created
            assert to_a.delete(f"/v1/sessions/{created.json()['id']}").status_code == 204
            return None

        moved = eventually(placed_on_b, 30)
        assert moved.headers["x-kernelgw-via"] == a.name
        sid = moved.json()["id"]
        response, body = execute(to_a, sid, "21 * 2")
        assert response.status_code == 200 and result_text(body) == "42", body
        to_b = stack.enter_context(httpx.Client(base_url=b.url, timeout=120))
        local = to_b.post("/v1/sessions", json={})
        assert local.status_code == 201 and local.headers["x-kernelgw-gateway"] == b.name
        for created in (first, moved, local):
            assert to_a.delete(f"/v1/sessions/{created.json()['id']}").status_code == 204
    for name in names:
        assert_nothing_left(docker_client, name)
