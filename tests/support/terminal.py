"""Reading an E2B terminal's output in tests (unit and integration alike)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def read_until(handle: Iterable[tuple[Any, Any, Any]], text: str) -> str:
    """What a sync handle's terminal printed, up to and with ``text``."""
    seen = b""
    for _, _, pty in handle:
        if pty:
            seen += pty
            if text.encode() in seen:
                return seen.decode(errors="replace")
    raise AssertionError(f"the terminal ended before printing {text!r}: {seen[-300:]!r}")
