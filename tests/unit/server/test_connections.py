"""Connections that never finish their headers are closed (a held-out run held
1000 slow-header connections open indefinitely); requests whose headers arrived
run as long as they need. A real uvicorn with the gateway's options, raw sockets
as a slow client would use them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.support.app import local_settings, serve_tcp
from tests.support.local_backend import LocalBackend

DEADLINE_S = 0.5
GRACE_S = 20  # far above the deadline: a closed socket shows within it, a loaded machine or not


@pytest.fixture
async def gw(local_backend: LocalBackend, tmp_path: Path) -> AsyncIterator[str]:
    settings = local_settings(tmp_path, header_timeout_s=DEADLINE_S, keepalive_timeout_s=30)
    async with serve_tcp(settings, local_backend) as address:
        yield address


async def open_raw(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before closing (raises TimeoutError if it never closes)."""
    async with asyncio.timeout(GRACE_S):
        return await reader.read()


async def test_a_connection_that_never_finishes_its_headers_is_closed(gw: str) -> None:
    reader, writer = await open_raw(gw)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")  # no blank line: headers never end
    await writer.drain()
    assert await closed_by_server(reader) == b""
    writer.close()


async def test_dripping_header_bytes_does_not_extend_the_deadline(gw: str) -> None:
    reader, writer = await open_raw(gw)

    async def drip() -> None:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 1000:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(DEADLINE_S / 5)

    dripping = asyncio.create_task(drip())
    try:
        assert await closed_by_server(reader) == b""
    finally:
        dripping.cancel()
        writer.close()


async def test_an_idle_connection_after_a_response_is_closed_too(gw: str) -> None:
    """Keep-alive's own timer restarts at every byte; the header deadline re-arms
    after each response, so a kept-alive connection cannot drip either."""
    reader, writer = await open_raw(gw)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    writer.write(b"GET /healthz HTTP/1.1\r\n")  # a second request that never completes
    await writer.drain()
    rest = await closed_by_server(reader)
    assert b"HTTP/1.1" not in rest.split(b"\r\n\r\n", 1)[-1]  # nothing answered the partial request
    writer.close()


async def test_requests_and_websockets_that_outlive_the_deadline_are_not_cut(gw: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{gw}", timeout=60) as http:
        created = await http.post("/v1/sessions", json={})
        sid = created.json()["id"]
        try:
            # a cell longer than the deadline, then another on the same kept-alive connection
            slow = await http.post(
                f"/v1/sessions/{sid}/execute", json={"code": f"import time; time.sleep({DEADLINE_S * 3})"}
            )
            assert slow.status_code == 200 and slow.json()["status"] == "ok", slow.text
            again = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "print(1)"})
            assert again.json()["status"] == "ok"
            async with connect(f"ws://{gw}/v1/sessions/{sid}/ws") as ws:
                await asyncio.sleep(DEADLINE_S * 3)
                await ws.send('{"type": "execute", "code": "print(2)", "execution_id": "late"}')
                async with asyncio.timeout(60):
                    while True:
                        event = await ws.recv()
                        if '"done"' in str(event) and '"late"' in str(event):
                            break
        finally:
            await http.delete(f"/v1/sessions/{sid}")
