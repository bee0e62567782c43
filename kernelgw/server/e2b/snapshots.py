"""E2B's snapshots as paused kernelgw sessions.

A snapshot of a sandbox is a fork of it, paused at once: its files, installed
packages and variables kept on the gateway's disk (kernelgw's pause), its
container freed. Its id is that session's; ``Sandbox.create(snapshot_id)`` (or
its name) forks a new sandbox from it, which starts from the snapshot's files
and variables without replaying anything; the snapshot stays as it is, for
the next one. Deleting it (``DELETE /templates/{id}``, as E2B's SDK does) ends
the session.

What differs from E2B: the state kept is the variables a pause keeps
(pickled; what cannot be pickled is not kept) and the files, taken between
cells (`SessionManager.fork` with ``copy_state``); while a cell runs, the snapshot is made by
replaying the finished cells instead (kernelgw's fork). E2B's memory snapshot
keeps the running processes themselves.
A snapshot holds a session: it counts against the key's and the gateway's
session limits, and ends after ``paused_ttl_s`` like any paused session. It
is not a sandbox: lists, get and connect do not show it, and it has no access
token, so no sandbox traffic reaches it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from kernelgw.errors import NotForThisKernel, SessionNotFound
from kernelgw.keys import Principal
from kernelgw.runtime.manager import SessionOptions
from kernelgw.runtime.session import KernelSession
from kernelgw.server.availability import check_available
from kernelgw.server.e2b import listing, templates
from kernelgw.server.e2b.auth import Caller, authenticate
from kernelgw.server.e2b.errors import E2BError, E2BRoute
from kernelgw.server.e2b.models import RESERVED_PREFIX, SnapshotInfo, SnapshotRequest
from kernelgw.server.e2b.wire import SNAPSHOT_OF_KEY, find, is_snapshot, refuse_unknown, utc
from kernelgw.server.state import GatewayState, gateway_state

router = APIRouter(route_class=E2BRoute, tags=["e2b"])
"""Included by `kernelgw.server.e2b.control`'s router, under its ``/e2b``."""

SNAPSHOT_NAME_KEY = RESERVED_PREFIX + "snapshot-name"
DELETED_REASON = "snapshot deleted through E2B's API"


def info(session: KernelSession) -> SnapshotInfo:
    return info_of(session.id, session.metadata)


def info_of(snapshot_id: str, metadata: Mapping[str, str]) -> SnapshotInfo:
    name = metadata.get(SNAPSHOT_NAME_KEY)
    return SnapshotInfo(snapshot_id=snapshot_id, names=[name] if name else [])


def lookup(state: GatewayState, principal: Principal, ref: str) -> KernelSession | None:
    """The snapshot ``ref`` names (its id, else the newest of that name) among those
    ``principal`` may see, or None."""
    try:
        session = state.manager.get(ref, principal)
    except SessionNotFound:
        named = [
            s for s in state.manager.list(principal) if is_snapshot(s) and s.metadata.get(SNAPSHOT_NAME_KEY) == ref
        ]
        return max(named, key=lambda s: (utc(s.created_at), s.id), default=None)
    return session if is_snapshot(session) else None


@dataclass(frozen=True)
class NamedSnapshot:
    snapshot_id: str
    gateway_name: str | None
    """The gateway of the cluster holding it; None: this one."""


