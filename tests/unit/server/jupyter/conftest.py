"""A real gateway (uvicorn on a loopback port) with keys required and two keys,
on kernel subprocesses (LocalBackend): the Jupyter face as clients meet it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection

from kernelgw.config import Settings
from kernelgw.storage import Store
from kernelgw.storage.keys import KeyStore
from tests.support.app import local_settings, serve_tcp
from tests.support.local_backend import LocalBackend

RECEIVE_TIMEOUT_S = 60  # a kernel subprocess on a loaded 2-core machine


@dataclass
class Gateway:
    address: str
    alice: str
    bob: str
    settings: Settings

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.address}"

    def client(self, key: str | None = None, scheme: str = "token") -> httpx.AsyncClient:
        headers = {"Authorization": f"{scheme} {key}"} if key else {}
        return httpx.AsyncClient(base_url=self.url, headers=headers, timeout=60)


async def make_keys(data_dir: Path, *names: str) -> list[str]:
    store = Store.from_settings(local_settings(data_dir))
    await store.start()
    try:
        return [(await KeyStore(store).create(name))[1] for name in names]
    finally:
        await store.close()


@asynccontextmanager
async def gateway(tmp_path: Path, backend: LocalBackend, **overrides: Any) -> AsyncIterator[Gateway]:
    data_dir = tmp_path / "gw"
    data_dir.mkdir()
    alice, bob = await make_keys(data_dir, "alice", "bob")
    settings = local_settings(data_dir, auth="required", **overrides)
    async with serve_tcp(settings, backend) as address:
        yield Gateway(address, alice, bob, settings)


@pytest.fixture
async def gw(local_backend: LocalBackend, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with gateway(tmp_path, local_backend) as g:
        yield g


@pytest.fixture
async def kernel(gw: Gateway) -> AsyncIterator[str]:
    """A kernel of alice's, started through POST /api/kernels."""
    async with gw.client(gw.alice) as http:
        resp = await http.post("/api/kernels", json={"name": "python3"})
        assert resp.status_code == 201, resp.text
        kid = str(resp.json()["id"])
        yield kid
        await http.delete(f"/api/kernels/{kid}")


# ---------------------------------------------------------------- a tiny Jupyter client
def request(msg_type: str, content: dict[str, Any], channel: str = "shell", session: str = "s1") -> dict[str, Any]:
    import uuid

    return {
        "channel": channel,
        "header": {
            "msg_id": uuid.uuid4().hex,
            "msg_type": msg_type,
            "session": session,
            "username": "test",
            "version": "5.3",
            "date": "2024-01-01T00:00:00.000000Z",
        },
        "parent_header": {},
        "metadata": {},
        "content": content,
        "buffers": [],
    }


def execute_request(code: str, **content: Any) -> dict[str, Any]:
    return request("execute_request", {"code": code, "silent": False, "store_history": True, **content})


async def receive_json(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(RECEIVE_TIMEOUT_S):
        frame = await ws.recv()
    assert isinstance(frame, str), "a legacy client gets JSON text frames"
    msg: dict[str, Any] = json.loads(frame)
    return msg


async def collect(ws: ClientConnection, msg_id: str, reply: bool = True) -> list[dict[str, Any]]:
    """Messages whose parent is ``msg_id`` until its ``status: idle`` (and its reply)."""
    got: list[dict[str, Any]] = []
    idle = replied = False
    while not (idle and (replied or not reply)):
        msg = await receive_json(ws)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        got.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
        if msg["msg_type"].endswith("_reply"):
            replied = True
    return got


def of_type(msgs: list[dict[str, Any]], msg_type: str) -> list[dict[str, Any]]:
    return [m for m in msgs if m["msg_type"] == msg_type]
