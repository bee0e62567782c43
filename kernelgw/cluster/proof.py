"""The proof a forwarded request carries: who forwarded it, when, and an HMAC
over both and the request line, keyed with the shared ``cluster_secret``.

The proof is also the hop marker: a request that carries a valid one is served
where it lands and never forwarded again (no loops, whatever the registry says).
The user's own credentials travel unchanged beside it; the owner authenticates
the user itself against the shared keys table.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

from kernelgw.cluster.errors import ForwardRefused

FROM_HEADER = "x-kernelgw-forwarded-by"
AT_HEADER = "x-kernelgw-forwarded-at"
PROOF_HEADER = "x-kernelgw-proof"
MAX_SKEW_S = 60.0
"""How far the forwarding gateway's clock may be from the owner's (and how long
a captured proof could be replayed for the same request line)."""


def sign(secret: bytes, sender: str, at: str, method: str, path: str) -> str:
    message = "\n".join(("kernelgw-forward-v1", sender, at, method.upper(), path)).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def proof_headers(secret: bytes, sender: str, method: str, path: str, now: float | None = None) -> dict[str, str]:
    """The headers that mark a request ``sender`` forwards (``path``: as the owner
    will see it, percent-decoded, without the query)."""
    at = f"{time.time() if now is None else now:.3f}"
    return {FROM_HEADER: sender, AT_HEADER: at, PROOF_HEADER: sign(secret, sender, at, method, path)}


def verify(
    secret: bytes | None, headers: Mapping[str, str], method: str, path: str, now: float | None = None
) -> str | None:
    """The forwarding gateway's name if ``headers`` (lower-case names) carry a
    valid proof; None if they carry none; `ForwardRefused` if one is invalid."""
    sender = headers.get(FROM_HEADER)
    if sender is None:
        return None
    if secret is None:
        raise ForwardRefused(
            f"This request was forwarded by gateway {sender!r}, but this gateway has no cluster_secret: "
            "give every gateway of the service the same KERNELGW_CLUSTER_SECRET."
        )
    at, proof = headers.get(AT_HEADER, ""), headers.get(PROOF_HEADER, "")
    try:
        age = (time.time() if now is None else now) - float(at)
    except ValueError:
        age = float("inf")
    if not hmac.compare_digest(sign(secret, sender, at, method, path), proof):
        raise ForwardRefused(
            f"This request claims to be forwarded by gateway {sender!r}, but its proof does not match: "
            "the gateways' KERNELGW_CLUSTER_SECRET values differ."
        )
    if abs(age) > MAX_SKEW_S:
        raise ForwardRefused(
            f"The request forwarded by gateway {sender!r} is {age:.0f} s old (at most {MAX_SKEW_S:g} s): "
            "the gateways' clocks disagree; keep them in step (NTP)."
        )
    return sender
