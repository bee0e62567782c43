"""The /v1 output caps, applied to raw Jupyter messages from an untrusted kernel.

Per request (the parent ``msg_id``): stream text, display data, results and
errors count against ``max_output_bytes``; past it the rest of that request's
output is dropped and one ``stream`` message on stderr says so. Images over
``max_image_bytes`` are replaced by a note in the bundle. Errors are trimmed,
never dropped. (Comm messages are not counted: each is bounded by the
gateway's ZMQ message-size cap.)
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

import orjson

from kernelgw.runtime.iopub import cut_text

ERROR_MAX_BYTES = 64 * 1024
_BUNDLES = frozenset({"display_data", "execute_result", "update_display_data"})
_OUTPUT = _BUNDLES | {"stream", "clear_output", "error"}
_TRACKED = 256
"""Requests whose counts are kept (the oldest are forgotten)."""


def gateway_message(msg_type: str, parent: dict[str, Any], content: dict[str, Any]) -> dict[str, Any]:
    """A message the gateway itself sends a client (a note, a refusal)."""
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": msg_type,
        "session": "kernelgw",
        "username": "kernelgw",
        "date": datetime.now(UTC),
        "version": "5.3",
    }
    return {"header": header, "parent_header": parent, "metadata": {}, "content": content, "buffers": []}


def truncation_note(parent: dict[str, Any], text: str) -> dict[str, Any]:
    return gateway_message("stream", parent, {"name": "stderr", "text": f"\n[kernelgw: {text}]\n"})


def _bundle_size(content: dict[str, Any]) -> int:
    data = content.get("data") or {}
    size = (
        sum(len(v) if isinstance(v, str) else len(orjson.dumps(v)) for v in data.values())
        if isinstance(data, dict)
        else 0
    )
    metadata = content.get("metadata")
    return size + (len(orjson.dumps(metadata)) if metadata else 0)


def _error_size(content: dict[str, Any]) -> int:
    tb = content.get("traceback") or []
    return len(str(content.get("ename", ""))) + len(str(content.get("evalue", ""))) + sum(len(str(x)) for x in tb)


class OutputCaps:
    def __init__(self, max_output_bytes: int, max_image_bytes: int) -> None:
        self.max_output_bytes = max_output_bytes
        self.max_image_bytes = max_image_bytes
        self._used: OrderedDict[str, int] = OrderedDict()
        self._cut: set[str] = set()

    def _add(self, parent_id: str, size: int) -> int:
        used = self._used.pop(parent_id, 0) + size
        self._used[parent_id] = used
        while len(self._used) > _TRACKED:
            old, _ = self._used.popitem(last=False)
            self._cut.discard(old)
        return used

    def apply(self, msg: dict[str, Any]) -> list[dict[str, Any]]:
        """What to send the client instead of ``msg`` (itself, a changed copy, a note, nothing)."""
        msg_type = msg["header"].get("msg_type")
        if msg_type not in _OUTPUT:
            return [msg]
        parent = msg.get("parent_header") or {}
        parent_id = str(parent.get("msg_id") or "")
        content = msg.get("content") or {}
        if not isinstance(content, dict):
            return []
        if msg_type == "error":
            if _error_size(content) > ERROR_MAX_BYTES:
                part = ERROR_MAX_BYTES // 4
                tb = [str(x) for x in content.get("traceback") or []]
                tail = [cut_text(line, part // 20) for line in tb[-20:]]
                cut = len(tb) - len(tail)
                content = {
                    **content,
                    "ename": cut_text(str(content.get("ename", "")), 200),
                    "evalue": cut_text(str(content.get("evalue", "")), part),
                    "traceback": ([f"... [{cut} traceback lines cut]"] if cut else []) + tail,
                }
                msg = {**msg, "content": content}
            self._add(parent_id, _error_size(content))
            return [msg]
        if parent_id in self._cut:
            return []
        out: list[dict[str, Any]] = []
        if msg_type in _BUNDLES:
            data = content.get("data")
            if isinstance(data, dict):
                big = {
                    mime: len(v)
                    for mime, v in data.items()
                    if mime.startswith("image/") and isinstance(v, str) and len(v) > self.max_image_bytes
                }
                if big:
                    note = "; ".join(f"{mime} of {size} bytes" for mime, size in big.items())
                    data = {k: v for k, v in data.items() if k not in big}
                    data["text/plain"] = (
                        f"[{note} removed: larger than the gateway's image limit of {self.max_image_bytes} bytes]"
                    )
                    msg = {**msg, "content": {**content, "data": data}}
                    content = msg["content"]
            size = _bundle_size(content)
        elif msg_type == "stream":
            size = len(str(content.get("text", "")))
        else:
            size = 16  # clear_output: nothing shown, but 100,000 of them are still a flood
        if self._add(parent_id, size) > self.max_output_bytes:
            self._cut.add(parent_id)
            return [
                truncation_note(
                    parent,
                    f"output exceeded {self.max_output_bytes} bytes; the rest of this cell's output "
                    "was dropped (the code kept running)",
                )
            ]
        out.append(msg)
        return out
