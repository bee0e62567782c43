"""What a session carries for its clients beyond its kernel: free labels, a lease
and an access token's hash.

A face (E2B's, chiefly) gives them when it creates a session; the runtime keeps,
checks, persists and enforces them the same whatever face asked:

- ``metadata``: labels kept with the session (E2B's sandbox metadata), bounded
  so a session row stays small;
- a lease: the session ends, or pauses, at ``until`` unless it is extended
  (E2B's sandbox timeout). No lease runs while a session is paused;
- ``access_sha256``: the sha256 of a per-session token the face issued (E2B's
  ``envdAccessToken``). Only the hash is kept, in memory and in the store.

The checks here raise `BadRequest` (400) with what to change: they hold for
every face, whatever its own validation.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal, get_args

from kernelgw.errors import BadRequest, LimitExceeded
from kernelgw.models import RESERVED_METADATA_PREFIX

LeaseEnd = Literal["end", "pause"]
"""What a session does when its lease runs out."""
LEASE_ENDS: tuple[str, ...] = get_args(LeaseEnd)

LEASE_ENDED_REASON = "lease ended: its timeout ran out"
"""A session ended by its lease: its stored ``end_reason`` (a face says why a sandbox is gone)."""
LEASE_PAUSED_REASON = "lease ended: its timeout ran out, so it was paused"
"""What the audit log says of a session its lease paused."""

MAX_METADATA_ENTRIES = 64
"""A client's own labels per session (a face's reserved entries are not counted)."""
MAX_METADATA_KEY = 128
MAX_METADATA_VALUE = 1024
RESERVED_PREFIX = RESERVED_METADATA_PREFIX
"""Metadata keys a face keeps for itself (E2B's template, its token's nonce, a
snapshot's source): not a client's labels, so they do not count against
``MAX_METADATA_ENTRIES``, answers show only the labels (`labels`), and faces
refuse such keys from clients."""
MAX_RESERVED_ENTRIES = 16
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_reserved(key: str) -> bool:
    return key.startswith(RESERVED_PREFIX)


def labels(metadata: Mapping[str, str]) -> dict[str, str]:
    """A session's metadata as its clients see it: the faces' reserved entries left out."""
    return {k: v for k, v in metadata.items() if not is_reserved(k)}


def check_metadata(metadata: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``metadata`` if it fits the bounds; else `BadRequest` naming what does not."""
    reserved = sum(1 for k in metadata if isinstance(k, str) and is_reserved(k))
    if len(metadata) - reserved > MAX_METADATA_ENTRIES:
        raise BadRequest(
            f"metadata has {len(metadata) - reserved} entries; at most {MAX_METADATA_ENTRIES} are kept. "
            "Merge or drop some."
        )
    if reserved > MAX_RESERVED_ENTRIES:
        raise BadRequest(f"metadata has {reserved} of kernelgw's own entries; at most {MAX_RESERVED_ENTRIES}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_METADATA_KEY:
            shown = key[:40] + "..." if isinstance(key, str) and len(key) > 40 else key
            raise BadRequest(f"metadata key {shown!r} must be a string of 1 to {MAX_METADATA_KEY} characters")
        if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE:
            raise BadRequest(f"metadata[{key!r}] must be a string of at most {MAX_METADATA_VALUE} characters")
    return dict(metadata)


def check_lease_s(seconds: float, max_lease_s: float, *, now: bool = False) -> float:
    """``seconds`` if a lease may last that long (more than 0, at most the gateway's
    ``max_lease_s``); else `LimitExceeded` saying the range. With ``now``, 0 is
    accepted too: a lease moved to run out at once (E2B's ``set_timeout(0)``)."""
    low = "0 or more" if now else "more than 0"
    if not isinstance(seconds, int | float) or not (0 <= seconds if now else 0 < seconds) or seconds > max_lease_s:
        raise LimitExceeded(
            f"a session's timeout (lease) must be {low} and at most {max_lease_s:g} seconds "
            f"(the gateway's max_lease_s); got {seconds!r}. Ask for less, and extend it later if needed."
        )
    return float(seconds)


def check_lease_end(on_end: str) -> LeaseEnd:
    if on_end not in LEASE_ENDS:
        raise BadRequest(f"on_lease_end must be one of {list(LEASE_ENDS)}; got {on_end!r}")
    return "pause" if on_end == "pause" else "end"


def check_access_sha256(digest: str | None) -> str | None:
    """A sha256 hex digest (64 lowercase hex characters), or None."""
    if digest is not None and not _SHA256_HEX.fullmatch(digest):
        raise BadRequest("access_sha256 must be the sha256 of the access token, as 64 lowercase hex characters")
    return digest


def access_sha256(token: str) -> str:
    """What a session keeps of an access token (`SessionTerms.check_access` compares it)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def lease_until(seconds: float, now: datetime | None = None) -> datetime:
    """When a lease of ``seconds`` from ``now`` (default: now) runs out (UTC)."""
    return (now or datetime.now(UTC)) + timedelta(seconds=seconds)


@dataclass
class SessionTerms:
    """A session's labels, lease and access hash (`KernelSession` exposes them read-only)."""

    metadata: dict[str, str] = field(default_factory=dict)
    lease_until: datetime | None = None
    """When the lease runs out (UTC); None: no lease runs (none set, or paused)."""
    on_lease_end: LeaseEnd = "end"
    access_sha256: str | None = None

    def check_access(self, token: str) -> bool:
        """Whether ``token`` is the session's access token: its sha256 compared in
        constant time; False when the session has none."""
        if self.access_sha256 is None:
            return False
        return hmac.compare_digest(access_sha256(token), self.access_sha256)

    def lease_left_s(self, now: datetime) -> float | None:
        """Seconds until the lease runs out (0 or less: it has); None: no lease."""
        return None if self.lease_until is None else (self.lease_until - now).total_seconds()
