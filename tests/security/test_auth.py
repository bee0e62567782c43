"""Authentication, ownership, roles and quotas against a real gateway that requires keys.

Threats: a caller without a key, with a wrong, malformed or revoked one, or
with a valid key for someone else's session; a web page from another origin
driving a session through the user's browser; a key that asks for more than
its quota. Keys are made with the real ``kernelgw keys`` CLI on the gateway's
own database, while the gateway runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from kernelgw.keys import parse_key
from kernelgw.server import create_app
from tests.integration.conftest import (
    RunningGateway,
    free_port,
    gateway_settings,
    start_gateway,
)
from tests.support.routes import Endpoint, face, protected

pytestmark = pytest.mark.integration

DATA_DIR = Path(f"/tmp/kgwt-auth-{os.getpid()}")


def cli(*args: str, data_dir: Path = DATA_DIR, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERNELGW_DATA_DIR": str(data_dir)}
    env.pop("KERNELGW_API_KEY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "kernelgw", *args], env=env, capture_output=True, text=True, timeout=120
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def new_key(name: str, *options: str) -> dict[str, Any]:
    return json.loads(cli("keys", "create", name, "--json", *options).stdout)  # type: ignore[no-any-return]


class Keys:
    def __init__(self) -> None:
        self.admin = new_key("ops", "--admin")
        self.alice = new_key("alice")
        self.bob = new_key("bob", "--max-sessions", "1", "--max-memory-mb", "768", "--executions-per-minute", "3")


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture(scope="module")
def authgw(keys: Keys, docker_client: Any) -> Iterator[RunningGateway]:
    gw = start_gateway(gateway_settings(gateway_name=f"auth{os.getpid()}", data_dir=str(DATA_DIR), auth_cache_s=0.2))
    yield gw
    gw.stop()
    left = docker_client.containers.list(all=True, filters={"label": f"kernelgw.gateway={gw.settings.gateway_name}"})
    assert not left


def client(gw: RunningGateway, key: dict[str, Any] | str | None) -> httpx.Client:
    text = key["key"] if isinstance(key, dict) else key
    headers = {"Authorization": f"Bearer {text}"} if text else {}
    return httpx.Client(base_url=gw.url, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def alice(authgw: RunningGateway, keys: Keys) -> Iterator[httpx.Client]:
    with client(authgw, keys.alice) as c:
        yield c


@pytest.fixture(scope="module")
def bob(authgw: RunningGateway, keys: Keys) -> Iterator[httpx.Client]:
    with client(authgw, keys.bob) as c:
        yield c


@pytest.fixture(scope="module")
def admin(authgw: RunningGateway, keys: Keys) -> Iterator[httpx.Client]:
    with client(authgw, keys.admin) as c:
        yield c


@pytest.fixture(scope="module")
def alice_session(alice: httpx.Client) -> Iterator[str]:
    resp = alice.post("/v1/sessions", json={})
    assert resp.status_code == 201, resp.text
    sid = resp.json()["id"]
    yield sid
    alice.delete(f"/v1/sessions/{sid}")


def execute(c: httpx.Client, sid: str, code: str) -> httpx.Response:
    return c.post(f"/v1/sessions/{sid}/execute", json={"code": code})


# --------------------------------------------------------------- who may enter
ENDPOINTS = [e for e in protected(create_app()) if e.method != "WS"]
"""Every HTTP route but the public allowlist, from the app itself (tests/support/routes.py)."""
BAD_CREDENTIALS = {
    "missing": None,
    "wrong secret": "kgw_000000000000_" + "A" * 43,
    "malformed": "not-a-key",
    "empty bearer": "",
}


@pytest.mark.parametrize("name", list(BAD_CREDENTIALS))
def test_bad_credentials_get_the_same_401_everywhere(
    authgw: RunningGateway, alice: httpx.Client, alice_session: str, keys: Keys, name: str
) -> None:
    text = BAD_CREDENTIALS[name]
    # a well-formed key with a real id but the wrong secret, too
    real_id_wrong_secret = "kgw_" + keys.alice["id"] + "_" + "B" * 43
    # one 401 body per API face (kernelgw's /v1 errors, Jupyter's {message, reason} under
    # /api, E2B's {code, message} under /e2b, the API description's hint at ?token=)
    bodies: dict[str, set[str]] = {"v1": set(), "jupyter": set(), "docs": set(), "e2b": set()}
    for credential in (text, real_id_wrong_secret):
        with client(authgw, credential) as c:
            for endpoint in ENDPOINTS:
                resp = c.request(endpoint.method, endpoint.url(session_id=alice_session))
                assert resp.status_code == 401, (endpoint, resp.text)
                assert resp.headers["www-authenticate"].startswith("Bearer")
                bodies[face(endpoint)].add(resp.text)
    assert all(len(texts) == 1 for texts in bodies.values()), (
        "401 answers differ: they would reveal which part was wrong"
    )
    assert json.loads(bodies["v1"].pop())["error"]["code"] == "unauthorized"
    assert json.loads(bodies["jupyter"].pop())["reason"] == "Unauthorized"
    assert json.loads(bodies["docs"].pop())["error"]["code"] == "unauthorized"
    assert json.loads(bodies["e2b"].pop())["code"] == 401
    # and the session nobody could touch is still there and working
    resp = execute(alice, alice_session, "print('still here')")
    assert resp.json()["status"] == "ok"


def test_basic_scheme_is_not_a_bearer(authgw: RunningGateway, keys: Keys) -> None:
    with httpx.Client(base_url=authgw.url, headers={"Authorization": f"Basic {keys.alice['key']}"}) as c:
        assert c.get("/v1/sessions").status_code == 401


def test_healthz_needs_no_key(authgw: RunningGateway) -> None:
    assert httpx.get(authgw.url + "/healthz").status_code == 200


def test_revoked_key_stops_working_on_a_live_gateway(authgw: RunningGateway) -> None:
    key = new_key("short-lived")
    with client(authgw, key) as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        assert execute(c, sid, "x = 1").status_code == 200
        cli("keys", "revoke", key["id"])
        deadline = time.monotonic() + 10
        while c.get("/v1/sessions").status_code != 401:
            assert time.monotonic() < deadline, "the revoked key still works"
            time.sleep(0.1)
        assert execute(c, sid, "x").status_code == 401
        # a token issued before the revocation dies with the key
        assert c.post("/v1/auth/token").status_code == 401
    listed = [json.loads(line) for line in cli("keys", "list", "--json").stdout.splitlines()]
    assert next(k for k in listed if k["id"] == key["id"])["revoked_at"] is not None


def secret_of(key: str) -> str:
    """The secret part of a key, as the gateway parses it (the secret is URL-safe
    base64 and may itself contain "_": splitting at the last one can leave a
    single character, found anywhere)."""
    parsed = parse_key(key)
    assert parsed is not None, key
    return parsed[1]


def test_keys_are_stored_only_as_hashes(keys: Keys, authgw: RunningGateway) -> None:
    # Read the database from another process: opening and closing its files in
    # this one (the gateway's) would drop SQLite's POSIX locks (fcntl semantics).
    script = (
        "import glob, json, sqlite3, sys\n"
        "raw = b''.join(open(p, 'rb').read() for p in glob.glob(sys.argv[1] + '/kernelgw.db*'))\n"
        "conn = sqlite3.connect(sys.argv[1] + '/kernelgw.db')\n"
        "cols = [r[1] for r in conn.execute('PRAGMA table_info(kgw_api_keys)')]\n"
        "print(json.dumps({'raw': raw.decode('latin-1'), 'columns': cols}))\n"
    )
    out = json.loads(
        subprocess.run([sys.executable, "-c", script, str(DATA_DIR)], capture_output=True, text=True, check=True).stdout
    )
    for key in (keys.admin, keys.alice, keys.bob):
        secret = secret_of(key["key"])
        assert secret not in out["raw"]
        assert key["id"] in out["raw"]  # the rows are there, by id
    assert "secret_sha256" in out["columns"] and not {"secret", "key"} & set(out["columns"])


def test_key_never_reaches_the_container(alice: httpx.Client, alice_session: str, keys: Keys) -> None:
    code = (
        "import glob\n"
        "blob = b''\n"
        "for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline'):\n"
        "    try:\n"
        "        blob += open(p, 'rb').read()\n"
        "    except OSError:\n"
        "        pass\n"
        f"print({secret_of(keys.alice['key'])!r}.encode() in blob, b'kgw_' in blob, len(blob) > 0)\n"
    )
    out = "".join(e.get("text", "") for e in execute(alice, alice_session, code).json()["events"])
    assert out.strip() == "False False True"


# --------------------------------------------------------------- ownership
BODIES: dict[tuple[str, str], Any] = {
    ("POST", "/v1/sessions/{session_id}/execute"): {"code": "1"},
    ("POST", "/v1/sessions/{session_id}/notes"): {"markdown": "x"},
    ("POST", "/v1/sessions/{session_id}/packages"): {"packages": ["x"]},
}
"""A valid body for each route that needs one, so the request reaches the session lookup."""
OWNED = [e for e in ENDPOINTS if "{session_id}" in e.path]


@pytest.mark.parametrize("endpoint", OWNED, ids=[f"{e.method} {e.template}" for e in OWNED])
def test_another_keys_session_is_not_found(
    alice: httpx.Client, bob: httpx.Client, alice_session: str, endpoint: Endpoint
) -> None:
    method, body = endpoint.method, BODIES.get((endpoint.method, endpoint.template))
    resp = bob.request(method, endpoint.url(session_id=alice_session), json=body)
    # exactly the answer for an id that never existed (404, or a 400 about the
    # request itself that comes before any session lookup, like an empty allowlist)
    missing = bob.request(method, endpoint.url(session_id="0" * 32), json=body)
    assert resp.status_code == missing.status_code
    if face(endpoint) == "jupyter":  # /api/sessions/{session_id}: Jupyter's error shape
        assert resp.status_code == 404, resp.text
        assert resp.json()["message"].replace(alice_session, "0" * 32) == missing.json()["message"]
        assert resp.json()["reason"] == missing.json()["reason"]
        return
    assert resp.json()["error"] == {**missing.json()["error"], "message": resp.json()["error"]["message"]}
    assert resp.json()["error"]["message"].replace(alice_session, "0" * 32) == missing.json()["error"]["message"]
    assert resp.status_code == (400 if endpoint.path.endswith("/packages") else 404), resp.text
    assert alice.get(f"/v1/sessions/{alice_session}").json()["state"] in ("idle", "busy")


def test_listing_shows_only_own_sessions_and_admin_sees_all(
    alice: httpx.Client, bob: httpx.Client, admin: httpx.Client, alice_session: str, keys: Keys
) -> None:
    assert alice_session not in {s["id"] for s in bob.get("/v1/sessions").json()["sessions"]}
    mine = alice.get("/v1/sessions").json()["sessions"]
    assert alice_session in {s["id"] for s in mine}
    assert all(s["owner"] == keys.alice["id"] for s in mine)
    every = {s["id"]: s for s in admin.get("/v1/sessions").json()["sessions"]}
    assert every[alice_session]["owner"] == keys.alice["id"]


def test_admin_can_end_anyones_session_and_users_cannot_manage_keys(alice: httpx.Client, admin: httpx.Client) -> None:
    sid = alice.post("/v1/sessions", json={}).json()["id"]
    assert admin.delete(f"/v1/sessions/{sid}").status_code == 204
    assert alice.get(f"/v1/sessions/{sid}").status_code == 404
    for method, path in (("GET", "/v1/keys"), ("POST", "/v1/keys"), ("DELETE", "/v1/keys/x"), ("GET", "/metrics")):
        resp = alice.request(method, path, json={"name": "x"} if method == "POST" else None)
        assert resp.status_code == 403, (method, path, resp.text)
        assert resp.json()["error"]["code"] == "forbidden"
    assert admin.get("/metrics").status_code == 200


def test_admin_api_creates_and_revokes_keys(authgw: RunningGateway, admin: httpx.Client) -> None:
    created = admin.post("/v1/keys", json={"name": "api-made", "quotas": {"max_sessions": 2}})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["key"].startswith("kgw_") and body["quotas"] == {"max_sessions": 2}
    with client(authgw, body["key"]) as c:
        assert c.get("/v1/auth/whoami").json()["key_id"] == body["id"]
        assert admin.delete(f"/v1/keys/{body['id']}").status_code == 204
        assert c.get("/v1/auth/whoami").status_code == 401  # at once: the cache is dropped
    listed = {k["id"]: k for k in admin.get("/v1/keys").json()["keys"]}
    assert listed[body["id"]]["revoked_at"] is not None
    assert "key" not in listed[body["id"]] and "secret_sha256" not in listed[body["id"]]


# --------------------------------------------------------------- WebSocket
def ws_url(gw: RunningGateway, sid: str, **query: str) -> str:
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    return f"{gw.ws_url}/v1/sessions/{sid}/ws" + (f"?{qs}" if qs else "")


def close_code(url: str, headers: dict[str, str] | None = None) -> int | None:
    with connect(url, additional_headers=headers, open_timeout=30) as ws:
        try:
            ws.recv(timeout=30)
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None
    return None


def test_websocket_without_key_wrong_key_or_foreign_session_is_closed(
    authgw: RunningGateway, alice_session: str, keys: Keys
) -> None:
    assert close_code(ws_url(authgw, alice_session)) == 4401
    assert close_code(ws_url(authgw, alice_session), {"Authorization": "Bearer kgw_x"}) == 4401
    assert close_code(ws_url(authgw, alice_session, token="forged.token.value")) == 4401
    assert close_code(ws_url(authgw, alice_session), {"Authorization": f"Bearer {keys.bob['key']}"}) == 4404


def _ws_execute(url: str, headers: dict[str, str] | None = None, origin: str | None = None) -> str:
    with connect(url, additional_headers=headers, origin=origin, open_timeout=30) as ws:  # type: ignore[arg-type]
        ws.send(json.dumps({"type": "execute", "code": "print(6 * 7)"}))
        out = ""
        while True:
            event = json.loads(ws.recv(timeout=60))
            if event["type"] == "stream":
                out += event["text"]
            if event["type"] == "done":
                return out


def test_websocket_with_key_or_browser_token_works(
    authgw: RunningGateway, alice: httpx.Client, alice_session: str, keys: Keys
) -> None:
    assert _ws_execute(ws_url(authgw, alice_session), {"Authorization": f"Bearer {keys.alice['key']}"}) == "42\n"
    token = alice.post("/v1/auth/token").json()["token"]
    assert _ws_execute(ws_url(authgw, alice_session, token=token)) == "42\n"
    # alice's token does not open bob's session
    sid = _bob_session(authgw, keys)
    assert close_code(ws_url(authgw, sid, token=token)) == 4404


def _bob_session(gw: RunningGateway, keys: Keys) -> str:
    with client(gw, keys.bob) as bob:
        listed = bob.get("/v1/sessions").json()["sessions"]
        if listed:
            return listed[0]["id"]  # type: ignore[no-any-return]
        resp = bob.post("/v1/sessions", json={})
        assert resp.status_code == 201, resp.text
        return resp.json()["id"]  # type: ignore[no-any-return]


def test_a_page_from_another_origin_cannot_open_a_session(
    authgw: RunningGateway, alice_session: str, keys: Keys, alice: httpx.Client
) -> None:
    token = alice.post("/v1/auth/token").json()["token"]
    assert close_code(ws_url(authgw, alice_session, token=token), {"Origin": "https://evil.example"}) == 4403
    same = authgw.url  # the gateway's own page
    assert _ws_execute(ws_url(authgw, alice_session, token=token), origin=same) == "42\n"


# --------------------------------------------------------------- quotas
def test_session_quota_and_limits_per_key(authgw: RunningGateway, keys: Keys, bob: httpx.Client) -> None:
    _bob_session(authgw, keys)
    second = bob.post("/v1/sessions", json={})
    assert second.status_code == 429, second.text
    assert "maximum of 1 sessions" in second.json()["error"]["message"]
    for sid in [s["id"] for s in bob.get("/v1/sessions").json()["sessions"]]:
        bob.delete(f"/v1/sessions/{sid}")
    too_big = bob.post("/v1/sessions", json={"memory_mb": 1024})
    assert too_big.status_code == 400 and "768" in too_big.json()["error"]["message"]


def test_executions_per_minute_gives_429_with_retry_after(
    authgw: RunningGateway, keys: Keys, bob: httpx.Client
) -> None:
    sid = _bob_session(authgw, keys)
    statuses = [execute(bob, sid, "1").status_code for _ in range(4)]
    assert statuses[:3] == [200, 200, 200] or 429 in statuses  # earlier tests may have used tokens
    refused = execute(bob, sid, "1")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    # over the WebSocket the refusal is a protocol_error for that execution, the socket stays
    with connect(ws_url(authgw, sid), additional_headers={"Authorization": f"Bearer {keys.bob['key']}"}) as ws:
        ws.send(json.dumps({"type": "execute", "code": "1", "execution_id": "over"}))
        event = json.loads(ws.recv(timeout=30))
        assert event["type"] == "protocol_error" and event["execution_id"] == "over"
        assert "per minute" in event["message"]


# --------------------------------------------------------------- audit
def test_audit_log_records_who_ran_what(alice: httpx.Client, keys: Keys) -> None:
    sid = alice.post("/v1/sessions", json={}).json()["id"]
    assert execute(alice, sid, "print('audited')").json()["status"] == "ok"
    assert execute(alice, sid, "1/0").json()["status"] == "error"
    assert alice.delete(f"/v1/sessions/{sid}").status_code == 204
    deadline = time.monotonic() + 10
    while True:
        rows = [json.loads(line) for line in cli("audit", "--session", sid, "--json").stdout.splitlines()]
        if any(r["kind"] == "session_deleted" for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    kinds = [r["kind"] for r in rows]
    assert kinds == ["session_created", "execution", "execution", "session_deleted"], kinds
    ok, err = rows[1], rows[2]
    assert ok["key_id"] == keys.alice["id"] and ok["code"] == "print('audited')"
    assert ok["code_sha256"] == __import__("hashlib").sha256(b"print('audited')").hexdigest()
    assert ok["status"] == "ok" and ok["output_bytes"] >= len("audited\n") and ok["duration_ms"] > 0
    assert err["status"] == "error" and err["error_name"] == "ZeroDivisionError"
    # filters: by key, by kind
    by_key = [
        json.loads(line)
        for line in cli("audit", "--key", keys.alice["id"], "--kind", "execution", "--json").stdout.splitlines()
    ]
    assert {r["execution_id"] for r in rows[1:3]} <= {r["execution_id"] for r in by_key}
    assert all(r["key_id"] == keys.alice["id"] for r in by_key)
    table = cli("audit", "--since", "1h", "--session", sid)
    assert "ZeroDivisionError" in table.stdout


def test_key_events_are_audited(keys: Keys) -> None:
    rows = [json.loads(line) for line in cli("audit", "--kind", "key_created", "--json").stdout.splitlines()]
    assert {keys.admin["id"], keys.alice["id"], keys.bob["id"]} <= {r["key_id"] for r in rows}


# --------------------------------------------------------------- binding
def test_gateway_without_keys_refuses_a_public_address(tmp_path: Path) -> None:
    port = str(free_port())
    proc = cli("serve", "--host", "0.0.0.0", "--port", port, data_dir=tmp_path, check=False)
    assert proc.returncode != 0
    assert "without authentication" in proc.stderr and "kernelgw keys create" in proc.stderr


def test_an_open_websocket_is_closed_when_its_key_is_revoked(authgw: RunningGateway, admin: httpx.Client) -> None:
    key = new_key("revoked-while-connected")
    with client(authgw, key) as c:
        sid = c.post("/v1/sessions", json={}).json()["id"]
        try:
            with connect(ws_url(authgw, sid), additional_headers={"Authorization": f"Bearer {key['key']}"}) as ws:
                cli("keys", "revoke", key["id"])
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=30)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
        finally:
            assert admin.delete(f"/v1/sessions/{sid}").status_code == 204
