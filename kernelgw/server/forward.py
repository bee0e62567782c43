"""Any gateway accepts any request: what another live gateway owns goes there.

A pure ASGI middleware (inside `PageGuard`, so the receiving gateway checks
Host and Origin as for its own sessions) in front of every route:

- a request for a session (``/v1/sessions/{id}...``, its WebSocket,
  ``/api/kernels/{id}...``, the channels WebSocket) that this gateway does not
  run, whose open row in the shared store names another gateway, is proxied
  to that gateway's ``advertise_url``: HTTP streamed both ways with httpx (no
  whole body is held), WebSocket relayed frame by frame with the
  ``websockets`` client; status, headers and close codes pass through;
- a new session, with ``placement=load``, goes to the least loaded gateway;
- the owner being gone (no fresh heartbeat, or it does not answer) is a 503
  naming it and when it was last seen (WebSocket: accepted, then closed 1013
  with that reason), for callers who may see the session; others get the 404
  of a session that does not exist.

Forwarded requests carry the user's own credentials (the owner authenticates
the user against the shared keys table) and a proof signed with
``cluster_secret`` (`kernelgw.cluster.proof`), which is also the hop marker:
such a request is served where it lands, never forwarded again. The proxy
drops ``Host`` and ``Origin`` (checked here; the owner is reached by its own
address) and adds ``X-Forwarded-For``/``-Host``/``-Proto``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernelgw.cluster.errors import ForwardRefused, OwnerGone
from kernelgw.cluster.registry import Gateway, Ownership
from kernelgw.cluster.routing import SessionRoute, create_face, create_source_field, session_route
from kernelgw.errors import KernelGWError, SessionNotFound, Unauthorized
from kernelgw.keys import Principal
from kernelgw.server.e2b.auth import ACCESS_TOKEN_HEADERS, key_text
from kernelgw.server.e2b.errors import error_body
from kernelgw.server.e2b.snapshots import newest_named
from kernelgw.server.e2b.templates import templates
from kernelgw.server.jupyter.errors import reason
from kernelgw.server.state import GatewayState, find_gateway_state
from kernelgw.tasks import cancel_and_wait

if TYPE_CHECKING:  # httpx (60 ms of a restart's import time) is imported when a cluster forwards,
    # websockets' client (~5 ms) when it forwards a WebSocket
    from websockets.asyncio.client import ClientConnection

    from kernelgw.cluster.lone import LoneGateway
    from kernelgw.cluster.node import Cluster

log = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "origin",
    }
)
_NOT_RELAYED_WS = _HOP_BY_HOP | {
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
    "content-length",
}
_NOT_RETURNED = _HOP_BY_HOP | {"date", "server"}
GATEWAY_HEADER = b"x-kernelgw-gateway"
"""On every HTTP answer of a cluster gateway: the gateway that served it (a forwarded
request's owner), for operators reading logs and load balancer traces."""
VIA_HEADER = b"x-kernelgw-via"
"""On a forwarded answer: the gateway that received the request and forwarded it."""
CLOSE_TRY_AGAIN = 1013
CLOSE_CODES = {401: 4401, 403: 4403, 404: 4404}
_UNSENDABLE_CLOSE = {1004, 1005, 1006, 1015}


_TEMPLATE_DELETE = re.compile(r"^/e2b(?:/v2)?/templates/[^/]+$")
"""E2B's SDK deletes a snapshot as a template, by its id or its name."""


@dataclass(frozen=True)
class _Named:
    target: Gateway | None
    """The gateway holding the named snapshot; None: this one."""


class Forwarder:
    """Sends requests for other gateways' sessions to them (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = find_gateway_state(scope["app"]) if scope["type"] in ("http", "websocket") else None
        cluster = state.cluster if state is not None else None
        if state is None or cluster is None:
            if state is not None and state.lone is not None:
                try:
                    await _not_elsewhere(state, state.lone, scope)
                except KernelGWError as exc:
                    await refuse(scope, receive, send, exc)
                    return
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET")
        path: str = scope["path"]
        headers = _header_map(scope)
        try:
            forwarded = await _verified(state, cluster, scope, headers, method, path)
            if forwarded:
                target = None  # forwarded once already: served here, whatever the registry says (no loops)
                _client_from_peer(scope)
            elif (
                (face := create_face(method, path)) and (field := create_source_field(face)) and scope["type"] == "http"
            ):
                receive, source = await _create_source(receive, state.settings.max_request_bytes, field)
                route = SessionRoute(source, face, "") if source is not None else None
                target = await self._owner(state, cluster, scope, route) if route else None
                if target is None and (route is None or not _runs_here(state, route)):
                    named = await self._named_snapshot(state, cluster, scope, route)
                    target = cluster.placement_target() if named is None else named.target
            else:
                target = await self._target(state, cluster, scope, method, path, headers)
        except KernelGWError as exc:
            await refuse(scope, receive, send, exc)
            return
        if target is None:
            if scope["type"] == "http":
                send = _named(send, GATEWAY_HEADER, cluster.name)
                if method == "DELETE" and (route := session_route(path, headers)) is not None and not route.rest:
                    send = _after_flush(send, state)
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await proxy_http(cluster, target, scope, receive, _named(send, VIA_HEADER, cluster.name))
        else:
            await relay_websocket(cluster, target, scope, receive, send)

    async def _target(
        self, state: GatewayState, cluster: Cluster, scope: Scope, method: str, path: str, headers: dict[str, str]
    ) -> Gateway | None:
        """The peer to forward to; None to serve here; raises `OwnerGone`."""
        route = session_route(path, headers)
        if route is None:
            return cluster.placement_target() if create_face(method, path) and scope["type"] == "http" else None
        if route.from_store(method):
            return None
        target = await self._owner(state, cluster, scope, route)
        if target is None and method == "DELETE" and _TEMPLATE_DELETE.match(path) and not _runs_here(state, route):
            named = await self._named_snapshot(state, cluster, scope, route)
            return None if named is None else named.target
        return target

    async def _named_snapshot(
        self, state: GatewayState, cluster: Cluster, scope: Scope, route: SessionRoute | None
    ) -> _Named | None:
        """Where the E2B snapshot ``route`` names by its *name* is (a create from
        it, or its delete, must go there); None when no snapshot has that name
        (a template, a snapshot id, or nothing: served where it lands)."""
        if route is None or route.face != "e2b" or route.session_id in templates(state.settings):
            return None  # a create from a template (most are) costs no key lookup here
        named = await newest_named(state, await _principal(state, scope), route.session_id)
        if named is None:
            return None
        if named.gateway_name is None or named.gateway_name == cluster.name:
            return _Named(None)
        return _Named(await self._owner(state, cluster, scope, SessionRoute(named.snapshot_id, "e2b", "")))

    async def _owner(self, state: GatewayState, cluster: Cluster, scope: Scope, route: SessionRoute) -> Gateway | None:
        """The live peer running ``route``'s session; None when it runs here or
        nowhere; raises `OwnerGone` when its gateway is gone."""
        if _runs_here(state, route):
            return None
        ownership = await cluster.registry.owner_of(route.candidate_ids())
        if ownership is None or ownership.gateway_name == cluster.name:
            return None
        if route.sandbox_traffic and not await _may_know(state, scope, route, ownership):
            # sandbox traffic has no key for the owner to check: without the
            # sandbox's token it is served here, as for a sandbox that does not
            # exist, and learns nothing of where it runs or whether that is up
            return None
        gateway = cluster.registry.gateway(ownership.gateway_name)
        if gateway is not None and cluster.registry.is_live(gateway):
            return gateway
        if not await _may_know(state, scope, route, ownership):
            return None  # served here: the 404 of a session that does not exist
        gateway = await cluster.registry.reread(ownership.gateway_name)  # back since the last heartbeat?
        if gateway is not None and cluster.registry.is_live(gateway):
            return gateway
        seen = gateway.last_seen() if gateway is not None else "it never registered in the gateway registry"
        raise OwnerGone(
            f"Session {route.session_id} runs on gateway {ownership.gateway_name!r}, which is gone ({seen}; "
            f"gateways are gone after {cluster.registry.gone_after_s:g} s without a heartbeat). Its kernel comes "
            "back when that gateway restarts and reattaches it; retry later."
        )


async def _verified(
    state: GatewayState, cluster: Cluster, scope: Scope, headers: dict[str, str], method: str, path: str
) -> bool:
    """Whether the request carries a valid forwarding proof. An invalid one is a
    403 naming the cluster secret only to a caller with valid credentials (an
    operator's misconfiguration); without them it is the 401 of any bad
    credential. On a route that is never forwarded (``/healthz``, listings)
    the proof means nothing and is ignored."""
    try:
        return cluster.verify(headers, method, path) is not None
    except ForwardRefused:
        route = session_route(path, headers)
        if route is None and create_face(method, path) is None:
            return False
        if route is not None and route.sandbox_traffic:
            raise Unauthorized("the forwarding proof is not valid") from None  # no key to tell an operator by
        await _principal(state, scope)  # raises Unauthorized
        raise


async def _not_elsewhere(state: GatewayState, lone: LoneGateway, scope: Scope) -> None:
    """Raise `ClusterMisconfigured` when the request names a session another
    gateway of the store runs (this one has no cluster secret to forward with),
    for callers who may see it; others are served the 404 of a session that does
    not exist."""
    if scope["type"] not in ("http", "websocket"):
        return
    route = session_route(scope["path"], _header_map(scope))
    if route is None or route.from_store(scope.get("method", "GET")) or _runs_here(state, route):
        return
    foreign = await lone.foreign_session(route.candidate_ids())
    if foreign is None:
        return
    if await _may_know(state, scope, route, foreign.ownership):
        raise foreign.error()


def _client_from_peer(scope: Scope) -> None:
    """A peer gateway's proven forward names its client in ``X-Forwarded-For``
    (the last hop: it drops what its client sent, `_forward_headers`)."""
    for name, value in reversed(scope["headers"]):
        if name == b"x-forwarded-for":
            hop = value.decode("latin-1").split(",")[-1].strip()
            if hop:
                scope["client"] = (hop, 0)
            return


async def _create_source(receive: Receive, limit: int, field: str) -> tuple[Receive, str | None]:
    """A create's body read ahead for ``field``, the session it is made from (/v1's
    ``from``, E2B's ``templateID``: a fork or a sandbox from a snapshot runs where
    its source runs, its files are copied on that host), and a ``receive`` that
    gives the body again. A body over ``limit`` is not parsed (the app refuses it)."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if not message.get("more_body", False) or size > limit:
            break
    source = None
    if size <= limit and messages and not messages[-1].get("more_body", False):
        try:
            body = orjson.loads(b"".join(m.get("body", b"") for m in messages))
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict) and isinstance(body.get(field), str) and body[field]:
            source = body[field]
    pending = iter(messages)

    async def replay() -> Message:
        message = next(pending, None)
        return message if message is not None else await receive()

    return replay, source


