"""Threat: hostile requests to the gateway itself: malformed, mistyped, deeply
nested, oversized or nonsensical JSON over REST, and garbage, binary or
oversized frames over the WebSocket. Each gets a clear error (REST: JSON
``{"error": {"code", "message"}}``; WebSocket: a ``protocol_error`` event or
close code), nothing runs, nothing is left behind, and the gateway goes on.

Covered elsewhere (tests/integration/test_websocket.py): "not json", "[]",
unknown types and a small binary frame on an idle connection; the 4404 close
for the id "nope"; code over the limit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import docker
import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.security.conftest import (
    MiB,
    RunningGateway,
    assert_error,
    gateway_containers,
    new_session,
    run,
    stdout,
    until_done,
    ws_connect,
)

pytestmark = pytest.mark.integration

JSON = {"content-type": "application/json"}
DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture(scope="module")
def target(http: httpx.Client) -> Iterator[str]:
    """A session for requests that need one (they never get as far as running code)."""
    with new_session(http) as sid:
        yield sid


def endpoint(name: str, sid: str) -> str:
    return {
        "create-session": "/v1/sessions",
        "execute": f"/v1/sessions/{sid}/execute",
        "notes": f"/v1/sessions/{sid}/notes",
        "packages": f"/v1/sessions/{sid}/packages",
    }[name]


ENDPOINTS = ["create-session", "execute", "notes", "packages"]


def nothing_ran(http: httpx.Client, sid: str, before: dict[str, int]) -> None:
    info = http.get(f"/v1/sessions/{sid}").json()
    assert {k: info[k] for k in before} == before, "a refused request changed the session"


def counters(http: httpx.Client, sid: str) -> dict[str, int]:
    info = http.get(f"/v1/sessions/{sid}").json()
    return {"execution_count": info["execution_count"], "last_seq": info["last_seq"]}


@pytest.mark.parametrize("name", ENDPOINTS)
def test_malformed_json_gets_422(http: httpx.Client, target: str, name: str) -> None:
    before = counters(http, target)
    sessions = len(http.get("/v1/sessions").json()["sessions"])
    for body in [
        b"{",
        b"not json",
        b'{"code": "1",}',
        b"\xff\xfe{}",
        b"",
        b'{"code": "\\ud800"',
        b'{"code": 1}',
        b'{"markdown": ["x"]}',
        b'{"packages": "sympy"}',
        b'{"memory_mb": "lots"}',
    ]:
        resp = http.post(endpoint(name, target), content=body, headers=JSON)
        assert_error(resp, 422)
    nothing_ran(http, target, before)
    assert len(http.get("/v1/sessions").json()["sessions"]) == sessions


def test_non_object_json_bodies_get_422(http: httpx.Client, target: str) -> None:
    before = counters(http, target)
    for name in ENDPOINTS:
        for body in [b"[]", b"null", b'"execute"', b"1", b"true", b'[{"code": "1"}]']:
            assert_error(http.post(endpoint(name, target), content=body, headers=JSON), 422)
    nothing_ran(http, target, before)


def test_deeply_nested_json_is_refused(http: httpx.Client, target: str) -> None:
    before = counters(http, target)
    for name in ENDPOINTS:
        assert_error(http.post(endpoint(name, target), content=DEEP, headers=JSON), 400, 422)
        nested_field = b'{"code": "1", "execution_id": ' + DEEP + b"}"
        assert_error(http.post(endpoint(name, target), content=nested_field, headers=JSON), 400, 422)
    nothing_ran(http, target, before)


def _chunked(total: int) -> Iterator[bytes]:
    yield b'{"code": "'
    for _ in range(total // MiB):
        yield b"#" * MiB
    yield b'"}'


HUGE_BODIES: dict[str, tuple[str, Callable[[], bytes | Iterator[bytes]]]] = {
    "code-30mb": ("execute", lambda: json.dumps({"code": "#" * (30 * MiB)}).encode()),
    "unknown-field-30mb": ("execute", lambda: json.dumps({"code": "1", "junk": "x" * (30 * MiB)}).encode()),
    "env-30mb": ("create-session", lambda: json.dumps({"env": {"BIG": "x" * (30 * MiB)}}).encode()),
    "over-the-cap-40mb": ("create-session", lambda: json.dumps({"notebook": {"x": "y" * (40 * MiB)}}).encode()),
    "chunked-40mb": ("execute", lambda: _chunked(40 * MiB)),
}


@pytest.mark.parametrize("kind", list(HUGE_BODIES))
def test_huge_json_body_is_refused(
    http: httpx.Client, gateway: RunningGateway, target: str, docker_client: docker.DockerClient, kind: str
) -> None:
    name, body = HUGE_BODIES[kind]
    before = counters(http, target)
    containers = len(gateway_containers(docker_client, gateway.settings.gateway_name))
    assert_error(http.post(endpoint(name, target), content=body(), headers=JSON), 413, 422)
    nothing_ran(http, target, before)
    assert len(gateway_containers(docker_client, gateway.settings.gateway_name)) == containers


@pytest.mark.parametrize("timeout", ["NaN", "Infinity", "-Infinity", "-1", "0", "1e308"])
def test_nonsense_timeouts_are_refused(http: httpx.Client, target: str, timeout: str) -> None:
    before = counters(http, target)
    for name in ("execute", "create-session"):
        body = f'{{"code": "while True: pass", "timeout": {timeout}}}'.encode()
        if name == "create-session":
            body = f'{{"timeout": {timeout}}}'.encode()
        assert_error(http.post(endpoint(name, target), content=body, headers=JSON), 400, 422)
    nothing_ran(http, target, before)


LONE_SURROGATE_BODIES = {
    # valid JSON, which Python's decoder turns into a str no UTF-8 encoder takes: one
    # such cell once made the history store fail, refusing every session's work
    "execute": b'{"code": "print(1)  # \\ud800"}',
    "create-session": b'{"env": {"A": "\\udfff"}}',
    "notes": b'{"markdown": "\\ud800"}',
    "packages": b'{"packages": ["\\ud800"]}',
}


@pytest.mark.parametrize("name", ENDPOINTS)
def test_lone_surrogates_get_422_and_harm_nothing(http: httpx.Client, target: str, name: str) -> None:
    before = counters(http, target)
    resp = http.post(endpoint(name, target), content=LONE_SURROGATE_BODIES[name], headers=JSON)
    assert_error(resp, 422)
    assert "lone surrogate" in resp.text
    nothing_ran(http, target, before)
    assert http.get("/readyz").status_code == 200  # the store is fine: nothing reached it
    assert stdout(run(http, target, "print('still')")) == "still\n"


def test_ws_garbage_while_a_cell_runs_is_answered_and_the_cell_finishes(
    gateway: RunningGateway, http: httpx.Client, session_id: str
) -> None:
    ticking = "import time\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.15)"
    garbage = [
        "{",
        DEEP.decode(),
        '{"type": "execute", "code": "print(\\"\\ud800\\")", "execution_id": "surrogate"}',
        '{"type": "execute", "code": "1", "execution_id": "../../etc"}',
        '{"type": "execute", "code": "1", "timeout": -1, "execution_id": "negative"}',
        '{"type": "interrupt", "extra": true}',
    ]
    with ws_connect(gateway, session_id, max_size=None) as ws:
        ws.send(json.dumps({"type": "execute", "code": ticking, "execution_id": "ticks"}))
        for message in garbage:
            ws.send(message)
        # a binary frame that holds a valid execute request: never run
        ws.send(json.dumps({"type": "execute", "code": "pwned = 1", "execution_id": "binary"}).encode())
        events = until_done(ws, "ticks")
        errors = [e for e in events if e["type"] == "protocol_error"]
        while len(errors) < len(garbage) + 1:
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] == "protocol_error", event
            errors.append(event)
        assert all(e["message"] and e["seq"] is None for e in errors)
        ticks = "".join(e["text"] for e in events if e["type"] == "stream" and e["execution_id"] == "ticks")
        assert ticks == "".join(f"tick {i}\n" for i in range(5))
        assert events[-1]["status"] == "ok"
        # the same connection still executes
        ws.send(json.dumps({"type": "execute", "code": "print('pwned' in dir())", "execution_id": "check"}))
        check = until_done(ws, "check")
    assert "".join(e["text"] for e in check if e["type"] == "stream") == "False\n"
    assert {e["execution_id"] for e in events if e["type"] == "queued"} == {"ticks"}


@pytest.mark.parametrize("frame", ["text", "binary"])
def test_ws_oversized_frame_is_refused_and_a_new_connection_works(
    gateway: RunningGateway, session_id: str, frame: str
) -> None:
    payload = json.dumps({"type": "execute", "code": "#" * (20 * MiB), "execution_id": "huge"})
    with ws_connect(gateway, session_id, max_size=None) as ws:
        try:
            ws.send(payload if frame == "text" else payload.encode())
            event = json.loads(ws.recv(timeout=30))
            assert event["type"] == "protocol_error", event
        except ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code == 1009, closed
    with ws_connect(gateway, session_id) as ws:
        ws.send(json.dumps({"type": "execute", "code": "print('fine')", "execution_id": "after"}))
        events = until_done(ws, "after")
    assert "".join(e["text"] for e in events if e["type"] == "stream") == "fine\n"
    assert not [e for e in events if e["execution_id"] == "huge"]


@pytest.mark.parametrize("which", ["deleted", "long", "dot-dot"])
def test_ws_to_a_session_that_does_not_exist_closes_4404(
    gateway: RunningGateway, http: httpx.Client, which: str
) -> None:
    if which == "deleted":
        with new_session(http) as sid:
            run(http, sid, "1")
    else:
        sid = {"long": "a" * 4000, "dot-dot": "%2e%2e"}[which]
    with ws_connect(gateway, sid) as ws, pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=10)
    assert info.value.rcvd is not None and info.value.rcvd.code == 4404
    assert len(info.value.rcvd.reason.encode()) <= 123  # a close reason must fit in a control frame


def test_gateway_still_serves_after_the_abuse(http: httpx.Client, target: str) -> None:
    """The module's session outlived every refused request and still runs code."""
    assert stdout(run(http, target, "print(6 * 7)")) == "42\n"
