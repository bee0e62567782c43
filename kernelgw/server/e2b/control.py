"""E2B's control plane under ``/e2b``: sandboxes as kernelgw sessions.

Create, get, list, kill, set timeout, refresh, pause, resume, connect, fork
and the network update, as E2B's OpenAPI spec defines them and its SDKs call
them; snapshots are `kernelgw.server.e2b.snapshots`', the rest of E2B's API
`kernelgw.server.e2b.unserved`'s. A sandbox is one session (its id is the
session's); everything below the wire is the runtime's, as on ``/v1``:
``state.manager`` creates (limits, quotas, audit, the warm pool), owns (another
key's sandbox is a 404), pauses, forks and ends sessions, and enforces the
lease the sandbox's ``timeout`` sets.

What a network-less sandbox cannot give (internet access, public ports, an
egress proxy, MCP, volumes, workload identity) is a 400 that names it, as is
any field of a request this face does not know. A sandbox that ended is a 404
that says why when the store knows (its timeout ran out, it was killed).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

import orjson
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from kernelgw.cluster.listing import RemoteSession
from kernelgw.errors import KernelGWError, NotForThisKernel, SessionBusy, SessionNotFound, WorkspaceUnreadable
from kernelgw.kernels import profile
from kernelgw.models import check_env
from kernelgw.runtime.manager import SessionOptions
from kernelgw.runtime.session import KernelSession
from kernelgw.server.availability import check_available
from kernelgw.server.e2b import listing, metrics, snapshots, templates, unserved
from kernelgw.server.e2b.auth import ACCESS_NONCE_KEY, Caller, access_token, authenticate, new_access
from kernelgw.server.e2b.envd import HOME
from kernelgw.server.e2b.errors import E2BError, E2BRoute
from kernelgw.server.e2b.models import (
    RESERVED_PREFIX,
    ConnectRequest,
    ForkRequest,
    ForkResult,
    ListedSandbox,
    NetworkConfig,
    NetworkUpdate,
    NewSandbox,
    NewSandboxV1,
    PauseRequest,
    RefreshRequest,
    ResumeRequest,
    TimeoutRequest,
)
from kernelgw.server.e2b.sandbox import TIMEOUT_KEY
from kernelgw.server.e2b.wire import KILLED_REASON, created, detail, find, gone, refuse_unknown, sandbox_state
from kernelgw.server.state import GatewayState, gateway_state

router = APIRouter(prefix="/e2b", route_class=E2BRoute, tags=["e2b"])

REFRESH_MIN_S = 15
"""E2B's shortest refresh (its default sandbox timeout)."""
IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY = RESERVED_PREFIX + "idempotency-key"
MAX_IDEMPOTENCY_KEY = 255


# ---------------------------------------------------------------- create
_NETWORK_LESS = (
    "kernelgw sandboxes have no network: no internet access, no egress, no public ports or URLs "
    "(the sandbox's code interpreter is reached through the gateway with its access token)"
)


def refuse_network(network: NetworkConfig | NetworkUpdate | None, allow_internet_access: bool | None) -> None:
    """400 for anything that would open the sandbox; settings that keep it closed pass."""
    asked: list[str] = []
    if allow_internet_access:
        asked.append("allow_internet_access=true")
    if network is not None:
        refuse_unknown(network, "network")
        if network.allow_out:
            asked.append("allowOut")
        if network.egress_proxy is not None:
            asked.append("egressProxy")
        if network.rules:
            asked.append("rules")
        if network.dns_servers:
            asked.append("dnsServers")
        if isinstance(network, NetworkConfig):
            if network.allow_public_traffic:
                asked.append("allowPublicTraffic=true")
            if network.mask_request_host is not None:
                asked.append("maskRequestHost")
            if network.https_ports:
                asked.append("httpsPorts")
    if asked:
        raise E2BError(400, f"{_NETWORK_LESS}; refused: {', '.join(asked)}.", error_code="network_not_available")


