"""Which requests name a session, and which of those need the session's owner.

Every ``/v1/sessions/{id}...`` route (its WebSocket included) and every
``/api/kernels/{id}...`` route (the channels WebSocket included) names one.
Its history and notebook export are read from the shared store, so any
gateway answers them without forwarding, also while the owner is gone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Face = Literal["v1", "jupyter"]

_SESSION = re.compile(r"^/v1/sessions/(?P<id>[^/]+)(?P<rest>/.*)?$")
_KERNEL = re.compile(r"^/api/kernels/(?P<id>[^/]+)(?P<rest>/.*)?$")
_HEX_ID = re.compile(r"[0-9a-fA-F]{32}")
_STORE_ONLY = ("/history", "/notebook")
"""Routes served from the store alone (on any gateway): GET only."""


@dataclass(frozen=True)
class SessionRoute:
    session_id: str
    face: Face
    rest: str
    """What follows the id (``/execute``, ``/ws``, ``""``)."""

    def candidate_ids(self) -> list[str]:
        """The ids the session may be stored under: Jupyter shows a 32-hex id dashed."""
        compact = self.session_id.replace("-", "")
        if compact != self.session_id and _HEX_ID.fullmatch(compact):
            return [self.session_id, compact]
        return [self.session_id]

    def from_store(self, method: str) -> bool:
        return self.face == "v1" and method == "GET" and self.rest in _STORE_ONLY


def session_route(path: str) -> SessionRoute | None:
    """The session a request path names, if any."""
    for face, pattern in (("v1", _SESSION), ("jupyter", _KERNEL)):
        m = pattern.match(path)
        if m:
            return SessionRoute(m["id"], face, m["rest"] or "")  # type: ignore[arg-type]
    return None


def create_face(method: str, path: str) -> Face | None:
    """The face of a request that creates a session (what placement decides)."""
    if method != "POST":
        return None
    return {"/v1/sessions": "v1", "/api/kernels": "jupyter"}.get(path.rstrip("/") or "/")  # type: ignore[return-value]