async def newest_named(state: GatewayState, principal: Principal, name: str) -> NamedSnapshot | None:
    """The newest snapshot called ``name`` that ``principal`` has on any gateway
    of the cluster: where a create from it (or its delete) must go, since
    `lookup` on a gateway sees that gateway's snapshots only. None when no
    snapshot has that name. A template's id names none (no snapshot may be
    called so): the caller asks `templates.templates` first, before it
    authenticates anyone."""
    found: list[tuple[datetime, str, str | None]] = [
        (utc(s.created_at), s.id, None)
        for s in state.manager.list(principal)
        if is_snapshot(s) and s.metadata.get(SNAPSHOT_NAME_KEY) == name
    ]
    if state.cluster is not None:
        found += [
            (utc(r.created_at), r.id, r.gateway_name)
            for r in await state.cluster.remote_sessions(principal)
            if SNAPSHOT_OF_KEY in r.metadata and r.metadata.get(SNAPSHOT_NAME_KEY) == name
        ]
    if not found:
        return None
    _, snapshot_id, gateway_name = max(found, key=lambda row: (row[0], row[1]))
    return NamedSnapshot(snapshot_id, gateway_name)


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
async def create_snapshot(
    sandbox_id: str, request: Request, body: SnapshotRequest | None = None, caller: Caller = Depends(authenticate)
) -> JSONResponse:
    """Snapshot a sandbox (it runs on unchanged): a fork of its state (not of its
    cells: `SessionManager.fork`'s ``copy_state``), paused."""
    body = body or SnapshotRequest()
    refuse_unknown(body, "the snapshot request")
    if body.memory is False:
        raise E2BError(
            400,
            "A filesystem-only snapshot (mode 'filesystem') is not supported: a kernelgw snapshot keeps the "
            "files and the kernel's variables. Snapshot without it.",
        )
    state = gateway_state(request)
    if body.name and body.name in templates.templates(state.settings):
        raise E2BError(400, f"{body.name!r} names a template of this gateway; give the snapshot another name.")
    source = await find(state, caller.principal, sandbox_id)
    check_available(state)
    metadata = {templates.TEMPLATE_KEY: templates.template_of(source, state.settings), SNAPSHOT_OF_KEY: source.id}
    if body.name:
        metadata[SNAPSHOT_NAME_KEY] = body.name
    snapshot, _ = await state.manager.fork(source, SessionOptions(metadata=metadata), caller.principal, copy_state=True)
    try:
        await state.manager.pause(snapshot, reason="an E2B snapshot")
    except BaseException as exc:
        with contextlib.suppress(SessionNotFound):
            await state.manager.delete(snapshot.id, reason="the snapshot could not be paused")
        if isinstance(exc, NotForThisKernel):
            raise E2BError(
                400, f"Only Python sandboxes can be snapshotted: {exc.message}", error_code=exc.code
            ) from None
        raise
    return JSONResponse(info(snapshot).wire(), status_code=201)


@router.get("/snapshots")
async def list_snapshots(
    request: Request,
    caller: Caller = Depends(authenticate),
    sandbox_id: str | None = Query(None, alias="sandboxID"),
    name: str | None = None,
    next_token: str | None = Query(None, alias="nextToken"),
    limit: int = Query(listing.DEFAULT_LIMIT, ge=1, le=listing.DEFAULT_LIMIT),
) -> Response:
    """The key's snapshots (those other gateways of a cluster hold too), newest
    first, ``limit`` at a time (``X-Next-Token``)."""
    state = gateway_state(request)
    cursor = listing.Cursor.decode(next_token) if next_token else None
    every = [(s.id, utc(s.created_at), s.metadata) for s in state.manager.list(caller.principal)]
    if state.cluster is not None:
        every += [(r.id, utc(r.created_at), r.metadata) for r in await state.cluster.remote_sessions(caller.principal)]
    found = [
        (sid, created, metadata)
        for sid, created, metadata in every
        if SNAPSHOT_OF_KEY in metadata
        and (sandbox_id is None or metadata.get(SNAPSHOT_OF_KEY) == sandbox_id)
        and (name is None or name in (sid, metadata.get(SNAPSHOT_NAME_KEY)))
    ]
    found.sort(key=lambda row: (row[1], row[0]), reverse=True)
    if cursor is not None:
        found = [row for row in found if (row[1], row[0]) < (cursor.started_at, cursor.sandbox_id)]
    page = found[:limit]
    headers = {}
    if len(found) > limit:
        headers["X-Next-Token"] = listing.Cursor(page[-1][1], page[-1][0]).encode()
    return JSONResponse([info_of(sid, metadata).wire() for sid, _, metadata in page], headers=headers)


@router.delete("/templates/{template_id:path}", status_code=204)
async def delete_snapshot(template_id: str, request: Request, caller: Caller = Depends(authenticate)) -> Response:
    """Delete a snapshot (E2B's SDK deletes one as a template). Templates are the gateway's setting."""
    state = gateway_state(request)
    snapshot = lookup(state, caller.principal, template_id)
    if snapshot is not None:
        try:
            await state.manager.delete(snapshot.id, reason=DELETED_REASON)
        except SessionNotFound:
            pass  # a concurrent delete, or paused_ttl_s, came first: it is gone all the same
        return Response(status_code=204)
    if template_id in templates.templates(state.settings):
        raise E2BError(
            400,
            f"Template {template_id!r} is part of this gateway's configuration (e2b_templates); it cannot be deleted "
            "through the API.",
        )
    raise E2BError(404, f"No snapshot or template {template_id!r}", error_code="snapshot_not_found")


async def fork_from(
    state: GatewayState, snapshot: KernelSession, options: SessionOptions, principal: Principal
) -> KernelSession:
    """A new sandbox from a snapshot: its files and variables, no replay (the snapshot stays)."""
    try:
        session, _ = await state.manager.fork(snapshot, options, principal)
    except SessionNotFound:
        raise E2BError(404, f"Snapshot {snapshot.id} was deleted meanwhile", error_code="snapshot_not_found") from None
    return session
