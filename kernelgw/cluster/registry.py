"""The registry of gateways in the shared store, and who owns which session.

Each gateway of a cluster keeps one row in ``kgw_gateways``: where peers reach
it, when it started, its last heartbeat and its load (running sessions, free
memory). It rewrites the row every ``cluster_heartbeat_s`` and reads everyone's
back at the same time, so a request's routing needs no query about gateways.

A gateway is **live** while its heartbeat is younger than
``cluster_gone_after_s`` (default 15 s, five heartbeats) and it has not
stopped cleanly; otherwise it is **gone**, and its sessions answer 503 naming
it and when it was last seen. A gateway that comes back under its name
(restart, same host and runtime directory) reattaches its kernels and is live
again with its next heartbeat. Clocks must agree to well within the bound.

A session's owner never changes (its kernel cannot move), so the session ->
gateway answer is cached; only an open row counts (ended sessions are the
store's history, served by any gateway).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from kernelgw.errors import GatewayNameInUse, StorageUnavailable
from kernelgw.runtime.lease import access_sha256
from kernelgw.storage import schema
from kernelgw.storage.records import as_utc
from kernelgw.tasks import cancel_and_wait

if TYPE_CHECKING:  # imported by its engine's maker (kernelgw.storage.engine.create_store_engine)
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger(__name__)

_OWNER_CACHE_MAX = 50_000


@dataclass(frozen=True)
class Gateway:
    """One row of the registry."""

    name: str
    url: str
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    sessions: int
    free_memory_mb: int | None

    def live(self, now: datetime, gone_after_s: float) -> bool:
        return self.stopped_at is None and (now - self.heartbeat_at).total_seconds() <= gone_after_s

    def last_seen(self) -> str:
        if self.stopped_at is not None:
            return f"it stopped at {self.stopped_at.isoformat(timespec='seconds')}"
        return f"its last heartbeat was at {self.heartbeat_at.isoformat(timespec='seconds')}"


@dataclass(frozen=True)
class Ownership:
    """Who runs an open session (its gateway) and whose it is (its API key)."""

    session_id: str
    gateway_name: str
    owner_key: str | None
    access_sha256: str | None = None
    """The sha256 of the session's own access token, when a face gave it one (an
    E2B sandbox's): what sandbox traffic, which carries no key, proves itself by."""

    def token_matches(self, token: str | None) -> bool:
        """Whether ``token`` is the session's access token."""
        if not token or self.access_sha256 is None:
            return False
        return hmac.compare_digest(access_sha256(token), self.access_sha256)


def free_memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The host's available memory (``MemAvailable``), None where unknown (blocking: a thread's job)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _now() -> datetime:
    return datetime.now(UTC)


def _gateway(row: Any) -> Gateway:
    return Gateway(
        name=row.name,
        url=row.advertise_url.rstrip("/"),
        started_at=as_utc(row.started_at),
        heartbeat_at=as_utc(row.heartbeat_at),
        stopped_at=as_utc(row.stopped_at) if row.stopped_at is not None else None,
        sessions=row.sessions,
        free_memory_mb=row.free_memory_mb,
    )


