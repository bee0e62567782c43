"""Which web pages may reach the gateway, checked on every route and WebSocket.

Two attacks by a page the user merely visits, against a gateway on their machine:

- **DNS rebinding**: the page's own name is made to resolve to 127.0.0.1, so the
  browser sends it requests it considers same-origin (``Host: evil.example``).
  Only names the gateway answers to are accepted in ``Host``; an IP address is
  always accepted, since a page that uses one is not rebinding a name.
- **Cross-site requests**: a page on another origin posts to the gateway, or
  opens its WebSocket (browsers do not apply CORS to WebSockets). A request
  that carries an ``Origin`` must come from the gateway's own origin or an
  allowed one. Clients that send no ``Origin`` (SDKs, agents, curl) pass.

A pure ASGI middleware: it runs before routing, so no route can forget it, and
costs a scan of the headers.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from kernelgw.config import Settings
from kernelgw.server.state import find_gateway_state

CLOSE_FORBIDDEN = 4403
"""WebSocket close code of a refused page (after accepting: browsers never show a
refused handshake's status)."""

WILDCARD_BINDS = {"", "0.0.0.0", "::"}


def host_name(host_header: str) -> str | None:
    """The name or address of a ``Host`` header, lowercased, without port and
    brackets; None when it does not parse."""
    try:
        name = urlsplit("//" + host_header).hostname
    except ValueError:
        return None
    return name.rstrip(".") if name else None


def is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def default_hosts(bind_host: str) -> list[str]:
    """``localhost`` and its subdomains (browsers resolve them to loopback
    themselves), this machine's name and the listen address when it is a name."""
    names = ["localhost", "*.localhost", socket.gethostname().lower()]
    if bind_host not in WILDCARD_BINDS and not is_ip_address(bind_host):
        names.append(bind_host.lower())
    return names


@dataclass(frozen=True)
class PagePolicy:
    """The allowed ``Host`` names and ``Origin`` values, parsed once."""

    any_host: bool
    names: frozenset[str]
    suffixes: tuple[str, ...]
    any_origin: bool
    origins: frozenset[str]

    @classmethod
    def from_settings(cls, settings: Settings) -> PagePolicy:
        hosts = settings.allowed_hosts if settings.allowed_hosts is not None else default_hosts(settings.host)
        patterns = [h.strip().lower().rstrip(".") for h in hosts]
        return cls(
            any_host="*" in patterns,
            names=frozenset(p for p in patterns if not p.startswith("*")),
            suffixes=tuple(p[1:] for p in patterns if p.startswith("*.")),
            any_origin="*" in settings.allowed_origins,
            origins=frozenset(o.rstrip("/").lower() for o in settings.allowed_origins),
        )

    def host_allowed(self, host_header: str | None) -> bool:
        if self.any_host or host_header is None:
            return True  # HTTP/1.0 without Host is no browser
        name = host_name(host_header)
        if name is None:
            return False
        return is_ip_address(name) or name in self.names or name.endswith(self.suffixes)

    def origin_allowed(self, origin: str | None, host_header: str | None) -> bool:
        """Same origin (the page was served by this gateway under an allowed
        Host) or an allowed one; no Origin at all is not a browser page."""
        if origin is None or self.any_origin:
            return True
        if origin.rstrip("/").lower() in self.origins:
            return True
        try:
            netloc = urlsplit(origin).netloc
        except ValueError:
            return False
        return bool(host_header) and netloc.lower() == (host_header or "").lower()


class PageGuard:
    """Refuses requests and WebSockets from pages the gateway does not serve:
    400 ``host_not_allowed``, 403 ``origin_not_allowed``, WebSocket close 4403."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._policy: tuple[Settings, PagePolicy] | None = None

    def policy(self, scope: Scope) -> PagePolicy | None:
        state = find_gateway_state(scope["app"])
        if state is None:
            return None  # no lifespan yet (or no gateway): nothing to serve either
        if self._policy is None or self._policy[0] is not state.settings:
            self._policy = (state.settings, PagePolicy.from_settings(state.settings))
        return self._policy[1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        policy = self.policy(scope)
        if policy is None:
            await self.app(scope, receive, send)
            return
        host = origin = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
        if not policy.host_allowed(host):
            message = (
                f"This gateway does not answer to the name {host!r} (the Host header), which protects it from "
                "web pages that rebind their own name to its address. If it is one of the gateway's names, add "
                "it to the setting allowed_hosts (KERNELGW_ALLOWED_HOSTS)."
            )
            await _refuse(scope, receive, send, 400, "host_not_allowed", message, "this host name is not allowed")
        elif not policy.origin_allowed(origin, host):
            message = (
                f"A web page from {origin!r} may not use this gateway. To allow that site, add its origin to "
                "the setting allowed_origins (KERNELGW_ALLOWED_ORIGINS)."
            )
            await _refuse(scope, receive, send, 403, "origin_not_allowed", message, "this origin may not open sessions")
        else:
            await self.app(scope, receive, send)


async def _refuse(
    scope: Scope, receive: Receive, send: Send, status: int, code: str, message: str, close_reason: str
) -> None:
    """The HTTP error, or for a WebSocket a close with ``close_reason`` (a close
    frame's reason has room for 123 bytes)."""
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": CLOSE_FORBIDDEN, "reason": close_reason})
        return
    body = orjson.dumps({"error": {"code": code, "message": message}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