def refuse_unsupported(body: NewSandbox) -> None:
    refuse_unknown(body, "the create request")
    refuse_network(body.network, body.allow_internet_access)
    for name, value in (("mcp", body.mcp), ("iam", body.iam), ("volumeMounts", body.volume_mounts)):
        if value:
            raise E2BError(
                400, f"kernelgw's E2B face does not support {name!r}: a sandbox here is a network-less kernel."
            )
    if body.auto_resume is not None and not body.auto_resume.enabled:
        raise E2BError(
            400,
            "autoResume false is not supported: a paused kernelgw sandbox resumes on its next request "
            "(connect, or code sent to it). Leave autoResume out.",
        )
    if body.auto_pause and not body.auto_pause_memory:
        raise E2BError(
            400,
            "autoPauseMemory false (a filesystem-only pause) is not supported: kernelgw's pause keeps the "
            "files and the kernel's variables. Leave autoPauseMemory out.",
        )
    if body.timeout <= 0:
        raise E2BError(400, "Timeout must be greater than 0")


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None and not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY:
        raise E2BError(400, f"{IDEMPOTENCY_HEADER} must have 1 to {MAX_IDEMPOTENCY_KEY} characters")
    return key


def _made_for(state: GatewayState, caller: Caller, idempotency_key: str) -> KernelSession | None:
    """The live sandbox an earlier create with this ``Idempotency-Key`` (of this API key) made."""
    for session in state.manager.list(caller.principal):
        if session.owner == caller.principal.key_id and session.metadata.get(IDEMPOTENCY_KEY) == idempotency_key:
            return session
    return None


async def _create(request: Request, body: NewSandbox, caller: Caller) -> JSONResponse:
    """A sandbox of a template (a session of its kernel), or from a snapshot (a fork of
    it). A create that repeats an ``Idempotency-Key`` gets the sandbox the first made
    while it lives (the key is kept in its metadata, so a restart keeps the promise)."""
    state = gateway_state(request)
    refuse_unsupported(body)
    idempotency_key = _idempotency_key(request)
    if idempotency_key is not None and (earlier := _made_for(state, caller, idempotency_key)) is not None:
        token = access_token(caller, earlier)
        if token is not None:
            return JSONResponse(created(earlier, state, token).wire(), status_code=201)
    snapshot = None  # a template id is a template; anything else may name one of the key's snapshots
    if body.template_id not in templates.templates(state.settings):
        snapshot = snapshots.lookup(state, caller.principal, body.template_id)
    if snapshot is not None:
        image, kernel = None, snapshot.spec.kernel  # the fork runs its source's
    else:
        template = templates.resolve(state.settings, body.template_id)
        template = await templates.for_create(state.settings, state.backend, template)
        image, kernel = template.image, template.kernel
    if body.auto_pause and not profile(kernel).python:
        raise E2BError(
            400,
            f"autoPause needs a Python sandbox (its variables are pickled); {body.template_id!r} runs {kernel}. "
            "Leave autoPause out: the sandbox is killed when its timeout runs out.",
        )
    try:
        # E2B's layout: HOME is the user's directory (kernelgw's own sessions keep theirs in /tmp)
        env = {"HOME": HOME, **check_env(dict(body.env_vars or {}))}
    except ValueError as exc:
        raise E2BError(400, f"envVars: {exc}") from None
    access = new_access(caller)
    metadata = {
        **(body.metadata or {}),
        templates.TEMPLATE_KEY: body.template_id,
        ACCESS_NONCE_KEY: access.nonce,
        TIMEOUT_KEY: str(body.timeout),
    }
    if idempotency_key is not None:
        metadata[IDEMPOTENCY_KEY] = idempotency_key
    options = SessionOptions(
        image=image,
        kernel=kernel,
        env=env,
        metadata=metadata,
        lease_s=float(body.timeout),
        on_lease_end="pause" if body.auto_pause else "end",
        access_sha256=access.sha256,
    )
    check_available(state)  # not while draining or while the store cannot write
    if snapshot is not None:
        session = await snapshots.fork_from(state, snapshot, options, caller.principal)
    else:
        session = await state.manager.create(options, caller.principal)
    return JSONResponse(created(session, state, access.token).wire(), status_code=201)


