"""What a gateway refuses or cuts, end to end: the code policy, request and
frame sizes, images and kernel messages over their caps."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.integration.conftest import RunningGateway, gateway_settings, start_gateway
from tests.support.http import http_fixture

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def capgw(docker_client: Any) -> Iterator[RunningGateway]:
    gw = start_gateway(
        gateway_settings(
            gateway_name=f"caps{os.getpid()}",
            policy_deny_imports=["subprocess"],
            policy_deny_calls=["os.system"],
            policy_deny_shell=True,
            max_image_bytes=100_000,
            max_message_bytes=1 * MiB,
            max_request_bytes=1 * MiB,
            max_code_bytes=768 * 1024,
        )
    )
    yield gw
    gw.stop()
    left = docker_client.containers.list(all=True, filters={"label": f"kernelgw.gateway={gw.settings.gateway_name}"})
    assert not left


http = http_fixture("capgw", scope="module")


@pytest.fixture(scope="module")
def sid(http: httpx.Client) -> Iterator[str]:
    resp = http.post("/v1/sessions", json={})
    assert resp.status_code == 201, resp.text
    yield resp.json()["id"]
    http.delete(f"/v1/sessions/{resp.json()['id']}")


def execute(http: httpx.Client, sid: str, code: str) -> dict[str, Any]:
    resp = http.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("code", "rule", "line"),
    [
        ("x = 1\nimport subprocess\n", "deny_imports", 2),
        ("from subprocess import run as r\n", "deny_imports", 1),
        ("import os\nos.system('id')\n", "deny_calls", 2),
        ("print(1)\n!ls /\n", "deny_shell", 2),
        ("%%bash\nid\n", "deny_shell", 1),
    ],
)
def test_policy_refuses_a_cell_naming_the_rule(http: httpx.Client, sid: str, code: str, rule: str, line: int) -> None:
    before = execute(http, sid, "1")["execution_count"]
    resp = http.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "policy_violation"
    assert rule in error["message"] and f"line {line}" in error["message"]
    # refused before the kernel: nothing ran
    assert execute(http, sid, "1")["execution_count"] == before + 1


def test_policy_allows_ordinary_analysis_code(http: httpx.Client, sid: str) -> None:
    result = execute(http, sid, "import json, os\n%time y = sum(range(10))\nprint(os.getcwd(), y)")
    assert result["status"] == "ok"


def test_policy_over_websocket_and_on_restore(capgw: RunningGateway, http: httpx.Client, sid: str) -> None:
    with connect(f"{capgw.ws_url}/v1/sessions/{sid}/ws") as ws:
        ws.send(json.dumps({"type": "execute", "code": "import subprocess", "execution_id": "bad"}))
        event = json.loads(ws.recv(timeout=30))
        assert event["type"] == "protocol_error" and event["execution_id"] == "bad"
        assert "deny_imports" in event["message"]
    sessions_before = len(http.get("/v1/sessions").json()["sessions"])
    notebook = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {},
        "cells": [
            {"cell_type": "code", "id": "a", "source": "x = 1", "metadata": {}, "outputs": [], "execution_count": None},
            {
                "cell_type": "code",
                "id": "b",
                "source": "import subprocess",
                "metadata": {},
                "outputs": [],
                "execution_count": None,
            },
        ],
    }
    resp = http.post("/v1/sessions", json={"notebook": notebook})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "policy_violation"
    assert "cell 1" in resp.json()["error"]["message"]
    assert len(http.get("/v1/sessions").json()["sessions"]) == sessions_before  # no kernel started


def _png(size: int) -> str:
    return base64.b64encode(b"\x89PNG\r\n\x1a\n" + os.urandom(size)).decode()


def test_an_image_over_the_cap_is_replaced_by_a_note(http: httpx.Client, sid: str) -> None:
    small, big = _png(1000), _png(300_000)
    code = (
        "from IPython.display import display\n"
        f"display({{'image/png': {small!r}, 'text/plain': 'small'}}, raw=True)\n"
        f"display({{'image/png': {big!r}, 'text/plain': 'big'}}, raw=True)\n"
        "print('after')\n"
    )
    result = execute(http, sid, code)
    assert result["status"] == "ok"
    kinds = [e["type"] for e in result["events"]]
    displays = [e for e in result["events"] if e["type"] == "display"]
    assert displays[0]["data"]["image/png"] == small
    assert "image/png" not in displays[1]["data"]
    assert "removed" in displays[1]["data"]["text/plain"] and "100000" in displays[1]["data"]["text/plain"]
    truncated = [e for e in result["events"] if e["type"] == "truncated"]
    assert len(truncated) == 1 and truncated[0]["limit_bytes"] == 100_000
    assert kinds.index("truncated") < kinds.index("display", kinds.index("display") + 1)
    assert "".join(e["text"] for e in result["events"] if e["type"] == "stream") == "after\n"


def test_a_kernel_message_over_the_cap_is_dropped_and_reported(http: httpx.Client, sid: str) -> None:
    # a display: stream text the kernel sends in slices of 256 Ki characters, each under the cap
    result = execute(
        http,
        sid,
        "from IPython.display import display\ndisplay({'text/plain': 'x' * (3 * 1024 * 1024)}, raw=True)\nprint('end')",
    )
    assert result["status"] == "ok"
    truncated = [e for e in result["events"] if e["type"] == "truncated"]
    assert truncated and truncated[0]["limit_bytes"] == 1 * MiB
    assert "larger than" in truncated[0]["message"]
    assert not [e for e in result["events"] if e["type"] == "display"]
    # the kernel and its sockets are fine afterwards
    again = execute(http, sid, "print('still here')")
    assert "".join(e["text"] for e in again["events"] if e["type"] == "stream") == "still here\n"


def test_request_bodies_over_the_cap_get_413_but_uploads_have_their_own_limit(http: httpx.Client, sid: str) -> None:
    resp = http.post(
        f"/v1/sessions/{sid}/execute",
        content=b'{"code": "' + b"1" * (2 * MiB) + b'"}',
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "payload_too_large"
    upload = http.put(f"/v1/sessions/{sid}/files/big.bin", content=os.urandom(2 * MiB))
    assert upload.status_code in (200, 201), upload.text
    assert (
        execute(http, sid, "import os\nprint(os.path.getsize('/workspace/big.bin'))")["events"][-2]["text"]
        == f"{2 * MiB}\n"
    )


def test_websocket_frames_over_the_cap_close_the_socket_and_a_new_one_works(capgw: RunningGateway, sid: str) -> None:
    with connect(f"{capgw.ws_url}/v1/sessions/{sid}/ws", max_size=None) as ws:
        ws.send(json.dumps({"type": "execute", "code": "1" * (900 * 1024)}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009  # message too big
    with connect(f"{capgw.ws_url}/v1/sessions/{sid}/ws") as ws:
        ws.send(json.dumps({"type": "execute", "code": "print('ok')"}))
        while (event := json.loads(ws.recv(timeout=60)))["type"] != "done":
            pass
        assert event["status"] == "ok"
