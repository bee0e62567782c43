"""The Jupyter wire format as the shim and its fd relay handle it: frames split
at the delimiter, compact JSON, and headers of the messages they make
themselves (a fence's probe, a relayed stream). Standard library only."""

from __future__ import annotations

import json
import time
from typing import Any

DELIM = b"<IDS|MSG>"


def split(frames: list[bytes]) -> int | None:
    """Index of the delimiter in a multipart message that has the four parts
    after its signature; None when it is not one."""
    try:
        i = frames.index(DELIM)
    except ValueError:
        return None
    return i if len(frames) >= i + 6 else None


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def is_idle(frames: list[bytes], i: int) -> bool:
    """Whether the message (delimiter at ``i``) is a status ``idle``."""
    try:
        header, content = json.loads(frames[i + 2]), json.loads(frames[i + 5])
    except ValueError:
        return False
    return (
        isinstance(header, dict)
        and header.get("msg_type") == "status"
        and isinstance(content, dict)
        and content.get("execution_state") == "idle"
    )


def own_header(msg_id: str, msg_type: str, session: str) -> dict[str, str]:
    """The header of a message the shim itself sends (as user ``kernelgw``)."""
    return {
        "msg_id": msg_id,
        "msg_type": msg_type,
        "username": "kernelgw",
        "session": session,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
        "version": "5.3",
    }