def _runs_here(state: GatewayState, route: SessionRoute) -> bool:
    for sid in route.candidate_ids():
        try:
            state.manager.get(sid)
            return True
        except SessionNotFound:
            continue
    return False


async def _principal(state: GatewayState, scope: Scope) -> Principal:
    from kernelgw.server.jupyter.kernels import credentials

    conn = HTTPConnection(scope)
    if scope["path"].startswith("/e2b/"):
        return await state.auth.from_key(key_text(conn.headers))
    key, token = credentials(conn)
    if token is not None:
        return await state.auth.from_key_or_token(None, token)
    return await state.auth.from_key(key)


async def _may_know(state: GatewayState, scope: Scope, route: SessionRoute, ownership: Ownership) -> bool:
    """Whether the caller may learn that the session exists (and where): its
    owner's key, or for E2B's sandbox traffic, which carries no key, the
    sandbox's access token. Raises `Unauthorized` for a request with no valid
    credentials at all."""
    if route.sandbox_traffic:
        headers = HTTPConnection(scope).headers
        return any(ownership.token_matches(headers.get(name)) for name in ACCESS_TOKEN_HEADERS)
    principal = await _principal(state, scope)
    return principal.can_see(ownership.owner_key)


def _header_map(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def _named(send: Send, header: bytes, name: str) -> Send:
    """``send`` adding ``header: name`` to the response's start."""
    value = name.encode("latin-1", errors="replace")

    async def named(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (header, value)]}
        await send(message)

    return named


