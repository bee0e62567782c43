"""This gateway as one of many: its registry row, its HTTP client to peers,
and the proof it signs forwarded requests with."""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx

from kernelgw.cluster import proof
from kernelgw.cluster.listing import RemoteSession
from kernelgw.cluster.placement import least_loaded
from kernelgw.cluster.registry import Gateway, GatewayRegistry
from kernelgw.config import Settings
from kernelgw.keys import Principal
from kernelgw.storage.engine import create_store_engine, database_url_for

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
"""A live owner answers a connection at once; longer means it is gone."""


class Cluster:
    """Made in the lifespan when ``cluster_secret`` is set, after the store
    (which migrates the registry table) has started."""

    def __init__(self, settings: Settings, running_sessions: Callable[[], int]) -> None:
        assert settings.cluster_secret is not None
        self.settings = settings
        self.name = settings.gateway_name
        self.url = settings.own_url()
        self.secret = settings.cluster_secret.get_secret_value().encode()
        self.engine = create_store_engine(database_url_for(settings), settings.durability)
        self.registry = GatewayRegistry(
            self.engine,
            self.name,
            self.url,
            heartbeat_s=settings.cluster_heartbeat_s,
            gone_after_s=settings.cluster_gone_after_s,
            running_sessions=running_sessions,
            peers=frozenset(settings.cluster_peers) if settings.cluster_peers is not None else None,
        )
        # no read timeout: a forwarded cell may run for max_exec_timeout_s;
        # trust_env=False: peers are reached directly, never through an HTTP proxy
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            trust_env=False,
            follow_redirects=False,
        )

    async def start(self) -> None:
        await self.registry.start()

    async def close(self, registered: bool = True) -> None:
        if registered:
            await self.registry.stop()
        await self.http.aclose()
        await self.engine.dispose()

    def sign(self, method: str, path: str) -> dict[str, str]:
        return proof.proof_headers(self.secret, self.name, method, path)

    def verify(self, headers: dict[str, str], method: str, path: str) -> str | None:
        return proof.verify(self.secret, headers, method, path)

    def placement_target(self) -> Gateway | None:
        """Where a new session goes: None for here (``placement=local``, or this one is least loaded)."""
        if self.settings.placement == "local":
            return None
        target = least_loaded(self.registry.live(), prefer=self.name)
        return None if target is None or target.name == self.name else target

    async def held_elsewhere(self, key_id: str) -> int:
        """Open sessions of ``key_id`` on the other live gateways (for its session quota)."""
        return await self.registry.count_open([g.name for g in self.registry.live() if g.name != self.name], key_id)

    async def remote_sessions(self, principal: Principal) -> list[RemoteSession]:
        """The sessions ``principal`` may see on the other live gateways."""
        names = [g.name for g in self.registry.live() if g.name != self.name]
        rows = await self.registry.open_rows(names, principal.key_id, principal.is_admin)
        return [RemoteSession.from_row(r) for r in rows]