@router.post("/v2/sandboxes", status_code=201)
async def create_v2(request: Request, body: NewSandbox, caller: Caller = Depends(authenticate)) -> JSONResponse:
    """Create a sandbox: a session running the template's kernel, ending (or
    pausing, with ``autoPause``) ``timeout`` seconds from now."""
    return await _create(request, body, caller)


@router.post("/sandboxes", status_code=201)
async def create_v1(request: Request, body: NewSandboxV1, caller: Caller = Depends(authenticate)) -> JSONResponse:
    """The older create (E2B's default timeout there is 15 s)."""
    return await _create(request, body, caller)


# ---------------------------------------------------------------- list
def _listing(items: list[ListedSandbox], headers: dict[str, str] | None = None) -> Response:
    body = orjson.dumps([item.wire() for item in items])
    return Response(body, media_type="application/json", headers=headers)


@router.get("/v2/sandboxes")
async def list_v2(
    request: Request,
    caller: Caller = Depends(authenticate),
    metadata: str | None = None,
    state_filter: str | None = Query(None, alias="state"),
    order: Literal["asc", "desc"] = "desc",
    started_after: datetime | None = Query(None, alias="startedAfter"),
    template: str | None = None,
    next_token: str | None = Query(None, alias="nextToken"),
    limit: int = Query(listing.DEFAULT_LIMIT, ge=1, le=listing.DEFAULT_LIMIT),
) -> Response:
    """The key's sandboxes (running and paused unless ``state`` says), newest first
    unless ``order=asc``, ``limit`` at a time: ``X-Next-Token`` names the next page."""
    state = gateway_state(request)
    states = listing.parse_states(state_filter)
    wanted = listing.parse_metadata_query(metadata) if metadata else {}
    cursor = listing.Cursor.decode(next_token) if next_token else None
    remote = await _remote(state, caller)
    items = listing.filtered(state, caller.principal, wanted, states, started_after, template, remote)
    page, token = listing.paginate(items, order, cursor, limit)
    headers: dict[str, str] = {}
    if token is not None:
        headers["X-Next-Token"] = token
    if "running" in states:
        headers["X-Total-Running"] = str(sum(1 for s in items if s.state == "running"))
    return _listing(page, headers)


@router.get("/sandboxes")
async def list_v1(request: Request, caller: Caller = Depends(authenticate), metadata: str | None = None) -> Response:
    """The older list: running sandboxes only, all of them."""
    state = gateway_state(request)
    wanted = listing.parse_metadata_query(metadata) if metadata else {}
    remote = await _remote(state, caller)
    items = listing.filtered(state, caller.principal, wanted, frozenset({"running"}), None, None, remote)
    return _listing(sorted(items, key=lambda s: (s.started_at, s.sandbox_id), reverse=True))


async def _remote(state: GatewayState, caller: Caller) -> list[RemoteSession]:
    """The sandboxes other gateways of the cluster run for the caller (none alone)."""
    cluster = state.cluster
    return await cluster.remote_sessions(caller.principal) if cluster is not None else []


# ---------------------------------------------------------------- one sandbox
@router.get("/sandboxes/metrics")
async def sandboxes_metrics(
    request: Request, caller: Caller = Depends(authenticate), sandbox_ids: str = Query("")
) -> Response:
    """Matched before ``/sandboxes/{sandbox_id}``, which would take ``metrics`` for an id."""
    return await metrics.sandboxes_metrics(request, caller, sandbox_ids)


