"""A gateway without ``cluster_secret`` on a store other gateways share.

Such a gateway is not one of a cluster, yet a load balancer may send it
requests for sessions another gateway of the same PostgreSQL runs. It cannot
forward them (it holds no secret to prove a forward with), and answering the
404 of a session that does not exist sent operators looking in the wrong place.
So it warns at start when other live gateways are registered in the store,
and a request for a session whose open row names another gateway answers 503
``cluster_misconfigured`` naming that gateway and the missing setting (to
callers who may see the session; others get the usual 404).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from kernelgw.cluster.errors import ClusterMisconfigured
from kernelgw.cluster.registry import Gateway, GatewayRegistry, Ownership
from kernelgw.config import Settings
from kernelgw.errors import StorageUnavailable
from kernelgw.storage import schema
from kernelgw.storage.engine import create_store_engine, database_url_for

log = logging.getLogger(__name__)

SETTING = "KERNELGW_CLUSTER_SECRET"


@dataclass(frozen=True)
class ForeignSession:
    """An open session of another gateway, and that gateway's row if it has one."""

    ownership: Ownership
    gateway: Gateway | None
    live: bool

    def error(self) -> ClusterMisconfigured:
        name = self.ownership.gateway_name
        if self.gateway is not None and self.live:
            where = f"gateway {name!r} ({self.gateway.url}), a live gateway of this gateway's store"
        elif self.gateway is not None:
            where = (
                f"gateway {name!r} ({self.gateway.url}), which shares this gateway's store ({self.gateway.last_seen()})"
            )
        else:
            where = f"gateway {name!r}, which shares this gateway's store"
        return ClusterMisconfigured(
            f"Session {self.ownership.session_id} runs on {where}, but this gateway has no cluster secret, so it "
            f"cannot forward the request there. Give every gateway that shares the database the same {SETTING} "
            f"(cluster_secret) and restart them, or send the session's requests to {name!r} directly."
        )


class LoneGateway:
    """The store's registry and session rows, read by a gateway outside any cluster."""

    def __init__(self, settings: Settings) -> None:
        self.name = settings.gateway_name
        self.engine = create_store_engine(database_url_for(settings), settings.durability)
        self.registry = GatewayRegistry(
            self.engine,
            self.name,
            settings.own_url(),
            heartbeat_s=settings.cluster_heartbeat_s,
            gone_after_s=settings.cluster_gone_after_s,
            running_sessions=lambda: 0,
        )

    async def warn_if_shared(self) -> list[Gateway]:
        """Log a warning naming the other live gateways of the store, if any (at start)."""
        try:
            await self.registry.refresh()
        except (SQLAlchemyError, OSError) as exc:
            log.warning("could not read the store's gateway registry: %s", exc)
            return []
        others = [g for g in self.registry.live() if g.name != self.name]
        if others:
            log.warning(
                "other live gateways share this store (%s) but this gateway has no cluster secret: requests "
                "for their sessions that reach it cannot be forwarded and answer 503 cluster_misconfigured; "
                "give every gateway that shares the database the same %s",
                ", ".join(f"{g.name} at {g.url}" for g in others),
                SETTING,
            )
        return others

    async def foreign_session(self, session_ids: Sequence[str]) -> ForeignSession | None:
        """The open session stored under one of ``session_ids`` if another gateway runs it."""
        t = schema.sessions
        query = select(t.c.id, t.c.gateway_name, t.c.owner, t.c.access_sha256).where(
            t.c.id.in_(list(session_ids)), t.c.ended_at.is_(None), t.c.gateway_name != self.name
        )
        try:
            async with self.engine.connect() as conn:
                row = (await conn.execute(query)).first()
        except (SQLAlchemyError, OSError) as exc:
            raise StorageUnavailable(
                f"The store does not answer, so the gateway running this session is unknown; retry later ({exc})."
            ) from exc
        if row is None:
            return None
        gateway = await self.registry.reread(row.gateway_name)
        live = gateway is not None and self.registry.is_live(gateway)
        return ForeignSession(Ownership(row.id, row.gateway_name, row.owner, row.access_sha256), gateway, live)

    async def close(self) -> None:
        await self.engine.dispose()
