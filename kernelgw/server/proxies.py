"""Whose ``X-Forwarded-For`` is believed: the configured proxies' only.

A request's client address (logs of refused requests, access logs) is the TCP
peer's, unless that peer is one of ``trusted_proxies`` (IP addresses or CIDR
networks; none by default): then it is the rightmost address of
``X-Forwarded-For`` that is not itself a trusted proxy, and the scheme is
``X-Forwarded-Proto``'s. Anyone else's forwarding headers are ignored, loopback
clients' included (uvicorn's own handling, which trusts 127.0.0.1, is off).
A request forwarded by a peer gateway with a valid proof carries its client's
address too; `kernelgw.server.forward` believes that one.

A pure ASGI middleware, outermost, so every later check sees the same client.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from kernelgw.server.state import find_gateway_state

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_proxy(entry: str) -> Network:
    """One ``trusted_proxies`` entry; ValueError naming it when it is neither an
    address nor a network."""
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        raise ValueError(
            f"trusted_proxies: {entry!r} is not an IP address or a CIDR network (e.g. 10.0.0.5 or 10.0.0.0/8)"
        ) from None


class TrustedProxies:
    """The proxies whose forwarding headers are believed."""

    def __init__(self, entries: Iterable[str]) -> None:
        self.networks = tuple(parse_proxy(e) for e in entries)

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host.strip().strip("[]"))
        except ValueError:
            return False  # a unix socket's peer, a name: no address to match
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.networks)

    def client(self, peer: str, forwarded_for: Sequence[str]) -> str:
        """The client behind ``peer``: ``peer`` itself unless it is trusted; else
        the rightmost ``X-Forwarded-For`` hop that is not a trusted proxy (the
        leftmost when all are)."""
        if not self.trusts(peer):
            return peer
        hops = [h.strip() for value in forwarded_for for h in value.split(",") if h.strip()]
        for hop in reversed(hops):
            if not self.trusts(hop):
                return hop
        return hops[0] if hops else peer


_SCHEMES = {
    "http": {"http": "http", "https": "https", "ws": "http", "wss": "https"},
    "websocket": {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"},
}


class ProxyHeaders:
    """Rewrites ``scope["client"]`` and ``scope["scheme"]`` for requests from a trusted proxy."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._parsed: tuple[object, TrustedProxies] | None = None

    def _trusted(self, scope: Scope) -> TrustedProxies | None:
        state = find_gateway_state(scope["app"])
        if state is None or not state.settings.trusted_proxies:
            return None
        entries = state.settings.trusted_proxies
        if self._parsed is None or self._parsed[0] is not entries:
            self._parsed = (entries, TrustedProxies(entries))
        return self._parsed[1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client") if scope["type"] in _SCHEMES else None
        trusted = self._trusted(scope) if client else None
        if client and trusted is not None and trusted.trusts(str(client[0])):
            forwarded_for = [v.decode("latin-1") for k, v in scope["headers"] if k == b"x-forwarded-for"]
            if forwarded_for:
                scope["client"] = (trusted.client(str(client[0]), forwarded_for), 0)
            for name, value in scope["headers"]:
                if name == b"x-forwarded-proto":
                    proto = value.decode("latin-1").split(",")[-1].strip().lower()
                    if (scheme := _SCHEMES[scope["type"]].get(proto)) is not None:
                        scope["scheme"] = scheme
        await self.app(scope, receive, send)
