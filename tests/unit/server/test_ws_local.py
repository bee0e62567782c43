"""The WebSocket on real kernel subprocesses, without an engine: a real uvicorn
server on a loopback port in this test's event loop, and the `websockets`
client, as a chat UI would connect (tests/integration/test_websocket.py repeats
the essentials on Docker)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.support.app import local_settings, serve_tcp
from tests.support.local_backend import LocalBackend

RECEIVE_TIMEOUT_S = 60  # a kernel subprocess on a loaded 2-core machine


@pytest.fixture
async def gw(local_backend: LocalBackend, tmp_path: Path) -> AsyncIterator[str]:
    async with serve_tcp(local_settings(tmp_path), local_backend) as address:
        yield address


@pytest.fixture
async def sid(gw: str) -> AsyncIterator[str]:
    async with httpx.AsyncClient(base_url=f"http://{gw}", timeout=60) as http:
        resp = await http.post("/v1/sessions", json={})
        assert resp.status_code == 201, resp.text
        session_id = str(resp.json()["id"])
        yield session_id
        await http.delete(f"/v1/sessions/{session_id}")


async def next_event(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(RECEIVE_TIMEOUT_S):
        return json.loads(await ws.recv())


async def until_done(ws: ClientConnection, execution_id: str) -> list[dict[str, Any]]:
    """Events of ``execution_id`` up to and including its ``done``."""
    events = []
    while True:
        event = await next_event(ws)
        if event.get("execution_id") == execution_id:
            events.append(event)
            if event["type"] == "done":
                return events


async def execute(ws: ClientConnection, code: str, execution_id: str) -> None:
    await ws.send(json.dumps({"type": "execute", "code": code, "execution_id": execution_id}))


async def test_events_stream_in_order_and_end_with_one_done(gw: str, sid: str) -> None:
    async with connect(f"ws://{gw}/v1/sessions/{sid}/ws") as ws:
        await execute(ws, "x = 41\nprint('hi')\nx + 1", "c1")
        events = await until_done(ws, "c1")
    types = [e["type"] for e in events]
    assert types[0] == "queued" and types[-1] == "done" and types.count("done") == 1
    assert ("status", "busy") in [(e["type"], e.get("state")) for e in events]
    assert "".join(e["text"] for e in events if e["type"] == "stream") == "hi\n"
    (result,) = [e for e in events if e["type"] == "result"]
    assert result["data"]["text/plain"] == "42"
    done = events[-1]
    assert done["status"] == "ok" and done["execution_count"] == 1
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_every_watcher_sees_every_event_and_a_reconnect_resumes_after_last_seq(gw: str, sid: str) -> None:
    url = f"ws://{gw}/v1/sessions/{sid}/ws"
    async with connect(url) as runner, connect(url) as watcher:
        await execute(runner, "print('one')", "a")
        seen_by_runner = await until_done(runner, "a")
        seen_by_watcher = await until_done(watcher, "a")
    assert seen_by_watcher == seen_by_runner
    middle = seen_by_runner[1]["seq"]
    async with connect(f"{url}?last_seq={middle}") as late:
        replayed = await until_done(late, "a")
    assert replayed == [e for e in seen_by_runner if e["seq"] > middle]


async def test_a_malformed_message_gets_a_protocol_error_and_the_socket_stays_open(gw: str, sid: str) -> None:
    async with connect(f"ws://{gw}/v1/sessions/{sid}/ws") as ws:
        await ws.send("{not json")
        error = await next_event(ws)
        assert error["type"] == "protocol_error" and "not valid JSON" in error["message"]
        await ws.send(json.dumps({"type": "execute"}))
        error = await next_event(ws)
        assert error["type"] == "protocol_error" and "code" in error["message"]
        await execute(ws, "print('still here')", "after")
        events = await until_done(ws, "after")
    assert events[-1]["status"] == "ok"
    assert "".join(e["text"] for e in events if e["type"] == "stream") == "still here\n"


async def test_interrupt_over_the_socket_ends_the_running_cell(gw: str, sid: str) -> None:
    async with connect(f"ws://{gw}/v1/sessions/{sid}/ws") as ws:
        await execute(ws, "import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.05)", "loop")
        while True:  # interrupt once the cell is really running, not before
            event = await next_event(ws)
            if event["type"] == "stream" and "started" in event["text"]:
                break
        await ws.send(json.dumps({"type": "interrupt"}))
        events = await until_done(ws, "loop")
        assert events[-1]["status"] == "interrupted"
        await execute(ws, "print('next')", "next")
        assert (await until_done(ws, "next"))[-1]["status"] == "ok"


async def test_unknown_session_and_foreign_origin_get_their_close_codes(gw: str, sid: str) -> None:
    async with connect(f"ws://{gw}/v1/sessions/nope/ws") as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await next_event(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404
    async with connect(f"ws://{gw}/v1/sessions/{sid}/ws", origin="http://evil.example") as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await next_event(ws)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