def _after_flush(send: Send, state: GatewayState) -> Send:
    """``send`` whose answer starts once the store has committed what is queued:
    a deleted session's end is in its row before the client hears 204, so no
    other gateway lists it afterwards."""

    async def flushed(message: Message) -> None:
        if message["type"] == "http.response.start":
            await state.store.flush()
        await send(message)

    return flushed


# ---------------------------------------------------------------- errors
async def refuse(scope: Scope, receive: Receive, send: Send, exc: KernelGWError) -> None:
    """``exc`` in the face's shape: /v1 ``{"error"}``, /api ``{"message", "reason"}``,
    WebSocket: accepted, then closed with a code and the message's start."""
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        code = CLOSE_CODES.get(exc.status_code, CLOSE_TRY_AGAIN if exc.status_code == 503 else 1011)
        await send({"type": "websocket.close", "code": code, "reason": _close_reason(exc.message)})
        return
    if scope["path"].startswith("/api/"):
        body = orjson.dumps({"message": exc.message, "reason": reason(exc.status_code)})
    elif scope["path"].startswith("/e2b/"):
        body = orjson.dumps(error_body(exc.status_code, exc.message, exc.code))
    else:
        body = orjson.dumps({"error": {"code": exc.code, "message": exc.message}})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if exc.status_code == 503:
        headers.append((b"retry-after", b"5"))
    elif isinstance(exc, Unauthorized):
        headers.append((b"www-authenticate", b'Bearer realm="kernelgw"'))
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _close_reason(message: str) -> str:
    """A close frame's reason has room for 123 bytes."""
    encoded = message.encode()
    return message if len(encoded) <= 123 else encoded[:120].decode(errors="ignore") + "..."


