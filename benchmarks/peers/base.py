"""What a peer gives back for one cell, and the interface every peer implements."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class Output:
    """One cell's outcome, normalised across peers.

    ``result`` is the last expression's text/plain (None when the peer has no
    displayhook or drops it); ``images`` are the PNGs that came back, decoded;
    ``error`` is the exception's name when the peer reports one (None otherwise);
    ``error_text`` is whatever the peer said about it (a traceback, stderr)."""

    stdout: str = ""
    result: str | None = None
    images: list[bytes] = field(default_factory=list)
    error: str | None = None
    error_text: str = ""


def decode_png(data: str | bytes) -> bytes:
    """A PNG from a Jupyter bundle's base64 text (or raw bytes); b"" when it is not base64."""
    if isinstance(data, bytes):
        return data
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return b""


def is_png(data: bytes) -> bool:
    return data.startswith(PNG_SIGNATURE)


class Peer:
    """One system under test. Subclasses set the class attributes and implement the methods.

    ``one_plus_one`` is the cell each peer's `1+1` is measured with (a script-based
    peer has no displayhook, so it prints); ``stateful`` says whether a session
    keeps variables between runs (the trace's state turns fail otherwise)."""

    name: str = "?"
    one_plus_one: str = "1+1"
    stateful: bool = True
    setup: str = ""
    """How the peer was set up, for the report."""

    def start(self) -> None:
        """Open a session: after this, `run` works."""
        raise NotImplementedError

    def run(self, code: str) -> Output:
        raise NotImplementedError

    def stop(self) -> None:
        """Close the session and remove whatever `start` made."""
        raise NotImplementedError

    def container_ids(self) -> list[str]:
        """The containers the open session runs in (its limits are read from them)."""
        return []

    def version(self) -> str:
        return ""


def one_plus_one_ok(out: Output) -> bool:
    """`1+1` gave 2: as a result (REPL peers) or on stdout (script peers)."""
    if out.error:
        return False
    return (out.result or "").strip() == "2" or out.stdout.strip() == "2"


def error_name_from_text(text: str) -> str | None:
    """The exception's name from a traceback or stderr text: the last line that looks like
    ``Name: message`` (or a bare ``Name``) where Name ends in Error/Exception/Interrupt.
    ANSI colour codes (IPython's tracebacks) are removed first."""
    import re

    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    found = None
    for line in plain.splitlines():
        m = re.match(r"^\s*(?:ERROR:\s*)*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))\b(?::|\s|$)", line)
        if m:
            found = m.group(1).rsplit(".", 1)[-1]
    return found


def output_from_v1_events(events: list[dict[str, Any]]) -> Output:
    """kernelgw's /v1 events of one execution (through its ``done``) as an `Output`."""
    out = Output()
    stdout: list[str] = []
    for e in events:
        kind = e.get("type")
        if kind == "stream" and e.get("name") == "stdout":
            stdout.append(e.get("text", ""))
        elif kind in ("display", "result"):
            data = e.get("data") or {}
            if "image/png" in data:
                out.images.append(decode_png(data["image/png"]))
            if kind == "result":
                out.result = data.get("text/plain")
        elif kind == "error":
            out.error = e.get("ename")
            out.error_text = "\n".join(e.get("traceback_text") or e.get("traceback") or [])
        elif kind == "done" and e.get("status") not in ("ok", "error") and not out.error:
            out.error = f"done:{e.get('status')}"
            out.error_text = str(e.get("reason") or "")
    out.stdout = "".join(stdout)
    return out
