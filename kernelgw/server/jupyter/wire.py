"""The channels WebSocket's two framings, both ways.

* JSON text frames (the legacy protocol; what jupyter_server's gateway client,
  Open WebUI and most scripts speak): one message as a JSON object carrying
  ``channel``, ``header``, ``parent_header``, ``metadata``, ``content``, and
  ``msg_id``/``msg_type`` copied to the top level. A message with binary
  buffers goes out in the legacy binary format (offsets then JSON then
  buffers), as jupyter_server sends it.
* ``v1.kernel.websocket.jupyter.org`` (JupyterLab 4): a binary frame of
  little-endian 64-bit offsets, the channel name, then header, parent header,
  metadata, content and buffers (jupyter_server's ``serialize_msg_to_ws_v1``).

Incoming frames are parsed into a `ClientMessage` or rejected with
`WireError`; nothing a client sends is trusted further than this module checks.
"""

from __future__ import annotations

import itertools
import json
import struct
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from jupyter_client.jsonutil import json_default

V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"

CLIENT_CHANNELS = ("shell", "control", "stdin")
SHELL_REQUESTS = frozenset(
    {
        "execute_request",
        "inspect_request",
        "complete_request",
        "history_request",
        "is_complete_request",
        "comm_info_request",
        "kernel_info_request",
        "comm_open",
        "comm_msg",
        "comm_close",
    }
)
CONTROL_REQUESTS = frozenset(
    {
        "kernel_info_request",
        "interrupt_request",
        "debug_request",
        "usage_request",
        # kernel subshells (protocol 5.5, ipykernel 7): JupyterLab's widget manager asks for
        # one when the kernel offers them, and waits for the answer before drawing widgets
        "create_subshell_request",
        "delete_subshell_request",
        "list_subshell_request",
    }
)
"""``shutdown_request`` is not among them: the kernel is stopped with
``DELETE /api/kernels/{id}`` (and restarted with its ``/restart``), so the
session notices; a kernel that exits under it would just look dead."""
STDIN_REPLIES = frozenset({"input_reply"})
ALLOWED = {"shell": SHELL_REQUESTS, "control": CONTROL_REQUESTS, "stdin": STDIN_REPLIES}
MAX_BUFFERS = 64
MAX_HEADER_STRING = 256
"""The longest ``msg_id``, ``msg_type`` and ``session`` taken (they are stored with cells)."""


class WireError(ValueError):
    """A frame that is not a well-formed client message (it is dropped)."""


@dataclass
class ClientMessage:
    channel: str
    header: dict[str, Any]
    parent_header: dict[str, Any]
    metadata: dict[str, Any]
    content: dict[str, Any]
    buffers: list[bytes] = field(default_factory=list)

    @property
    def msg_id(self) -> str:
        return str(self.header["msg_id"])

    @property
    def msg_type(self) -> str:
        return str(self.header["msg_type"])

    def to_zmq(self) -> dict[str, Any]:
        """The dict jupyter_client's ``Session.send`` signs and sends as it is."""
        return {
            "header": self.header,
            "msg_id": self.msg_id,
            "msg_type": self.msg_type,
            "parent_header": self.parent_header,
            "metadata": self.metadata,
            "content": self.content,
            "buffers": self.buffers,
        }


def _dict(value: Any, what: str, default_empty: bool = True) -> dict[str, Any]:
    if value is None and default_empty:
        return {}
    if not isinstance(value, dict):
        raise WireError(f"{what} must be an object")
    return value


def validate(
    channel: Any, header: Any, parent_header: Any, metadata: Any, content: Any, buffers: list[bytes]
) -> ClientMessage:
    """A client message, or `WireError` saying what is wrong with it."""
    if channel is None:
        channel = "shell"  # as jupyter_server assumes
    if channel not in CLIENT_CHANNELS:
        raise WireError(f"unknown or read-only channel {str(channel)[:40]!r}; clients send on shell, control, stdin")
    head = dict(_dict(header, "header", default_empty=False))
    msg_type = head.get("msg_type")
    if not isinstance(msg_type, str) or not msg_type or len(msg_type) > MAX_HEADER_STRING:
        raise WireError("header.msg_type must be a non-empty string")
    if msg_type not in ALLOWED[channel]:
        raise WireError(f"{msg_type[:60]!r} is not accepted on the {channel} channel")
    # Jupyter Server passes the header on unchecked; only what the gateway relies on
    # is checked: a msg_id ties replies and cells to this request, so a client that
    # sends none (or "") gets one of ours, and header.session is echoed, never used
    # (Enterprise Gateway's GatewayClient sends "session": "")
    msg_id = head.get("msg_id")
    if msg_id is None or msg_id == "":
        head["msg_id"] = uuid.uuid4().hex
    elif not isinstance(msg_id, str) or len(msg_id) > MAX_HEADER_STRING:
        raise WireError(f"header.msg_id must be a string of at most {MAX_HEADER_STRING} characters")
    if head.get("session") is None:
        head["session"] = ""
    session = head["session"]
    if not isinstance(session, str) or len(session) > MAX_HEADER_STRING:
        raise WireError(f"header.session must be a string of at most {MAX_HEADER_STRING} characters")
    # AutoGen and others send dates without a timezone; jupyter_client needs a string or datetime
    date = head.get("date")
    if date is not None and not isinstance(date, (str, datetime)):
        raise WireError("header.date must be a string")
    head.setdefault("username", "")
    head.setdefault("version", "5.3")
    if len(buffers) > MAX_BUFFERS:
        raise WireError(f"at most {MAX_BUFFERS} buffers")
    return ClientMessage(
        channel=channel,
        header=head,
        parent_header=_dict(parent_header, "parent_header"),
        metadata=_dict(metadata, "metadata"),
        content=_dict(content, "content"),
        buffers=buffers,
    )


