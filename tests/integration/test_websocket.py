"""The WebSocket: live fan-out to several watchers, resume, malformed input."""

from __future__ import annotations

import base64
import json
import os
import socket
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.integration.conftest import RunningGateway, run

pytestmark = pytest.mark.integration


def _until_done(ws: ClientConnection, execution_id: str | None = None) -> list[dict[str, Any]]:
    events = []
    while True:
        event = json.loads(ws.recv(timeout=60))
        events.append(event)
        if event["type"] == "done" and (execution_id is None or event["execution_id"] == execution_id):
            return events


def test_malformed_messages_get_an_error_event_and_the_connection_stays(
    gateway: RunningGateway, session_id: str
) -> None:
    with connect(f"{gateway.ws_url}/v1/sessions/{session_id}/ws") as ws:
        for bad in ["not json", "[]", '{"type": "explode"}', '{"type": "execute"}', '{"type": "execute", "code": 1}']:
            ws.send(bad)
            event = json.loads(ws.recv(timeout=10))
            assert event["type"] == "protocol_error", bad
            assert event["message"]
        ws.send(b"\x00binary")
        assert json.loads(ws.recv(timeout=10))["type"] == "protocol_error"
        ws.send(json.dumps({"type": "execute", "code": "print('still open')", "execution_id": "ok-1"}))
        events = _until_done(ws, "ok-1")
        assert "".join(e["text"] for e in events if e["type"] == "stream") == "still open\n"


def test_duplicate_execution_id_is_refused(gateway: RunningGateway, session_id: str) -> None:
    with connect(f"{gateway.ws_url}/v1/sessions/{session_id}/ws") as ws:
        ws.send(json.dumps({"type": "execute", "code": "1", "execution_id": "dup"}))
        _until_done(ws, "dup")
        ws.send(json.dumps({"type": "execute", "code": "2", "execution_id": "dup"}))
        event = json.loads(ws.recv(timeout=10))
        assert event["type"] == "protocol_error" and "already used" in event["message"]


def test_several_watchers_see_the_same_stream(gateway: RunningGateway, session_id: str) -> None:
    url = f"{gateway.ws_url}/v1/sessions/{session_id}/ws"
    with connect(url) as a, connect(url) as b, connect(url) as c:
        a.send(json.dumps({"type": "execute", "code": "for i in range(5): print(i)", "execution_id": "fan"}))
        seen = [_until_done(ws, "fan") for ws in (a, b, c)]
    assert seen[0] == seen[1] == seen[2]
    assert "".join(e["text"] for e in seen[0] if e["type"] == "stream") == "0\n1\n2\n3\n4\n"


def test_resume_from_last_seq_delivers_missed_events_exactly_once(
    gateway: RunningGateway, http: httpx.Client, session_id: str
) -> None:
    url = f"{gateway.ws_url}/v1/sessions/{session_id}/ws"
    with connect(url) as ws:
        ws.send(json.dumps({"type": "execute", "code": "print('one')", "execution_id": "r1"}))
        first = _until_done(ws, "r1")
    last_seen = first[-1]["seq"]
    # while nobody is connected, two more executions run
    http.post(f"/v1/sessions/{session_id}/execute", json={"code": "print('two')", "execution_id": "r2"})
    http.post(f"/v1/sessions/{session_id}/execute", json={"code": "print('three')", "execution_id": "r3"})
    with connect(f"{url}?last_seq={last_seen}") as ws:
        missed = _until_done(ws, "r3")
        ws.send(json.dumps({"type": "execute", "code": "print('four')", "execution_id": "r4"}))
        live = _until_done(ws, "r4")
    seqs = [e["seq"] for e in missed + live]
    assert seqs == list(range(last_seen + 1, last_seen + 1 + len(seqs)))  # no gap, no duplicate
    texts = [e["text"] for e in missed + live if e["type"] == "stream"]
    assert texts == ["two\n", "three\n", "four\n"]


