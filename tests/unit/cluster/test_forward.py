"""The forwarding middleware's pure parts: the create body read ahead for a
fork's or a snapshot's source and given again, the headers and URL a forwarded request gets,
errors in each face's shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.types import Message

from kernelgw.cluster import proof
from kernelgw.cluster.errors import OwnerGone
from kernelgw.server.forward import _create_source, _forward_headers, _upstream_url, refuse


def _receiver(chunks: list[bytes]) -> Any:
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return receive


async def _drain(receive: Any) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def test_a_fork_source_is_read_from_a_body_in_pieces_and_the_body_is_given_again() -> None:
    text = json.dumps({"from": "abc-123", "memory_mb": 512}).encode()
    receive, source = await _create_source(_receiver([text[:7], text[7:20], text[20:]]), limit=1000, field="from")
    assert source == "abc-123"
    assert await _drain(receive) == text


async def test_an_e2b_create_names_its_snapshot_in_template_id() -> None:
    text = json.dumps({"templateID": "snap-1", "timeout": 300, "from": "ignored"}).encode()
    receive, source = await _create_source(_receiver([text]), limit=1000, field="templateID")
    assert source == "snap-1"
    assert await _drain(receive) == text


@pytest.mark.parametrize(
    "body", [b"{}", b'{"from": null}', b'{"from": 5}', b"not json", b"[1]", b'{"notebook": {"cells": []}}']
)
async def test_bodies_without_a_fork_source_are_passed_on_unchanged(body: bytes) -> None:
    receive, source = await _create_source(_receiver([body]), limit=1000, field="from")
    assert source is None
    assert await _drain(receive) == body


async def test_a_body_over_the_limit_is_not_parsed_but_still_given_whole() -> None:
    chunks = [b'{"from": "x", "pad": "', b"a" * 50, b'"}']
    receive, source = await _create_source(_receiver(chunks), limit=30, field="from")
    assert source is None
    assert await _drain(receive) == b"".join(chunks)


class _Cluster:
    name = "gw-a"

    def sign(self, method: str, path: str) -> dict[str, str]:
        return proof.proof_headers(b"s", self.name, method, path, now=1.0)


def test_forwarded_headers_keep_credentials_drop_hop_by_hop_and_carry_the_proof() -> None:
    scope = {
        "type": "http",
        "path": "/v1/sessions/x/execute",
        "client": ("10.0.0.9", 5555),
        "scheme": "http",
        "headers": [
            (b"host", b"lb.example"),
            (b"origin", b"https://chat.example"),
            (b"authorization", b"Bearer kgw_k"),
            (b"connection", b"keep-alive"),
            (b"content-type", b"application/json"),
            (b"x-kernelgw-proof", b"forged"),
            (b"x-forwarded-for", b"1.2.3.4"),
        ],
    }
    from kernelgw.server.forward import _HOP_BY_HOP

    headers = dict(_forward_headers(_Cluster(), scope, "POST", _HOP_BY_HOP))  # type: ignore[arg-type]
    assert headers["authorization"] == "Bearer kgw_k" and headers["content-type"] == "application/json"
    assert "host" not in headers and "origin" not in headers and "connection" not in headers
    assert headers["x-forwarded-for"] == "10.0.0.9" and headers["x-forwarded-host"] == "lb.example"
    assert proof.verify(b"s", headers, "POST", "/v1/sessions/x/execute", now=1.0) == "gw-a"


def test_the_upstream_url_keeps_the_raw_path_and_query() -> None:
    scope = {"path": "/v1/sessions/x/files/a b", "raw_path": b"/v1/sessions/x/files/a%20b", "query_string": b"q=1"}
    assert _upstream_url("http://10.0.0.5:8000", scope) == "http://10.0.0.5:8000/v1/sessions/x/files/a%20b?q=1"
    assert _upstream_url("https://gw", scope, websocket=True).startswith("wss://gw/v1/")


async def _answer(path: str, kind: str = "http") -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await refuse({"type": kind, "path": path}, receive, send, OwnerGone("gateway 'gw-b' is gone"))
    return sent


async def test_a_gone_owner_is_a_503_in_each_faces_shape() -> None:
    v1 = await _answer("/v1/sessions/x")
    assert v1[0]["status"] == 503 and (b"retry-after", b"5") in v1[0]["headers"]
    assert json.loads(v1[1]["body"]) == {"error": {"code": "owner_gone", "message": "gateway 'gw-b' is gone"}}
    jupyter = await _answer("/api/kernels/x")
    assert json.loads(jupyter[1]["body"]) == {"message": "gateway 'gw-b' is gone", "reason": "Service Unavailable"}
    e2b = await _answer("/e2b/execute")
    assert e2b[0]["status"] == 503 and (b"retry-after", b"5") in e2b[0]["headers"]
    assert json.loads(e2b[1]["body"]) == {"code": 503, "message": "gateway 'gw-b' is gone", "error_code": "owner_gone"}
    ws = await _answer("/v1/sessions/x/ws", "websocket")
    assert ws[0]["type"] == "websocket.accept"
    assert ws[1] == {"type": "websocket.close", "code": 1013, "reason": "gateway 'gw-b' is gone"}