# ------------------------------------------------------------------ incoming
def parse_text(text: str) -> ClientMessage:
    """A JSON text frame (legacy protocol)."""
    try:
        msg = orjson.loads(text)
    except ValueError:
        raise WireError("not valid JSON") from None
    if not isinstance(msg, dict):
        raise WireError("a message must be a JSON object")
    # "buffers": {} (AutoGen) or [] mean none; binary buffers come in binary frames
    buffers = msg.get("buffers")
    if buffers:
        raise WireError("buffers in a JSON text frame are not supported; send a binary frame")
    return validate(
        msg.get("channel"), msg.get("header"), msg.get("parent_header"), msg.get("metadata"), msg.get("content"), []
    )


def parse_legacy_binary(data: bytes) -> ClientMessage:
    """The legacy binary frame: big-endian count and offsets, JSON, buffers."""
    try:
        (count,) = struct.unpack("!I", data[:4])
        if not 1 <= count <= MAX_BUFFERS + 1 or len(data) < 4 * (count + 1):
            raise WireError("bad offsets")
        offsets = [*struct.unpack("!" + "I" * count, data[4 : 4 * (count + 1)]), len(data)]
        parts = [data[a:b] for a, b in itertools.pairwise(offsets)]
        if any(b < a for a, b in itertools.pairwise(offsets)) or offsets[0] < 4 * (count + 1):
            raise WireError("bad offsets")
        msg = orjson.loads(parts[0])  # bytes: orjson checks the UTF-8 itself
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"malformed binary message ({exc})") from None
    if not isinstance(msg, dict):
        raise WireError("a message must be a JSON object")
    return validate(
        msg.get("channel"),
        msg.get("header"),
        msg.get("parent_header"),
        msg.get("metadata"),
        msg.get("content"),
        parts[1:],
    )


def parse_v1(data: bytes) -> ClientMessage:
    """A ``v1.kernel.websocket.jupyter.org`` binary frame."""
    try:
        count = int.from_bytes(data[:8], "little")
        if not 6 <= count <= MAX_BUFFERS + 6 or len(data) < 8 * (count + 1):
            raise WireError("bad offsets")
        offsets = [int.from_bytes(data[8 * (i + 1) : 8 * (i + 2)], "little") for i in range(count)]
        if offsets[0] != 8 * (count + 1) or offsets[-1] > len(data):
            raise WireError("bad offsets")
        if any(b < a for a, b in itertools.pairwise(offsets)):
            raise WireError("bad offsets")
        parts = [data[offsets[i] : offsets[i + 1]] for i in range(count - 1)]
        channel = parts[0].decode("utf-8")
        header, parent, metadata, content = (orjson.loads(p) if p else {} for p in parts[1:5])
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"malformed v1 message ({exc})") from None
    return validate(channel, header, parent, metadata, content, [bytes(b) for b in parts[5:]])


# ------------------------------------------------------------------ outgoing
def _pack(obj: Any) -> bytes:
    return json.dumps(obj, default=json_default, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")


def to_json_frame(channel: str, msg: dict[str, Any]) -> str | bytes:
    """A kernel message for a legacy client: JSON text, or the legacy binary
    format when it carries buffers."""
    header = msg["header"]
    out = {
        "channel": channel,
        "header": header,
        "msg_id": header.get("msg_id", ""),
        "msg_type": header.get("msg_type", ""),
        "parent_header": msg.get("parent_header") or {},
        "metadata": msg.get("metadata") or {},
        "content": msg.get("content") or {},
    }
    buffers = [bytes(b) for b in msg.get("buffers") or ()]
    if not buffers:
        out["buffers"] = []
        return json.dumps(out, default=json_default, ensure_ascii=False)
    parts = [_pack(out), *buffers]
    offsets = [4 * (len(parts) + 1)]
    for part in parts[:-1]:
        offsets.append(offsets[-1] + len(part))
    return struct.pack("!" + "I" * (len(parts) + 1), len(parts), *offsets) + b"".join(parts)


def to_v1_frame(channel: str, msg: dict[str, Any]) -> bytes:
    """A kernel message for a ``v1.kernel.websocket.jupyter.org`` client."""
    parts = [
        channel.encode("utf-8"),
        _pack(msg["header"]),
        _pack(msg.get("parent_header") or {}),
        _pack(msg.get("metadata") or {}),
        _pack(msg.get("content") or {}),
        *(bytes(b) for b in msg.get("buffers") or ()),
    ]
    offsets = [8 * (len(parts) + 2)]
    for part in parts:
        offsets.append(offsets[-1] + len(part))
    head = len(offsets).to_bytes(8, "little") + b"".join(o.to_bytes(8, "little") for o in offsets)
    return head + b"".join(parts)
