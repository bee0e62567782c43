"""Threat: a web page in the user's browser drives a keyless gateway on loopback,
by DNS rebinding (the page's own name resolved to 127.0.0.1, so Host and Origin
are the attacker's) or by plain cross-site requests (a foreign Origin). Against
the real `kernelgw serve` and a real kernel: the page can neither create a
session, nor run code in one, nor watch one (the whole route table is covered
in tests/unit/server/test_hosts.py)."""

from __future__ import annotations

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.integration.conftest import RunningGateway
from tests.security.conftest import run, stdout

pytestmark = pytest.mark.integration

REBINDING = {"Host": "attacker.example:8000", "Origin": "http://attacker.example:8000"}
CROSS_SITE = {"Origin": "https://attacker.example"}


@pytest.mark.parametrize("page", [REBINDING, CROSS_SITE], ids=["rebinding", "cross-site"])
def test_a_page_cannot_create_run_list_or_watch(
    gateway: RunningGateway, http: httpx.Client, session_id: str, page: dict[str, str]
) -> None:
    run(http, session_id, "secret = 42")
    tries = [
        ("POST", "/v1/sessions", {}),
        ("POST", f"/v1/sessions/{session_id}/execute", {"code": "secret = 0"}),
        ("GET", "/v1/sessions", None),
        ("GET", f"/v1/sessions/{session_id}/history", None),
        ("POST", "/api/kernels", {}),
    ]
    before = len(http.get("/v1/sessions").json()["sessions"])
    for method, path, body in tries:
        resp = http.request(method, path, json=body, headers=page)
        assert resp.status_code in (400, 403), (path, resp.status_code, resp.text)
        assert resp.json()["error"]["code"] in ("host_not_allowed", "origin_not_allowed")
    ws_url = gateway.url.replace("http://", "ws://") + f"/v1/sessions/{session_id}/ws"
    extra = {k: v for k, v in page.items() if k != "Origin"}
    with connect(ws_url, origin=page["Origin"], additional_headers=extra) as ws:  # type: ignore[arg-type]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
    # nothing happened: no new session, the variable untouched
    assert len(http.get("/v1/sessions").json()["sessions"]) == before
    assert stdout(run(http, session_id, "print(secret)")) == "42\n"
