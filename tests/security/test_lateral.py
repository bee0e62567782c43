"""Threat: one key's client reaching another key's session through the API with
ids it crafts: SQL-like and LIKE-wildcard ids, prefixes, path-like and
percent-encoded ids, Unicode look-alikes; the restore path (``from_session``);
and the Jupyter face (``/api/kernels/{id}`` and its channels).

Covered elsewhere (test_auth.py): the exact 404 for another key's session id on
every ``/v1`` route that names it, the ``/v1`` WebSocket, tokens, listings.
Here *mallory* holds a valid key of her own; *alice* has a live session and a
deleted one whose history (code and output carry a marker) stays in the store.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from kernelgw.storage import Store
from kernelgw.storage.keys import KeyStore
from tests.integration.conftest import (
    RunningGateway,
    gateway_settings,
    start_gateway,
    stdout,
)
from tests.integration.conftest import run as run_cell
from tests.security.conftest import gateway_containers

pytestmark = pytest.mark.integration

MARKER = f"alice-only-{secrets.token_hex(8)}"


@dataclass(frozen=True)
class Keyed:
    gateway: RunningGateway
    alice: str
    mallory: str


@dataclass(frozen=True)
class Alice:
    live: str
    """A live session whose kernel holds ``secret = MARKER``."""
    deleted: str
    """A deleted session: only its stored history remains."""


def _make_keys(data_dir: Path) -> tuple[str, str]:
    async def make() -> tuple[str, str]:
        store = Store.from_settings(gateway_settings(data_dir=data_dir))
        await store.start()
        try:
            keys = KeyStore(store)
            return (await keys.create("alice"))[1], (await keys.create("mallory"))[1]
        finally:
            await store.close()

    return asyncio.run(make())


@pytest.fixture(scope="module")
def keyed(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    data_dir = tmp_path_factory.mktemp("lateral-data")
    alice, mallory = _make_keys(data_dir)
    name = f"lat{os.getpid()}"
    gw = start_gateway(gateway_settings(gateway_name=name, data_dir=str(data_dir), auth="required"))
    try:
        yield Keyed(gw, alice, mallory)
    finally:
        gw.stop()
    assert not gateway_containers(docker_client, name)


def _client(gw: RunningGateway, key: str) -> httpx.Client:
    return httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


@pytest.fixture(scope="module")
def alice_client(keyed: Keyed) -> Iterator[httpx.Client]:
    with _client(keyed.gateway, keyed.alice) as c:
        yield c


@pytest.fixture(scope="module")
def mallory(keyed: Keyed) -> Iterator[httpx.Client]:
    with _client(keyed.gateway, keyed.mallory) as c:
        yield c


@pytest.fixture(scope="module")
def alice(alice_client: httpx.Client) -> Iterator[Alice]:
    sids = []
    for _ in range(2):
        resp = alice_client.post("/v1/sessions", json={})
        assert resp.status_code == 201, resp.text
        sids.append(resp.json()["id"])
    live, deleted = sids
    for sid in sids:
        result = run_cell(alice_client, sid, f"secret = {MARKER!r}\nopen('/workspace/notes.txt', 'w').write(secret)")
        assert result["status"] == "ok", result["events"][-1]
    assert alice_client.delete(f"/v1/sessions/{deleted}").status_code == 204
    try:
        yield Alice(live, deleted)
    finally:
        alice_client.delete(f"/v1/sessions/{live}")


def _alice_is_untouched(alice_client: httpx.Client, alice: Alice) -> None:
    result = run_cell(alice_client, alice.live, "print(secret)")
    assert stdout(result) == f"{MARKER}\n", result["events"][-1]
    history = alice_client.get(f"/v1/sessions/{alice.deleted}/history")
    assert history.status_code == 200 and MARKER in history.text


# ---------------------------------------------------------------- crafted ids

CRAFTED: dict[str, str] = {
    # each: a template over alice's id {sid}; the route's id segment becomes this text
    "own-id-uppercase": "{SID}",
    "sql-or-true": "{sid}' OR '1'='1",
    "sql-comment": "x' OR 1=1 --",
    "sql-union": "x' UNION SELECT * FROM kgw_executions --",
    "like-percent": "%25",  # arrives as %
    "like-prefix-percent": "{sid8}%25",
    "like-underscores": "_" * 32,
    "prefix-12": "{sid12}",
    "dotdot-encoded-slash": "..%2F{sid}",
    "dotdot-backslash": "..%5C{sid}",
    "percent-encoded-every-char": "{sid_pct}",
    "fullwidth-lookalike": "{sid_fullwidth}",
    "trailing-nul": "{sid}%00",
    "trailing-space": "{sid}%20",
    "trailing-newline": "{sid}%0A",
}
"""Ids mallory crafts from what she may know or guess (the ids' shape; in the
worst case alice's id itself, leaked in a log or a URL)."""


def _crafted(template: str, sid: str) -> str:
    return template.format(
        sid=sid,
        SID=sid.upper(),
        sid8=sid[:8],
        sid12=sid[:12],
        sid_pct="".join(f"%{ord(c):02X}" for c in sid),
        sid_fullwidth="".join(chr(ord(c) + 0xFEE0) for c in sid),  # U+FF10.. look-alikes, NFKC-equal
    )


ROUTES = ["/v1/sessions/{id}", "/v1/sessions/{id}/history", "/v1/sessions/{id}/notebook", "/v1/sessions/{id}/files"]


@pytest.mark.parametrize("kind", list(CRAFTED))
def test_crafted_ids_reach_no_other_keys_session(
    alice_client: httpx.Client, mallory: httpx.Client, alice: Alice, kind: str
) -> None:
    seen = {}
    for sid in (alice.live, alice.deleted):
        crafted = _crafted(CRAFTED[kind], sid)
        for route in ROUTES:
            # httpx keeps valid %XX escapes as they are and encodes the rest
            resp = mallory.get(route.replace("{id}", crafted))
            seen[(sid, route)] = resp.status_code
            assert MARKER not in resp.text, (kind, route, resp.text[:300])
            assert sid not in resp.text or resp.status_code == 404, (kind, route, resp.text[:300])
    assert set(seen.values()) == {404}, seen
    _alice_is_untouched(alice_client, alice)


def test_restoring_from_another_keys_session_is_not_found(
    alice_client: httpx.Client, mallory: httpx.Client, alice: Alice
) -> None:
    before = {s["id"] for s in mallory.get("/v1/sessions").json()["sessions"]}
    for source in (alice.deleted, alice.live):
        resp = mallory.post("/v1/sessions", json={"from_session": source})
        assert resp.status_code == 404, resp.text[:500]
        assert resp.json()["error"]["code"] == "history_not_found"
        assert MARKER not in resp.text
    # no session was started for her on the way
    assert {s["id"] for s in mallory.get("/v1/sessions").json()["sessions"]} == before
    _alice_is_untouched(alice_client, alice)


# ---------------------------------------------------------------- Jupyter face

JUPYTER_CALLS = [
    ("GET", "/api/kernels/{kid}"),
    ("DELETE", "/api/kernels/{kid}"),
    ("POST", "/api/kernels/{kid}/interrupt"),
    ("POST", "/api/kernels/{kid}/restart"),
]


@pytest.mark.parametrize("call", JUPYTER_CALLS, ids=[f"{m} {p}" for m, p in JUPYTER_CALLS])
def test_jupyter_api_does_not_drive_another_keys_kernel(
    alice_client: httpx.Client, mallory: httpx.Client, alice: Alice, call: tuple[str, str]
) -> None:
    method, template = call
    dashed = str(uuid.UUID(alice.live))
    for kid in (dashed, alice.live, dashed.upper()):
        resp = mallory.request(method, template.format(kid=kid))
        assert resp.status_code == 404, (kid, resp.status_code, resp.text[:300])
        assert set(resp.json()) == {"message", "reason"}, resp.text[:300]
    listed = mallory.get("/api/kernels")
    assert listed.status_code == 200 and alice.live not in listed.text and dashed not in listed.text
    # her kernel kept its state: it was neither restarted, interrupted nor deleted
    _alice_is_untouched(alice_client, alice)


def _close_code(url: str, headers: dict[str, str] | None = None) -> int | None:
    try:
        with connect(url, additional_headers=headers, open_timeout=30) as ws:
            ws.send(
                json.dumps(
                    {
                        "header": {"msg_id": "m1", "msg_type": "execute_request", "session": "s", "username": "m"},
                        "parent_header": {},
                        "metadata": {},
                        "content": {"code": "secret = 'overwritten'", "silent": False},
                        "channel": "shell",
                    }
                )
            )
            ws.recv(timeout=30)
    except InvalidStatus as exc:
        return exc.response.status_code
    except ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd else None
    return None


def test_jupyter_channels_of_another_keys_kernel_are_closed(
    keyed: Keyed, alice_client: httpx.Client, alice: Alice
) -> None:
    ws = keyed.gateway.ws_url
    dashed = str(uuid.UUID(alice.live))
    codes = {
        "header": _close_code(f"{ws}/api/kernels/{dashed}/channels", {"Authorization": f"token {keyed.mallory}"}),
        "query-token": _close_code(f"{ws}/api/kernels/{alice.live}/channels?token={keyed.mallory}"),
    }
    assert codes == {"header": 4404, "query-token": 4404}, codes
    _alice_is_untouched(alice_client, alice)


def test_another_key_cannot_fork_a_session(alice_client: httpx.Client, mallory: httpx.Client, alice: Alice) -> None:
    """A fork copies files and replays code: it reads a session as fully as its
    owner does, so only the owner's key may fork, and others learn nothing."""
    sessions_before = mallory.get("/v1/sessions").json()["sessions"]
    for sid in (alice.live, alice.deleted, alice.live.upper()):
        resp = mallory.post("/v1/sessions", json={"from": sid})
        assert resp.status_code == 404, (sid, resp.status_code, resp.text[:300])
        assert resp.json()["error"]["code"] == "session_not_found", resp.text[:300]
    assert mallory.get("/v1/sessions").json()["sessions"] == sessions_before  # nothing was created
    _alice_is_untouched(alice_client, alice)
