"""Every route of the app needs a key, except an explicit public allowlist.

The routes come from ``app.routes`` (tests/support/routes.py), not from a list
kept by hand: a route added without authentication fails here. In-process on
LocalBackend; tests/security/test_auth.py checks the same on a real gateway.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from kernelgw.server import create_app
from kernelgw.storage import Store
from kernelgw.storage.keys import KeyStore
from tests.support.app import local_settings
from tests.support.local_backend import LocalBackend
from tests.support.routes import PUBLIC, endpoints, face, protected, sandbox_traffic

BAD_CREDENTIALS = {
    "missing": None,
    "wrong secret": "kgw_000000000000_" + "A" * 43,
    "malformed": "not-a-key",
    "empty bearer": "",
    "basic scheme": None,  # see below: the right key, wrong scheme
}


async def _make_key(data_dir: Path) -> tuple[str, str]:
    store = Store.from_settings(local_settings(data_dir))
    await store.start()
    try:
        key, text = await KeyStore(store).create("alice")
        return key.id, text
    finally:
        await store.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str, str]]:
    """A gateway that requires keys, one key ``alice`` (its id and text)."""
    data_dir = tmp_path_factory.mktemp("auth-routes")
    key_id, key_text = asyncio.run(_make_key(data_dir))
    backend = LocalBackend()
    app = create_app(local_settings(data_dir, auth="required"), backend=backend)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client, key_id, key_text
    assert not backend.running()
    asyncio.run(backend.kill_all())


def test_the_route_table_has_the_expected_shape() -> None:
    """Guards the derivation itself: if it found nothing, the 401 test would pass vacuously."""
    found = endpoints(create_app())
    methods = {e.method for e in found}
    assert {"GET", "POST", "PUT", "DELETE", "WS"} <= methods
    assert len(protected(create_app())) >= 20
    assert {(e.method, e.template) for e in found} >= PUBLIC


@pytest.mark.parametrize("name", list(BAD_CREDENTIALS))
def test_every_non_public_route_answers_the_same_401(gateway: tuple[TestClient, str, str], name: str) -> None:
    client, key_id, key_text = gateway
    credentials: list[dict[str, str]] = []
    if name == "basic scheme":
        credentials.append({"Authorization": f"Basic {key_text}"})
    else:
        text = BAD_CREDENTIALS[name]
        credentials.append({} if text is None else {"Authorization": f"Bearer {text}"})
    # a well-formed key with a real id but the wrong secret, too
    credentials.append({"Authorization": f"Bearer kgw_{key_id}_" + "B" * 43})
    # one 401 body per API face (kernelgw's /v1 errors, Jupyter's {message, reason} under
    # /api, E2B's {code, message} under /e2b, the API description's own hint at ?token=)
    bodies: dict[str, set[str]] = {"v1": set(), "jupyter": set(), "docs": set(), "e2b": set()}
    checked = []
    for headers in credentials:
        for endpoint in protected(client.app):  # type: ignore[arg-type]
            if endpoint.method == "WS":
                continue
            resp = client.request(endpoint.method, endpoint.url(), headers=headers)
            assert resp.status_code == 401, (endpoint, resp.text)
            assert resp.headers["www-authenticate"].startswith("Bearer")
            bodies[face(endpoint)].add(resp.text)
            checked.append(endpoint)
    assert checked, "no route was checked"
    assert all(len(texts) == 1 for texts in bodies.values()), (
        "401 answers differ: they would reveal which part was wrong"
    )
    assert json.loads(bodies["v1"].pop())["error"]["code"] == "unauthorized"
    assert json.loads(bodies["jupyter"].pop())["reason"] == "Unauthorized"
    assert json.loads(bodies["docs"].pop())["error"]["code"] == "unauthorized"
    assert json.loads(bodies["e2b"].pop())["code"] == 401


def test_sandbox_traffic_without_its_token_is_one_answer_a_key_does_not_change(
    gateway: tuple[TestClient, str, str],
) -> None:
    """E2B's sandbox traffic takes no key but the sandbox's token: without it (a key
    or none, an unknown sandbox or none), every route gives E2B's one 502."""
    client, _, key_text = gateway
    routes = [e for e in endpoints(client.app) if (e.method, e.template) in sandbox_traffic()]  # type: ignore[arg-type]
    assert len(routes) >= 6
    bodies = set()
    for endpoint in routes:
        for headers in (
            {},
            {"Authorization": f"Bearer {key_text}", "X-API-KEY": key_text},
            {"E2b-Sandbox-Id": "0123456789abcdef", "E2b-Sandbox-Port": "49999", "X-Access-Token": "t"},
        ):
            resp = client.request(endpoint.method, endpoint.url(), headers=headers, json={"code": "1"})
            assert resp.status_code == 502, (endpoint, resp.text)
            bodies.add(resp.text)
    assert len(bodies) == 1
    assert "was not found" in json.loads(bodies.pop())["message"]


def test_every_websocket_closes_with_4401_without_a_key(gateway: tuple[TestClient, str, str]) -> None:
    client, key_id, _ = gateway
    sockets = [e for e in protected(client.app) if e.method == "WS"]  # type: ignore[arg-type]
    assert sockets
    for endpoint in sockets:
        for headers in ({}, {"Authorization": f"Bearer kgw_{key_id}_" + "B" * 43}):
            with (
                pytest.raises(WebSocketDisconnect) as closed,
                client.websocket_connect("ws://127.0.0.1" + endpoint.url(), headers=headers) as ws,
            ):
                ws.receive_text()
            assert closed.value.code == 4401, endpoint


def test_public_routes_answer_without_a_key(gateway: tuple[TestClient, str, str]) -> None:
    client, _, _ = gateway
    for endpoint in endpoints(client.app):  # type: ignore[arg-type]
        if (endpoint.method, endpoint.template) in PUBLIC:
            resp = client.request(endpoint.method, endpoint.url(), follow_redirects=False)
            assert resp.status_code in (200, 308), (endpoint, resp.status_code)


def test_the_api_description_needs_the_key_or_a_browser_token(gateway: tuple[TestClient, str, str]) -> None:
    client, _, key_text = gateway
    for path in ("/openapi.json", "/docs", "/redoc"):
        resp = client.get(path)
        assert resp.status_code == 401 and "/docs?token=" in resp.json()["error"]["message"], path
    schema = client.get("/openapi.json", headers={"Authorization": f"Bearer {key_text}"})
    assert schema.status_code == 200 and "/v1/sessions" in schema.json()["paths"]
    token = client.post("/v1/auth/token", headers={"Authorization": f"Bearer {key_text}"}).json()["token"]
    page = client.get("/docs", params={"token": token})
    # the page asks for the schema with the same token, which lets it in
    assert page.status_code == 200 and "/openapi.json?token=" in page.text
    assert client.get("/openapi.json", params={"token": token}).status_code == 200
    assert client.get("/openapi.json", params={"token": token + "x"}).status_code == 401


def test_the_right_key_is_let_in(gateway: tuple[TestClient, str, str]) -> None:
    client, _, key_text = gateway
    resp = client.get("/v1/auth/whoami", headers={"Authorization": f"Bearer {key_text}"})
    assert resp.status_code == 200 and resp.json()["name"] == "alice"