@router.get("/sandboxes/{sandbox_id}")
async def get_sandbox(sandbox_id: str, request: Request, caller: Caller = Depends(authenticate)) -> JSONResponse:
    state = gateway_state(request)
    session = await find(state, caller.principal, sandbox_id)
    return JSONResponse(detail(session, state).wire())


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill_sandbox(sandbox_id: str, request: Request, caller: Caller = Depends(authenticate)) -> Response:
    """End the sandbox: its kernel, container and files (a paused one's snapshot too)."""
    state = gateway_state(request)
    await find(state, caller.principal, sandbox_id)
    try:
        await state.manager.delete(sandbox_id, reason=KILLED_REASON)
    except SessionNotFound:  # a concurrent kill or its lease came first
        raise await gone(state, caller.principal, sandbox_id) from None
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(
    sandbox_id: str, body: TimeoutRequest, request: Request, caller: Caller = Depends(authenticate)
) -> Response:
    """The sandbox ends (or pauses) ``timeout`` seconds from now, sooner or later
    than before; 409 while it is paused (no lease runs then)."""
    refuse_unknown(body, "the timeout request")
    state = gateway_state(request)
    session = await find(state, caller.principal, sandbox_id)
    await state.manager.set_lease(session, float(body.timeout))
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes", status_code=204)
async def refresh(
    sandbox_id: str, request: Request, body: RefreshRequest | None = None, caller: Caller = Depends(authenticate)
) -> Response:
    """Keep the sandbox for ``duration`` seconds (at least 15) from now, never shortening its lease."""
    state = gateway_state(request)
    session = await find(state, caller.principal, sandbox_id)
    duration = max(REFRESH_MIN_S, body.duration if body is not None and body.duration is not None else 0)
    await extend_lease(state, session, duration)
    return Response(status_code=204)


async def extend_lease(state: GatewayState, session: KernelSession, seconds: float) -> None:
    """Set the lease to ``seconds`` from now unless it already runs longer."""
    until = datetime.now(UTC) + timedelta(seconds=seconds)
    if session.lease_until is None or session.lease_until < until:
        await state.manager.set_lease(session, seconds)


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
async def pause(
    sandbox_id: str, request: Request, body: PauseRequest | None = None, caller: Caller = Depends(authenticate)
) -> Response:
    """Free the sandbox's container and keep its files and variables (kernelgw's
    pause). 409 when it is paused already (the SDK answers False)."""
    if body is not None:
        refuse_unknown(body, "the pause request")
        if body.memory is False:
            raise E2BError(
                400,
                "A filesystem-only pause (memory false, mode 'filesystem') is not supported: kernelgw's pause "
                "keeps the files and the kernel's variables. Pause without it.",
            )
    state = gateway_state(request)
    session = await find(state, caller.principal, sandbox_id)
    if session.state == "paused":
        raise E2BError(409, f"Sandbox {sandbox_id} is already paused")
    try:
        await state.manager.pause(session)
    except (NotForThisKernel, WorkspaceUnreadable) as exc:  # a 409 would be the SDK's "already paused"
        raise E2BError(400, exc.message, error_code=exc.code) from None
    except SessionBusy as exc:
        if sandbox_state(session) == "paused":
            raise E2BError(409, f"Sandbox {sandbox_id} is already paused") from None
        # a cell runs: paused between cells only. 503 lets the SDK retry until it ends (its request timeout)
        raise E2BError(
            503,
            f"Sandbox {sandbox_id} is running code; kernelgw pauses a sandbox between cells. {exc.message}",
            error_code=exc.code,
            headers={"Retry-After": "1"},
        ) from None
    return Response(status_code=204)


def _refuse_memory_off(memory: bool | None) -> None:
    if memory is False:
        raise E2BError(
            400,
            "Resuming from the filesystem only (memory false, on_resume='reboot') is not supported: a kernelgw "
            "sandbox resumes with its files and variables. Resume without it.",
        )


def _token_for(caller: Caller, session: KernelSession) -> str:
    """The sandbox's access token for ``caller``, or why none can be given."""
    token = access_token(caller, session)
    if token is not None:
        return token
    if ACCESS_NONCE_KEY not in session.metadata:
        raise E2BError(
            409,
            f"Sandbox {session.id} was not created through E2B's API (it is a kernelgw session of another face): "
            "it has no envd access token, so E2B's SDK cannot reach it. Create a sandbox instead.",
        )
    raise E2BError(
        403,
        f"Sandbox {session.id}'s access token derives from the API key that created it: connect with that key.",
    )


