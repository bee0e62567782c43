"""A small synchronous Jupyter channels client, and the parse of a cell's messages into an `Output`.

The stock Kernel Gateway is driven with it (its REST API starts the kernel, its
``/api/kernels/{id}/channels`` WebSocket runs cells), the way any Jupyter
client would drive it."""

from __future__ import annotations

import json
import uuid
from typing import Any

from .base import Output, decode_png


def execute_request(code: str, session: str) -> tuple[str, dict[str, Any]]:
    """(msg_id, an execute_request for the channels WebSocket)."""
    msg_id = uuid.uuid4().hex
    header = {
        "msg_id": msg_id,
        "msg_type": "execute_request",
        "username": "bench",
        "session": session,
        "date": "2026-01-01T00:00:00.000000Z",
        "version": "5.3",
    }
    return msg_id, {
        "header": header,
        "parent_header": {},
        "metadata": {},
        "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False},
        "buffers": [],
    }


class CellCollector:
    """Feeds on a cell's iopub/shell messages; `done` once both the reply and the idle status came."""

    def __init__(self, msg_id: str) -> None:
        self.msg_id = msg_id
        self.out = Output()
        self._stdout: list[str] = []
        self._reply = self._idle = False

    @property
    def done(self) -> bool:
        return self._reply and self._idle

    def feed(self, msg: dict[str, Any]) -> None:
        if (msg.get("parent_header") or {}).get("msg_id") != self.msg_id:
            return
        kind = msg.get("msg_type") or (msg.get("header") or {}).get("msg_type")
        content = msg.get("content") or {}
        if kind == "stream" and content.get("name") == "stdout":
            self._stdout.append(content.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            data = content.get("data") or {}
            if "image/png" in data:
                self.out.images.append(decode_png(data["image/png"]))
            if kind == "execute_result":
                self.out.result = data.get("text/plain")
        elif kind == "error":
            self.out.error = content.get("ename")
            self.out.error_text = "\n".join(content.get("traceback") or []) or str(content.get("evalue", ""))
        elif kind == "execute_reply":
            self._reply = True
        elif kind == "status" and content.get("execution_state") == "idle":
            self._idle = True
        self.out.stdout = "".join(self._stdout)


def nodelay(ws: Any) -> None:
    """TCP_NODELAY on a websockets sync connection: without it, Nagle's algorithm and the
    peer's delayed ACK add ~40 ms to a small request/reply exchange (asyncio sets it itself)."""
    import socket

    ws.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class ChannelsClient:
    """One channels WebSocket to a kernel (websockets' sync client)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        from websockets.sync.client import connect

        self.session = uuid.uuid4().hex
        sep = "&" if "?" in url else "?"
        self.ws = connect(
            f"{url}{sep}session_id={self.session}",
            max_size=None,
            compression=None,
            additional_headers=headers or {},
        )
        nodelay(self.ws)

    def execute(self, code: str, timeout: float = 120) -> Output:
        msg_id, msg = execute_request(code, self.session)
        self.ws.send(json.dumps(msg))
        cell = CellCollector(msg_id)
        while not cell.done:
            cell.feed(json.loads(self.ws.recv(timeout=timeout)))
        return cell.out

    def close(self) -> None:
        self.ws.close()