def test_resume_past_the_replay_buffer_gets_a_gap_marker(gateway: RunningGateway) -> None:
    from tests.integration.conftest import gateway_settings, start_gateway

    gw = start_gateway(gateway_settings(gateway_name=f"{gateway.settings.gateway_name}g", replay_buffer=10))
    try:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            for i in range(5):
                http.post(f"/v1/sessions/{sid}/execute", json={"code": f"print({i})"})
            last_seq = http.get(f"/v1/sessions/{sid}").json()["last_seq"]
            assert last_seq == 20  # queued, busy, stream, done per execution
            with connect(f"{gw.ws_url}/v1/sessions/{sid}/ws?last_seq=2") as ws:
                gap = json.loads(ws.recv(timeout=10))
                assert gap == {"type": "gap", "seq": None, "execution_id": None, "first_missing": 3, "last_missing": 10}
                replayed = [json.loads(ws.recv(timeout=10)) for _ in range(10)]
                assert [e["seq"] for e in replayed] == list(range(11, 21))
    finally:
        gw.stop()


def test_unknown_session_closes_with_4404(gateway: RunningGateway) -> None:
    with connect(f"{gateway.ws_url}/v1/sessions/nope/ws") as ws:
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=10)
    assert info.value.rcvd is not None and info.value.rcvd.code == 4404


def test_deleting_the_session_closes_its_websockets(gateway: RunningGateway, http: httpx.Client) -> None:
    sid = http.post("/v1/sessions", json={}).json()["id"]
    with connect(f"{gateway.ws_url}/v1/sessions/{sid}/ws") as ws:
        http.delete(f"/v1/sessions/{sid}")
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=10)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1001


def _raw_ws_that_never_reads(ws_url: str) -> socket.socket:
    """A WebSocket client that completes the handshake and then never reads: the
    slowest consumer there is. (Client libraries read into memory on their own.)"""
    parts = urlsplit(ws_url)
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(1)
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock


def test_slow_watcher_is_dropped_and_never_blocks_the_kernel_or_others(gateway: RunningGateway) -> None:
    from tests.integration.conftest import gateway_settings, start_gateway

    gw = start_gateway(
        gateway_settings(
            gateway_name=f"{gateway.settings.gateway_name}s", subscriber_queue=20, max_output_bytes=200_000_000
        )
    )
    try:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            url = f"{gw.ws_url}/v1/sessions/{sid}/ws"
            slow = _raw_ws_that_never_reads(url)
            try:
                with connect(url, max_size=None) as fast:
                    assert http.get(f"/v1/sessions/{sid}").json()["subscribers"] == 2
                    # 60 MB: far more than the socket buffers hold for the slow client
                    code = "for i in range(300):\n    print('x' * 200_000, flush=True)"
                    fast.send(json.dumps({"type": "execute", "code": code, "execution_id": "flood"}))
                    events = _until_done(fast, "flood")
                    assert events[-1]["status"] == "ok"
                    streamed = "".join(e["text"] for e in events if e["type"] == "stream")
                    assert len(streamed) == 300 * 200_001  # the fast watcher saw every line
                    # the slow one was dropped once its bounded backlog was full
                    assert http.get(f"/v1/sessions/{sid}").json()["subscribers"] == 1
                    assert run(http, sid, "1 + 1")["status"] == "ok"
            finally:
                slow.close()
    finally:
        gw.stop()


def test_code_over_the_limit_is_refused_like_over_rest(
    gateway: RunningGateway, http: httpx.Client, session_id: str
) -> None:
    code = "#" * (gateway.settings.max_code_bytes + 100)
    resp = http.post(f"/v1/sessions/{session_id}/execute", json={"code": code})
    assert resp.status_code == 413
    with connect(f"{gateway.ws_url}/v1/sessions/{session_id}/ws", max_size=None) as ws:
        ws.send(json.dumps({"type": "execute", "code": code, "execution_id": "big"}))
        event = json.loads(ws.recv(timeout=10))
        assert event["type"] == "protocol_error" and "limit" in event["message"]
        assert event["execution_id"] == "big"
