"""E2B's list query: the ``metadata`` filter as the SDK encodes it, ``state``,
and pages by ``limit`` and ``nextToken``.

The token is the position of the page's last sandbox (start time, then id),
base64-encoded: stateless, and stable when sandboxes come and go between pages
(none is given twice, none that stays is skipped).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from urllib.parse import parse_qsl, unquote

import orjson

from kernelgw.cluster.listing import RemoteSession
from kernelgw.keys import Principal
from kernelgw.server.e2b.errors import E2BError
from kernelgw.server.e2b.models import ListedSandbox
from kernelgw.server.e2b.wire import SNAPSHOT_OF_KEY, is_snapshot, listed, listed_remote, utc
from kernelgw.server.state import GatewayState

DEFAULT_LIMIT = 100
"""E2B's page size (also its maximum)."""
STATES = frozenset({"running", "paused"})


def parse_metadata_query(text: str) -> dict[str, str]:
    """E2B's ``metadata`` filter: ``k=v&k2=v2``, each key and value URL-encoded
    (once more than the query string itself: the SDK quotes them, then encodes the pairs)."""
    try:
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise E2BError(400, f"metadata: {text[:200]!r} is not a query of key=value pairs joined by '&'") from None
    return {unquote(k): unquote(v) for k, v in pairs}


def parse_states(text: str | None) -> frozenset[str]:
    """``state=running,paused`` (both when absent)."""
    if not text:
        return STATES
    states = frozenset(s.strip() for s in text.split(",") if s.strip())
    wrong = sorted(states - STATES)
    if wrong or not states:
        raise E2BError(400, f"state: {', '.join(wrong) or text!r} is not a sandbox state (running, paused)")
    return states


@dataclass(frozen=True)
class Cursor:
    """Where a page ends: ``nextToken`` is this, base64-encoded (stateless and stable)."""

    started_at: datetime
    sandbox_id: str

    def encode(self) -> str:
        raw = orjson.dumps([self.started_at.isoformat(), self.sandbox_id])
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    @classmethod
    def decode(cls, token: str) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            started, sandbox_id = orjson.loads(raw)
            return cls(utc(datetime.fromisoformat(started)), str(sandbox_id))
        except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
            raise E2BError(400, f"nextToken {token[:80]!r} is not a token a previous page gave") from None


def paginate(
    items: Iterable[ListedSandbox], order: Literal["asc", "desc"], cursor: Cursor | None, limit: int
) -> tuple[list[ListedSandbox], str | None]:
    """One page of ``items`` sorted by start time (then id), after ``cursor``;
    and the next page's token (None when this one is the last)."""
    reverse = order == "desc"
    ordered = sorted(items, key=lambda s: (s.started_at, s.sandbox_id), reverse=reverse)
    if cursor is not None:
        mark = (cursor.started_at, cursor.sandbox_id)
        ordered = [
            s
            for s in ordered
            if ((s.started_at, s.sandbox_id) < mark if reverse else (s.started_at, s.sandbox_id) > mark)
        ]
    page = ordered[:limit]
    if len(ordered) > limit:
        last = page[-1]
        return page, Cursor(last.started_at, last.sandbox_id).encode()
    return page, None


def filtered(
    state: GatewayState,
    principal: Principal,
    metadata: dict[str, str],
    states: frozenset[str],
    started_after: datetime | None,
    template: str | None,
    remote: Iterable[RemoteSession] = (),
) -> list[ListedSandbox]:
    """The sandboxes ``principal`` may see that match every filter given: this
    gateway's, and ``remote``, other gateways' as their store rows show them."""
    every = [listed(s, state) for s in state.manager.list(principal) if not is_snapshot(s)]
    every += [listed_remote(r, state.settings) for r in remote if SNAPSHOT_OF_KEY not in r.metadata]
    after = utc(started_after) if started_after is not None else None
    return [
        s
        for s in every
        if s.state in states
        and all(s.metadata.get(k) == v for k, v in metadata.items())
        and (after is None or s.started_at >= after)
        and (template is None or s.template_id == template)
    ]