class GatewayRegistry:
    """This gateway's row (heartbeat, load) and a fresh copy of everyone's."""

    def __init__(
        self,
        engine: AsyncEngine,
        name: str,
        url: str,
        *,
        heartbeat_s: float,
        gone_after_s: float,
        running_sessions: Callable[[], int],
        peers: frozenset[str] | None = None,
    ) -> None:
        self.engine = engine
        self.peers = peers
        """The gateways of the store that are this one's cluster (None: all of them):
        the others are neither listed nor forwarded to (``cluster_peers``)."""
        self.name = name
        self.url = url
        self.heartbeat_s = heartbeat_s
        self.gone_after_s = gone_after_s
        self._running_sessions = running_sessions
        self._gateways: dict[str, Gateway] = {}
        self._owners: dict[str, Ownership] = {}
        self._loop: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle
    async def check_name(self) -> None:
        """Raise `GatewayNameInUse` when a live gateway of this name serves at
        another address (another host): the two would share the row and the
        sessions' ownership. Before this gateway touches any kernel."""
        await self.refresh()
        other = self._gateways.get(self.name)
        if other is not None and other.url != self.url and other.live(_now(), self.gone_after_s):
            raise GatewayNameInUse(
                f"A live gateway named {self.name!r} serves at {other.url} ({other.last_seen()}), and this one "
                f"would serve at {self.url}: each gateway of a cluster needs its own name (KERNELGW_GATEWAY_NAME). "
                f"If that was this gateway before a restart at a new address, start again after "
                f"{self.gone_after_s:g} s (cluster_gone_after_s)."
            )

    async def start(self) -> None:
        """Register (or re-register under the same name) and start heartbeating."""
        await self._write(started=True)
        await self.refresh()
        self._loop = asyncio.create_task(self._heartbeat_loop(), name="cluster-heartbeat")
        log.info("cluster: gateway %r registered at %s", self.name, self.url)

    async def stop(self) -> None:
        """Stop heartbeating and mark the row stopped: peers see it gone at once."""
        await cancel_and_wait(self._loop)
        t = schema.gateways
        try:
            async with self.engine.begin() as conn:
                await conn.execute(update(t).where(t.c.name == self.name).values(stopped_at=_now()))
        except (SQLAlchemyError, OSError) as exc:
            log.warning("cluster: could not mark gateway %r stopped: %s", self.name, exc)

    async def beat(self) -> None:
        """One heartbeat: this gateway's load written, everyone's read back."""
        await self._write(started=False)
        await self.refresh()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.beat()
            except (SQLAlchemyError, OSError) as exc:
                log.warning(
                    "cluster: heartbeat failed (peers see this gateway gone after %g s): %s", self.gone_after_s, exc
                )

    async def _write(self, started: bool) -> None:
        now = _now()
        free = await asyncio.to_thread(free_memory_mb)
        values = {
            "advertise_url": self.url,
            "heartbeat_at": now,
            "sessions": self._running_sessions(),
            "free_memory_mb": free,
        }
        if started:
            values |= {"started_at": now, "stopped_at": None}
        t = schema.gateways
        async with self.engine.begin() as conn:
            result = await conn.execute(update(t).where(t.c.name == self.name).values(**values))
            if result.rowcount == 0:
                await conn.execute(
                    insert(t).values({"name": self.name, "started_at": now, "stopped_at": None, **values})
                )

    async def refresh(self) -> None:
        async with self.engine.connect() as conn:
            rows = (await conn.execute(select(schema.gateways))).all()
        self._gateways = {row.name: _gateway(row) for row in rows if self._peer(row.name)}

    def _peer(self, name: str) -> bool:
        return self.peers is None or name == self.name or name in self.peers

    async def reread(self, name: str) -> Gateway | None:
        """Gateway ``name``'s row read again now: one that looked gone in the last
        heartbeat's copy may have come back since (its sessions answer at once)."""
        t = schema.gateways
        try:
            async with self.engine.connect() as conn:
                row = (await conn.execute(select(t).where(t.c.name == name))).first()
        except (SQLAlchemyError, OSError) as exc:
            log.warning("cluster: could not read gateway %r again: %s", name, exc)
            return self._gateways.get(name)
        if row is None or not self._peer(name):
            return None
        gateway = self._gateways[name] = _gateway(row)
        return gateway

    # ------------------------------------------------------------ reading
    def gateway(self, name: str) -> Gateway | None:
        return self._gateways.get(name)

    def is_live(self, gateway: Gateway) -> bool:
        return gateway.name == self.name or gateway.live(_now(), self.gone_after_s)

    def live_and_gone(self) -> list[Gateway]:
        """Every gateway of the registry as of the last heartbeat."""
        return list(self._gateways.values())

    def live(self) -> list[Gateway]:
        """The live gateways (this one included) as of the last heartbeat."""
        return [g for g in self._gateways.values() if self.is_live(g)]

    async def owner_of(self, session_ids: Sequence[str]) -> Ownership | None:
        """The gateway running the open session stored under one of ``session_ids``."""
        for sid in session_ids:
            if (known := self._owners.get(sid)) is not None:
                return known
        t = schema.sessions
        try:
            async with self.engine.connect() as conn:
                row = (
                    await conn.execute(
                        select(t.c.id, t.c.gateway_name, t.c.owner, t.c.access_sha256).where(
                            t.c.id.in_(list(session_ids)), t.c.ended_at.is_(None)
                        )
                    )
                ).first()
        except (SQLAlchemyError, OSError) as exc:
            raise StorageUnavailable(
                f"The store does not answer, so the gateway running this session is unknown; retry later ({exc})."
            ) from exc
        if row is None or not self._peer(row.gateway_name):
            return None  # another cluster's session: served here as one that does not exist
        found = Ownership(row.id, row.gateway_name, row.owner, row.access_sha256)
        if len(self._owners) >= _OWNER_CACHE_MAX:
            self._owners.clear()
        for sid in session_ids:
            self._owners[sid] = found
        return found

    def forget(self, session_id: str) -> None:
        self._owners.pop(session_id, None)

    async def count_open(self, gateway_names: Sequence[str], owner_key: str) -> int:
        """How many open sessions ``owner_key`` holds on ``gateway_names``."""
        if not gateway_names:
            return 0
        t = schema.sessions
        query = (
            select(func.count())
            .select_from(t)
            .where(t.c.gateway_name.in_(list(gateway_names)), t.c.ended_at.is_(None), t.c.owner == owner_key)
        )
        try:
            async with self.engine.connect() as conn:
                return int((await conn.execute(query)).scalar_one())
        except (SQLAlchemyError, OSError) as exc:
            raise StorageUnavailable(
                f"The store does not answer, so the key's sessions on other gateways cannot be counted ({exc})."
            ) from exc

    async def open_rows(self, gateway_names: Sequence[str], owner_key: str | None, admin: bool) -> list[object]:
        """The open session rows of ``gateway_names``, of ``owner_key`` unless ``admin``."""
        if not gateway_names:
            return []
        t = schema.sessions
        query = select(t).where(t.c.gateway_name.in_(list(gateway_names)), t.c.ended_at.is_(None))
        if not admin:
            query = query.where(t.c.owner == owner_key)
        try:
            async with self.engine.connect() as conn:
                return list((await conn.execute(query.order_by(t.c.created_at))).all())
        except (SQLAlchemyError, OSError) as exc:
            raise StorageUnavailable(
                f"The store does not answer, so other gateways' sessions cannot be listed ({exc})."
            ) from exc
