"""Which requests name a session, and which of those need the session's owner.

Every ``/v1/sessions/{id}...`` route (its WebSocket included) and every
``/api/kernels/{id}...`` route (the channels WebSocket included) names one.
Its history and notebook export are read from the shared store, so any
gateway answers them without forwarding, also while the owner is gone.

E2B's face names a sandbox (a session) two ways: its control plane in the path
(``/e2b/sandboxes/{id}...``, ``/e2b/v2/sandboxes/{id}...``), and sandbox
traffic (the code interpreter's ``/e2b/execute``, ``/e2b/contexts``, envd's
routes) in the ``E2b-Sandbox-Id`` header, as E2B's own edge routes it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Face = Literal["v1", "jupyter", "e2b"]

_SESSION = re.compile(r"^/v1/sessions/(?P<id>[^/]+)(?P<rest>/.*)?$")
_KERNEL = re.compile(r"^/api/kernels/(?P<id>[^/]+)(?P<rest>/.*)?$")
_SANDBOX = re.compile(r"^/e2b(?:/v2)?/(?:sandboxes|templates)/(?P<id>[^/]+)(?P<rest>/.*)?$")
"""A sandbox's control routes; and ``DELETE /templates/{id}``, which deletes a
snapshot (a session) by its id, as E2B's SDK does (a template's id names no
session: served where it lands)."""
_NOT_A_SANDBOX = frozenset({"metrics"})
"""``GET /e2b/sandboxes/metrics`` is about every sandbox of the key, not one named ``metrics``."""
_E2B_CONTROL = re.compile(r"^/e2b(?:/v2)?/(?:sandboxes|snapshots|templates)(?:/|$)")
"""The control plane's paths: never sandbox traffic, whatever their headers."""
SANDBOX_ID_HEADER = "e2b-sandbox-id"
"""Sandbox traffic names its sandbox here (lower case: as ASGI gives header names)."""
_E2B_CREATES = frozenset({"/e2b/sandboxes", "/e2b/v2/sandboxes"})
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

    @property
    def sandbox_traffic(self) -> bool:
        """An E2B request into the sandbox (named by header, carrying its access
        token rather than an API key), not one of the control plane."""
        return self.face == "e2b" and self.rest.startswith("/e2b/")


def session_route(path: str, headers: Mapping[str, str] | None = None) -> SessionRoute | None:
    """The session a request names, if any (``headers`` with lower-case names:
    E2B's sandbox traffic names it in one)."""
    for face, pattern in (("v1", _SESSION), ("jupyter", _KERNEL)):
        m = pattern.match(path)
        if m:
            return SessionRoute(m["id"], face, m["rest"] or "")  # type: ignore[arg-type]
    if not path.startswith("/e2b/"):
        return None
    m = _SANDBOX.match(path)
    if m:
        return None if m["id"] in _NOT_A_SANDBOX and not m["rest"] else SessionRoute(m["id"], "e2b", m["rest"] or "")
    sandbox_id = (headers or {}).get(SANDBOX_ID_HEADER, "").strip()
    if sandbox_id and not _E2B_CONTROL.match(path):
        return SessionRoute(sandbox_id, "e2b", path)
    return None


def create_face(method: str, path: str) -> Face | None:
    """The face of a request that creates a session (what placement decides)."""
    if method != "POST":
        return None
    path = path.rstrip("/") or "/"
    if path in _E2B_CREATES:
        return "e2b"
    return {"/v1/sessions": "v1", "/api/kernels": "jupyter"}.get(path)  # type: ignore[return-value]


def create_source_field(face: Face) -> str | None:
    """The field of a create's JSON body that may name a session the new one is
    made from (and so must be made where that one runs, its files on that host):
    /v1's ``from`` (a fork), E2B's ``templateID`` (a snapshot's id)."""
    return {"v1": "from", "e2b": "templateID"}.get(face)