async def _resume(session: KernelSession) -> None:
    resumed = await session.resume()
    if resumed is None and session.state == "paused":
        raise E2BError(409, f"Sandbox {session.id} could not be resumed; retry.")


@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect(
    sandbox_id: str, body: ConnectRequest, request: Request, caller: Caller = Depends(authenticate)
) -> JSONResponse:
    """The sandbox, with its access token: a paused one is resumed (201) and gets
    ``timeout`` as its lease; a running one (200) keeps a longer lease it has."""
    refuse_unknown(body, "the connect request")
    _refuse_memory_off(body.memory)
    state = gateway_state(request)
    session = await find(state, caller.principal, sandbox_id)
    token = _token_for(caller, session)
    if session.state == "paused":
        await _resume(session)
        await state.manager.set_lease(session, float(body.timeout))
        return JSONResponse(created(session, state, token).wire(), status_code=201)
    await extend_lease(state, session, float(body.timeout))
    return JSONResponse(created(session, state, token).wire(), status_code=200)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=201)
async def resume(
    sandbox_id: str, request: Request, body: ResumeRequest | None = None, caller: Caller = Depends(authenticate)
) -> JSONResponse:
    """The older resume: a paused sandbox only (409 when it runs), its lease ``timeout``."""
    body = body or ResumeRequest()
    refuse_unknown(body, "the resume request")
    _refuse_memory_off(body.memory)
    state = gateway_state(request)
    session = await find(state, caller.principal, sandbox_id)
    if body.auto_pause is not None and body.auto_pause != (session.on_lease_end == "pause"):
        raise E2BError(400, "autoPause is chosen when a sandbox is created; leave it out of resume.")
    token = _token_for(caller, session)
    if session.state != "paused":
        raise E2BError(409, f"Sandbox {sandbox_id} is already running")
    await _resume(session)
    await state.manager.set_lease(session, float(body.timeout))
    return JSONResponse(created(session, state, token).wire(), status_code=201)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201)
async def fork(
    sandbox_id: str, request: Request, body: ForkRequest | None = None, caller: Caller = Depends(authenticate)
) -> JSONResponse:
    """``count`` new sandboxes from this one (its files copied, the cells that
    built its state replayed; a paused one's snapshot instead); each reports its
    own sandbox or error. The source runs on unchanged."""
    body = body or ForkRequest()
    refuse_unknown(body, "the fork request")
    state = gateway_state(request)
    source = await find(state, caller.principal, sandbox_id)
    check_available(state)
    results = []
    for _ in range(body.count):
        access = new_access(caller)
        metadata = {**source.metadata, ACCESS_NONCE_KEY: access.nonce, TIMEOUT_KEY: str(body.timeout)}
        options = SessionOptions(
            metadata=metadata,
            lease_s=float(body.timeout),
            on_lease_end="pause" if source.on_lease_end == "pause" else "end",
            access_sha256=access.sha256,
        )
        try:
            session, _ = await state.manager.fork(source, options, caller.principal)
        except SessionNotFound:
            raise await gone(state, caller.principal, sandbox_id) from None
        except KernelGWError as exc:
            results.append(ForkResult(error={"code": exc.status_code, "message": exc.message}))
            continue
        results.append(ForkResult(sandbox=created(session, state, access.token)))
    return JSONResponse([r.wire() for r in results], status_code=201)


@router.put("/sandboxes/{sandbox_id}/network", status_code=204)
async def update_network(
    sandbox_id: str, body: NetworkUpdate, request: Request, caller: Caller = Depends(authenticate)
) -> Response:
    """Only rules that keep the sandbox closed pass (they change nothing): it has no network."""
    refuse_network(body, body.allow_internet_access)
    await find(gateway_state(request), caller.principal, sandbox_id)
    return Response(status_code=204)


router.include_router(snapshots.router)
router.include_router(metrics.router)
router.include_router(unserved.router)  # last: its catch-all answers the rest of /e2b
