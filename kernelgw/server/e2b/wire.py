"""Sandboxes as E2B's control plane shows them: a session's state, lease,
metadata and template in E2B's shapes, and the 404 of one that is not (there).

A sandbox is running or paused (every kernelgw state but ``paused`` is running:
a starting, busy or restarting kernel is a running sandbox). ``endAt`` is when
something ends it: its lease, else ``paused_ttl_s`` for a paused one, else idle
reaping for a session of another face (which has no lease).
"""

from __future__ import annotations

import contextlib
import math
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import BaseModel

from kernelgw.cluster.listing import RemoteSession
from kernelgw.config import Settings
from kernelgw.errors import KernelGWError, SessionNotFound
from kernelgw.keys import Principal
from kernelgw.runtime.lease import LEASE_ENDED_REASON, labels
from kernelgw.runtime.session import KernelSession
from kernelgw.server.e2b import templates
from kernelgw.server.e2b.errors import E2BError, not_found
from kernelgw.server.e2b.models import (
    RESERVED_PREFIX,
    CreatedSandbox,
    Lifecycle,
    ListedSandbox,
    SandboxDetail,
    unknown_fields,
)
from kernelgw.server.state import GatewayState

SNAPSHOT_OF_KEY = RESERVED_PREFIX + "snapshot-of"
"""In a snapshot's metadata (`kernelgw.server.e2b.snapshots`): the sandbox it was
taken of. It marks the session as a snapshot, which is no sandbox."""
KILLED_REASON = "killed through E2B's API"
"""The end reason of a sandbox killed with ``DELETE /sandboxes/{id}``."""
_FAR_FUTURE = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
"""``endAt`` of a sandbox nothing will end (paused, with paused sessions kept for ever)."""


def is_snapshot(session: KernelSession) -> bool:
    return SNAPSHOT_OF_KEY in session.metadata


def sandbox_state(session: KernelSession) -> Literal["running", "paused"]:
    return "paused" if session.state == "paused" else "running"


def visible_metadata(session: KernelSession) -> dict[str, str]:
    """The client's own metadata (the face's reserved keys left out)."""
    return labels(session.metadata)


def end_at(session: KernelSession, state: GatewayState) -> datetime:
    """When the sandbox ends: its lease; a paused one when ``paused_ttl_s`` ends it;
    one with no lease (made on another face) when idle reaping would."""
    settings = state.settings
    if session.lease_until is not None:
        return session.lease_until
    if session.state == "paused":
        if settings.paused_ttl_s and session.paused_at is not None:
            return session.paused_at + timedelta(seconds=settings.paused_ttl_s)
        return _FAR_FUTURE
    return utc(session.last_activity_at) + timedelta(seconds=settings.idle_timeout_s)


def utc(value: datetime) -> datetime:
    """Aware and in UTC (SQLite gives back naive datetimes, stored as UTC)."""
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def listed(session: KernelSession, state: GatewayState) -> ListedSandbox:
    template = templates.template_of(session, state.settings)
    spec = session.spec
    return ListedSandbox(
        template_id=template,
        sandbox_id=session.id,
        alias=template,
        started_at=utc(session.created_at),
        end_at=end_at(session, state),
        cpu_count=max(1, math.ceil(spec.cpus)),
        memory_mb=spec.memory_mb,
        disk_size_mb=spec.workspace_size_mb,
        state=sandbox_state(session),
        metadata=visible_metadata(session),
    )


def listed_remote(remote: RemoteSession, settings: Settings) -> ListedSandbox:
    """Another gateway's sandbox, from its store row: what it was created with, and
    its lease; its disk is the configured workspace size, and one with no lease
    (made on another face) shows when idle reaping could end it at the soonest."""
    template = templates.template_for(remote.metadata, remote.kernel, remote.image, settings)
    if remote.lease_until is not None:
        ends = remote.lease_until
    elif remote.paused:
        ends = _FAR_FUTURE
    else:
        ends = datetime.now(UTC) + timedelta(seconds=settings.idle_timeout_s)
    return ListedSandbox(
        template_id=template,
        sandbox_id=remote.id,
        alias=template,
        started_at=utc(remote.created_at),
        end_at=ends,
        cpu_count=max(1, math.ceil(remote.cpus or settings.cpus)),
        memory_mb=remote.memory_mb or settings.memory_mb,
        disk_size_mb=settings.workspace_size_mb,
        state="paused" if remote.paused else "running",
        metadata=labels(remote.metadata),
    )


def detail(session: KernelSession, state: GatewayState) -> SandboxDetail:
    lifecycle = Lifecycle(auto_resume=True, on_timeout="pause" if session.on_lease_end == "pause" else "kill")
    return SandboxDetail(
        **listed(session, state).model_dump(),
        lifecycle=lifecycle,
        pause_mode="full" if session.state == "paused" else None,
    )


def created(session: KernelSession, state: GatewayState, token: str) -> CreatedSandbox:
    template = templates.template_of(session, state.settings)
    return CreatedSandbox(
        template_id=template,
        sandbox_id=session.id,
        alias=template,
        envd_access_token=token,
        traffic_access_token=token,
    )


async def find(state: GatewayState, principal: Principal, sandbox_id: str) -> KernelSession:
    """The sandbox if ``principal`` may see it, else E2B's 404 (saying why it is
    gone when the store knows it ended)."""
    try:
        session = state.manager.get(sandbox_id, principal)
    except SessionNotFound:
        raise await gone(state, principal, sandbox_id) from None
    if is_snapshot(session):
        raise not_found(sandbox_id, f"{sandbox_id} is a snapshot, not a sandbox: create a sandbox from it")
    return session


async def gone(state: GatewayState, principal: Principal, sandbox_id: str) -> E2BError:
    record = None
    with contextlib.suppress(KernelGWError):  # the store cannot tell: a plain 404
        record = await state.store.get_session(sandbox_id)
    if record is None or record.ended_at is None or not principal.can_see(record.owner):
        return not_found(sandbox_id)
    when = record.ended_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    reason = record.end_reason or ""
    if reason == LEASE_ENDED_REASON:
        why = (
            f"Sandbox {sandbox_id} was killed when its timeout ran out ({when}). Create it with a longer "
            "timeout, or extend it with set_timeout while it runs."
        )
    elif reason in ("deleted", KILLED_REASON):
        why = f"Sandbox {sandbox_id} was killed ({when})."
    else:
        why = f"Sandbox {sandbox_id} has ended ({when}): {reason}."
    return not_found(sandbox_id, why)


def refuse_unknown(body: BaseModel, what: str) -> None:
    """400 naming the fields of a request this face does not know (never dropped in silence)."""
    if extra := unknown_fields(body):
        raise E2BError(400, f"kernelgw's E2B face does not support {', '.join(map(repr, extra))} in {what}.")
