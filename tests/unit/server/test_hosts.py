"""Pages the gateway does not serve are refused on every route and WebSocket:
DNS rebinding (a foreign name in Host) and cross-site requests (a foreign
Origin). The policy's rules are pure logic; the refusals are checked on the
real app behind a real uvicorn, with rebinding-style requests as a browser
would send them (Host and Origin both the attacker's name)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from kernelgw.config import Settings
from kernelgw.server import create_app
from kernelgw.server.hosts import PagePolicy, host_name
from tests.support.app import local_settings, serve_tcp
from tests.support.local_backend import LocalBackend
from tests.support.routes import Endpoint, endpoints


def policy(**settings: Any) -> PagePolicy:
    return PagePolicy.from_settings(Settings(**settings))


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8000", "localhost"),
        ("LocalHost", "localhost"),
        ("localhost.:8000", "localhost"),
        ("[::1]:8000", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("evil.example:80", "evil.example"),
        ("", None),
    ],
)
def test_host_name(header: str, name: str | None) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("localhost:8000", True),
        ("app.localhost:8000", True),  # browsers resolve *.localhost to loopback themselves
        ("127.0.0.1:8000", True),
        ("[::1]:8000", True),
        ("10.1.2.3:8000", True),  # a page that uses an address is not rebinding a name
        (socket.gethostname() + ":8000", True),
        ("evil.example:8000", False),
        ("localhost.evil.example", False),
        ("evil-localhost:8000", False),
        ("[::1", False),  # does not parse
        (None, True),  # HTTP/1.0 without Host: no browser
    ],
)
def test_default_hosts(header: str | None, ok: bool) -> None:
    assert policy().host_allowed(header) is ok


def test_configured_hosts_replace_the_defaults() -> None:
    p = policy(allowed_hosts=["kernelgw.internal", "*.example.com"])
    assert p.host_allowed("kernelgw.internal:8000")
    assert p.host_allowed("a.b.example.com")
    assert not p.host_allowed("example.com.evil.net")
    assert not p.host_allowed("localhost:8000")
    assert p.host_allowed("127.0.0.1:8000")
    assert policy(allowed_hosts=["*"]).host_allowed("anything.example")
    # a named listen address is one of the gateway's names
    assert policy(host="gw.lan").host_allowed("gw.lan:8000")


@pytest.mark.parametrize(
    ("origin", "host", "allowed", "ok"),
    [
        (None, "gw:8000", [], True),  # SDKs send no Origin
        ("http://gw:8000", "gw:8000", [], True),
        ("http://GW:8000", "gw:8000", [], True),
        ("https://evil.example", "gw:8000", [], False),
        ("http://gw:8001", "gw:8000", [], False),
        ("null", "gw:8000", [], False),  # sandboxed iframes, file:// pages
        ("https://chat.example", "gw:8000", ["https://chat.example"], True),
        ("https://chat.example/", "gw:8000", ["https://Chat.example"], True),
        ("https://evil.example", "gw:8000", ["*"], True),
        ("http://gw:8000", None, [], False),
    ],
)
def test_origin(origin: str | None, host: str | None, allowed: list[str], ok: bool) -> None:
    assert policy(allowed_origins=allowed).origin_allowed(origin, host) is ok


# ---------------------------------------------------------------- on the real app
@pytest.fixture
async def gw(local_backend: LocalBackend, tmp_path: Path) -> AsyncIterator[str]:
    async with serve_tcp(local_settings(tmp_path), local_backend) as address:
        yield address


def http_endpoints() -> list[Endpoint]:
    found = [e for e in endpoints(create_app()) if e.method != "WS"]
    assert len(found) >= 30  # the derivation found the routes
    return found


REBINDING = {"Host": "evil.example:8000", "Origin": "http://evil.example:8000"}
CROSS_SITE = {"Origin": "https://evil.example"}


async def test_every_route_refuses_a_rebinding_page(gw: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{gw}", timeout=30) as http:
        for e in http_endpoints():
            resp = await http.request(e.method, e.url(), headers=REBINDING)
            assert resp.status_code == 400, (e, resp.text)
            assert resp.json()["error"]["code"] == "host_not_allowed", e
            assert "allowed_hosts" in resp.json()["error"]["message"]
            # Host alone: a rebinding page's simple GET carries no Origin
            resp = await http.request(e.method, e.url(), headers={"Host": "evil.example:8000"})
            assert resp.status_code == 400, (e, resp.text)


async def test_every_route_refuses_a_cross_site_page(gw: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{gw}", timeout=30) as http:
        for e in http_endpoints():
            resp = await http.request(e.method, e.url(), headers=CROSS_SITE)
            assert resp.status_code == 403, (e, resp.text)
            assert resp.json()["error"]["code"] == "origin_not_allowed", e


async def test_the_gateways_own_page_and_clients_without_origin_pass(gw: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{gw}", timeout=30) as http:
        assert (await http.get("/v1/sessions")).status_code == 200
        assert (await http.get("/v1/sessions", headers={"Origin": f"http://{gw}"})).status_code == 200
        created = await http.post("/v1/sessions", json={}, headers={"Origin": f"http://{gw}"})
        assert created.status_code == 201, created.text
        port = gw.rsplit(":", 1)[1]
        named = {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"}
        assert (await http.get("/v1/sessions", headers=named)).status_code == 200
        await http.delete(f"/v1/sessions/{created.json()['id']}")


@pytest.mark.parametrize("path", ["/v1/sessions/{sid}/ws", "/api/kernels/{sid}/channels"])
async def test_websockets_refuse_rebinding_and_cross_site_pages(gw: str, path: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{gw}", timeout=60) as http:
        created = await http.post("/v1/sessions", json={})
        sid = created.json()["id"]
        try:
            url = f"ws://{gw}{path.format(sid=sid)}"
            for headers in (REBINDING, {"Host": "evil.example:8000"}, CROSS_SITE):
                extra = {k: v for k, v in headers.items() if k != "Origin"}
                async with connect(url, origin=headers.get("Origin"), additional_headers=extra) as ws:  # type: ignore[arg-type]
                    with pytest.raises(ConnectionClosed) as closed:
                        await ws.recv()
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403, headers
        finally:
            await http.delete(f"/v1/sessions/{sid}")