def _unreachable(gateway: Gateway, exc: BaseException) -> OwnerGone:
    return OwnerGone(
        f"The session runs on gateway {gateway.name!r} ({gateway.url}), which does not answer "
        f"({type(exc).__name__}: {exc}; {gateway.last_seen()}). Its kernel comes back when that gateway "
        "restarts and reattaches it; retry later."
    )


# ---------------------------------------------------------------- HTTP
def _forward_headers(cluster: Cluster, scope: Scope, method: str, drop: frozenset[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    host = ""
    for raw_name, raw_value in scope["headers"]:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        if name == "host":
            host = value
        if name in drop or name.startswith("x-kernelgw-") or name.startswith("x-forwarded-"):
            continue
        out.append((name, value))
    client = scope.get("client")
    if client:
        out.append(("x-forwarded-for", str(client[0])))
    if host:
        out.append(("x-forwarded-host", host))
    out.append(("x-forwarded-proto", "https" if scope.get("scheme") in ("https", "wss") else "http"))
    out.extend(cluster.sign(method, scope["path"]).items())
    return out


def _upstream_url(base: str, scope: Scope, websocket: bool = False) -> str:
    raw: bytes = scope.get("raw_path") or scope["path"].encode()
    query: bytes = scope.get("query_string", b"")
    url = base + raw.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
    if websocket:
        url = "ws" + url[len("http") :] if url.startswith("http") else url
    return url


async def proxy_http(cluster: Cluster, gateway: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    """The request streamed to ``gateway`` and its answer streamed back."""
    import httpx

    method = scope["method"]
    headers = _forward_headers(cluster, scope, method, _HOP_BY_HOP)
    names = {name for name, _ in headers}
    has_body = "content-length" in names or any(
        k == b"transfer-encoding" for k, _ in scope["headers"]
    )  # HTTP/1.1: no length, no chunking, no body

    async def body() -> AsyncIterator[bytes]:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                return
            if chunk := message.get("body", b""):
                yield chunk
            if not message.get("more_body", False):
                return

    request = cluster.http.build_request(
        method, _upstream_url(gateway.url, scope), headers=headers, content=body() if has_body else None
    )
    try:
        response = await cluster.http.send(request, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as exc:
        await refuse(scope, receive, send, _unreachable(gateway, exc))
        return
    try:
        out = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in response.headers.multi_items()
            if k.lower() not in _NOT_RETURNED
        ]
        await send({"type": "http.response.start", "status": response.status_code, "headers": out})
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except httpx.TransportError as exc:
        # the status is out: the client sees a cut answer (a short body, or a broken chunked stream)
        log.warning("forwarding to gateway %r broke off: %s", gateway.name, exc)
    finally:
        await response.aclose()


# ---------------------------------------------------------------- WebSocket
async def relay_websocket(cluster: Cluster, gateway: Gateway, scope: Scope, receive: Receive, send: Send) -> None:
    """Connect to the owner first, then accept with the subprotocol it chose and
    relay frames both ways until either side closes; the owner's close code and
    reason reach the client."""
    first = await receive()
    if first["type"] != "websocket.connect":
        return
    from websockets import InvalidHandshake
    from websockets.asyncio.client import connect

    from kernelgw.cluster.node import CONNECT_TIMEOUT_S

    headers = _forward_headers(cluster, scope, "GET", _NOT_RELAYED_WS)
    try:
        upstream = await connect(
            _upstream_url(gateway.url, scope, websocket=True),
            additional_headers=headers,
            subprotocols=scope.get("subprotocols") or None,
            max_size=None,  # the owner enforces its own limits on what clients send
            compression=None,
            open_timeout=CONNECT_TIMEOUT_S,
            proxy=None,
            user_agent_header=None,
        )
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        await send({"type": "websocket.accept"})
        gone = _unreachable(gateway, exc)
        await send({"type": "websocket.close", "code": CLOSE_TRY_AGAIN, "reason": _close_reason(gone.message)})
        return
    try:
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        up = asyncio.create_task(_client_to_owner(receive, upstream), name="ws-relay-up")
        down = asyncio.create_task(_owner_to_client(gateway, upstream, send), name="ws-relay-down")
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(up)
            await cancel_and_wait(down)
    finally:
        await upstream.close()


async def _client_to_owner(receive: Receive, upstream: ClientConnection) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.receive":
            text = message.get("text")
            await upstream.send(text if text is not None else message.get("bytes") or b"")
        elif message["type"] == "websocket.disconnect":
            code = message.get("code", 1000)
            await upstream.close(code=1000 if code in _UNSENDABLE_CLOSE else code)
            return


async def _owner_to_client(gateway: Gateway, upstream: ClientConnection, send: Send) -> None:
    from websockets import ConnectionClosed

    with contextlib.suppress(ConnectionClosed):
        async for data in upstream:
            if isinstance(data, str):
                await send({"type": "websocket.send", "text": data})
            else:
                await send({"type": "websocket.send", "bytes": data})
    code, why = upstream.close_code, upstream.close_reason or ""
    if code is None or code in _UNSENDABLE_CLOSE:
        code, why = 1011, _close_reason(f"the connection to gateway {gateway.name!r}, which runs the session, was lost")
    with contextlib.suppress(OSError, RuntimeError):
        await send({"type": "websocket.close", "code": code, "reason": why})
