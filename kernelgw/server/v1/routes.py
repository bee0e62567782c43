"""REST endpoints. Thin: validation at the edge, work in the session manager."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from kernelgw import events as ev
from kernelgw.errors import SessionBusy
from kernelgw.kernels import profile
from kernelgw.models import (
    CreatedSession,
    CreateSession,
    ErrorResponse,
    ExecuteRequest,
    ExecuteResponse,
    Health,
    InterruptResponse,
    KernelList,
    PausedSession,
    RestartedSession,
    RestartRequest,
    ResumedSession,
    ResumeRequest,
    SessionInfo,
    SessionList,
)
from kernelgw.runtime.lineage import ReplayReport
from kernelgw.runtime.manager import SessionManager, SessionOptions
from kernelgw.runtime.pause import NamespaceSummary
from kernelgw.server.admission import admit
from kernelgw.server.auth import authenticate, principal_of, require_admin, session_for
from kernelgw.server.availability import DEFAULT_RETRY_AFTER_S, check_available, unready_reasons
from kernelgw.server.drain import cut_off_response, until_done_or_closing
from kernelgw.server.state import gateway_state
from kernelgw.server.v1 import history

_errors: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 409, 413, 422, 429, 503)
}
public = APIRouter(responses=_errors)
"""Reachable without a key: the health check only."""
router = APIRouter(responses=_errors, dependencies=[Depends(authenticate)])


def _manager(request: Request) -> SessionManager:
    return gateway_state(request).manager


async def _health(request: Request) -> tuple[Health, bool]:
    """The health body, and whether kernels can start (engine and image)."""
    state = gateway_state(request)
    settings = state.settings
    health = await state.backend.health(settings.image)
    kernels = health.engine and health.image
    storage = state.store.health
    body = Health(
        status="ok" if kernels and storage.ok else "degraded",
        engine=health.engine,
        image=health.image,
        image_name=settings.image,
        runtime=settings.runtime,
        sessions=len(_manager(request)),
        detail="; ".join(x for x in (health.detail, *unready_reasons(state)) if x),
        storage=storage.describe(),
        draining=state.drain.draining,
    )
    return body, kernels


@public.get("/healthz", response_model=Health, tags=["gateway"])
async def healthz(request: Request) -> Response:
    """Liveness: 503 only when kernels cannot start (engine or image missing).

    A storage fault is ``degraded`` with 200 (restarting the process does not
    free a disk), and a drain is 200 too (the process is finishing cells)."""
    body, kernels = await _health(request)
    return _health_response(body, kernels)


@public.get("/readyz", response_model=Health, tags=["gateway"])
async def readyz(request: Request) -> Response:
    """Readiness: 200 when new sessions and executions are taken, else 503 (draining,
    storage cannot write or does not answer, engine or image missing); ``detail`` says why."""
    body, kernels = await _health(request)
    state = gateway_state(request)
    ready = kernels and not unready_reasons(state)
    if not await state.store.answers():
        ready = False
        why = "storage: the database does not answer"
        body = body.model_copy(update={"status": "degraded", "detail": "; ".join(x for x in (body.detail, why) if x)})
    return _health_response(body, ready)


def _health_response(body: Health, ok: bool) -> JSONResponse:
    if ok:
        return JSONResponse(body.model_dump())
    return JSONResponse(body.model_dump(), status_code=503, headers={"Retry-After": str(DEFAULT_RETRY_AFTER_S)})


@router.get("/metrics", tags=["gateway"], response_class=Response, dependencies=[Depends(require_admin)])
async def metrics(request: Request) -> Response:
    """Prometheus metrics: sessions, pool, executions by status, latencies, output bytes."""
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(gateway_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.post("/v1/sessions", status_code=201, response_model=CreatedSession, tags=["sessions"])
async def create_session(body: CreateSession, request: Request) -> dict[str, Any]:
    """Start a kernel in a new network-less container (a warm one when pooled).

    With ``notebook`` or ``from_session`` the session is restored: the code cells
    are replayed in order before it is returned, and ``replay`` reports each one.
    With ``from`` it is a fork of a session of the same key: files copied,
    state replayed, reported in ``fork``; a paused source gives its snapshot
    instead (files and variables, no replay) and stays paused."""
    opts = SessionOptions(
        memory_mb=body.memory_mb,
        cpus=body.cpus,
        timeout=body.timeout,
        image=body.image,
        env=body.env,
        runtime=body.runtime,
        auto_replay=body.auto_replay,
        kernel=body.kernel,
        metadata=body.metadata,
    )
    check_available(gateway_state(request))  # not while draining or while the store cannot write
    if body.fork_of is not None:
        source = session_for(request, body.fork_of)  # another key's session is not found
        session, fork = await _manager(request).fork(source, opts, principal_of(request))
        namespace = _namespace_json(fork.namespace) if fork.namespace is not None else None
        made = {**dataclasses.asdict(fork), "replay": _replay_json(fork.replay), "namespace": namespace}
        return {**session.info(), "fork": made}
    steps = await history.restore_plan(body, request)  # validated before a kernel starts
    session = await _manager(request).create(opts, principal_of(request))
    if steps is None:
        return session.info()
    report = await history.create_restored(_manager(request), session, steps)
    return {**session.info(), "replay": report}


@router.get("/v1/kernels", response_model=KernelList, tags=["sessions"])
async def list_kernels(request: Request) -> dict[str, Any]:
    """The kernels (languages) sessions may ask for with ``kernel`` on create."""
    state = gateway_state(request)
    settings = state.settings
    kernels = []
    for name in settings.kernels:
        p = profile(name)
        image = settings.kernel_image(name)
        health = await state.backend.health(image)
        kernels.append(
            {
                "name": name,
                "display_name": p.display_name,
                "language": p.language,
                "keeps_state": p.keeps_state,
                "default": name == settings.default_kernel,
                "image": image,
                "available": health.engine and health.image,
                "file_extension": p.file_extension,
                "packages": p.python,
            }
        )
    return {"kernels": kernels}


@router.get("/v1/sessions", response_model=SessionList, tags=["sessions"])
async def list_sessions(request: Request) -> dict[str, Any]:
    principal = principal_of(request)
    local = [s.info() for s in _manager(request).list(principal)]
    cluster = gateway_state(request).cluster
    remote = [s.info() for s in await cluster.remote_sessions(principal)] if cluster is not None else []
    return {"sessions": local + remote}


@router.get("/v1/sessions/{session_id}", response_model=SessionInfo, tags=["sessions"])
async def get_session(session_id: str, request: Request) -> dict[str, Any]:
    return session_for(request, session_id).info()


@router.delete("/v1/sessions/{session_id}", status_code=204, tags=["sessions"])
async def delete_session(session_id: str, request: Request) -> Response:
    """Stop the kernel and remove its container and connection directory."""
    session_for(request, session_id)
    await _manager(request).delete(session_id)
    return Response(status_code=204)


@router.post("/v1/sessions/{session_id}/execute", response_model=ExecuteResponse, tags=["execution"])
async def execute(session_id: str, body: ExecuteRequest, request: Request) -> Response:
    """Run a cell and wait for it; returns the same events the WebSocket streams."""
    session = session_for(request, session_id)
    await admit(gateway_state(request), principal_of(request), body.code, session.spec.kernel)
    rec = session.submit(body.code, execution_id=body.execution_id, timeout=body.timeout, replayable=body.replay)
    rec.retain_output = True  # answered whole below: its stored chunks stay in memory too
    state = gateway_state(request)
    done = await until_done_or_closing(rec.done, state.drain)
    if done is None:  # the drain's grace is over: no request holds the process past it
        return cut_off_response(session_id, rec.execution_id, state.settings.on_shutdown)
    # Events were serialised once when published; splice them instead of re-encoding.
    head = ExecuteResponse(
        execution_id=rec.execution_id,
        status=done.status,
        execution_count=done.execution_count,
        duration_ms=done.duration_ms,
        events=[],
    ).model_dump_json()
    text = "".join([head[: -len("[]}")], ev.json_array(p.json for p in rec.published), "}"])
    return Response(text, media_type="application/json")


@router.post(
    "/v1/sessions/{session_id}/interrupt", status_code=202, response_model=InterruptResponse, tags=["execution"]
)
async def interrupt(session_id: str, request: Request) -> dict[str, bool]:
    """Send SIGINT to the kernel if a cell is running."""
    return {"interrupted": await session_for(request, session_id).interrupt()}


@router.post("/v1/sessions/{session_id}/restart", response_model=RestartedSession, tags=["sessions"])
async def restart(session_id: str, request: Request, body: RestartRequest | None = None) -> dict[str, Any]:
    """Replace the kernel with a fresh one; all variables are lost.

    With ``{"replay": true}`` the cells that built the old kernel's state run
    again in the new one (before any cell sent meanwhile), streaming their
    events to watchers; the answer comes after the replay, with its report."""
    session = session_for(request, session_id)
    if body is None or not body.replay:
        await session.restart()
        return session.info()
    report = await session.restart(replay=True)
    return {**session.info(), "replay": _replay_json(report) if report is not None else None}


@router.post("/v1/sessions/{session_id}/pause", response_model=PausedSession, tags=["sessions"])
async def pause(session_id: str, request: Request) -> dict[str, Any]:
    """Free the session's container and keep its state on the gateway's disk: the
    workspace, the installed packages and the kernel's variables (pickled one by
    one; ``namespace.failed`` names what could not be). The next request that
    needs the kernel (execute, files, packages) or ``/resume`` brings it back.
    413 when the snapshot would pass the session's tmpfs sizes, 507 when the
    gateway's budget for paused sessions is used up: the session then runs on."""
    session = session_for(request, session_id)
    paused = await _manager(request).pause(session)
    return {
        **session.info(),
        "namespace": _namespace_json(paused.namespace),
        "stored_bytes": paused.stored_bytes,
        "duration_ms": paused.duration_ms,
    }


@router.post("/v1/sessions/{session_id}/resume", response_model=ResumedSession, tags=["sessions"])
async def resume(session_id: str, request: Request, body: ResumeRequest | None = None) -> dict[str, Any]:
    """Start a kernel with what the pause saved. 409 when the session is not paused."""
    session = session_for(request, session_id)
    resumed = await session.resume(replay=body is not None and body.replay)
    if resumed is None:
        raise SessionBusy(f"The session is not paused (it is {session.state}).")
    return {
        **session.info(),
        "namespace": _namespace_json(resumed.namespace),
        "restored_bytes": resumed.restored_bytes,
        "duration_ms": resumed.duration_ms,
        "replay": _replay_json(resumed.replay) if resumed.replay is not None else None,
    }


def _namespace_json(summary: NamespaceSummary) -> dict[str, Any]:
    return {"names": summary.done, "modules": summary.modules, "failed": summary.failed, "bytes": summary.bytes}


def _replay_json(report: ReplayReport) -> dict[str, Any]:
    return {**dataclasses.asdict(report), "replayed": report.replayed, "complete": report.complete}
