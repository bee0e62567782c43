"""The FastAPI application: lifespan (settings, backend, sessions) and error mapping."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kernelgw import __version__
from kernelgw.config import Settings
from kernelgw.errors import GatewayNameInUse, KernelGWError, Unauthorized
from kernelgw.runtime.allocator import AllocatorTrimmer
from kernelgw.runtime.backends import Backend, create_backend
from kernelgw.runtime.manager import SessionManager
from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.ownership import InstanceLock
from kernelgw.server import notebook
from kernelgw.server.authenticator import Authenticator
from kernelgw.server.availability import retry_after_s
from kernelgw.server.cutoff import AnswerAtClose
from kernelgw.server.forward import Forwarder
from kernelgw.server.hosts import PageGuard
from kernelgw.server.limits import BodySizeLimit
from kernelgw.server.policy import CodePolicy
from kernelgw.server.proxies import ProxyHeaders
from kernelgw.server.ratelimit import ExecutionRateLimiter
from kernelgw.server.state import GatewayState, install
from kernelgw.server.warm_up import build_routes
from kernelgw.storage import Store
from kernelgw.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "Invalid request: " + "; ".join(parts)


def _client(request: Request) -> str | None:
    return f"{request.client.host}:{request.client.port}" if request.client else None


NBFORMAT_WARM_UP_DELAY_S = 10.0
"""How long after start-up nbformat is imported in a thread. Its import (~0.09 s of
CPU) holds the GIL: started at the bind, it slowed the event loop's steps two- to
fourfold while a restarted gateway's clients sent their health checks and first
executes (the reattached sessions' first execute: p50 84 -> 63 ms, max 156 -> 85 ms)."""


async def _warm_up_nbformat() -> None:
    await asyncio.sleep(NBFORMAT_WARM_UP_DELAY_S)
    await asyncio.to_thread(notebook.warm_up)


def routers() -> tuple[APIRouter, ...]:
    """The app's routers, in the order their routes are matched (imports them)."""
    from kernelgw.server import auth as auth_routes
    from kernelgw.server import docs, gateways, web
    from kernelgw.server.e2b import control as e2b_control
    from kernelgw.server.e2b import envd as e2b_envd
    from kernelgw.server.e2b import envd_files as e2b_envd_files
    from kernelgw.server.e2b import envd_process as e2b_envd_process
    from kernelgw.server.e2b import envd_watch as e2b_envd_watch
    from kernelgw.server.e2b import interpreter as e2b_interpreter
    from kernelgw.server.jupyter import channels as jupyter_channels
    from kernelgw.server.jupyter import rest as jupyter_rest
    from kernelgw.server.v1 import files, history, packages, routes, ws

    return (
        routes.public,
        auth_routes.router,
        routes.router,
        ws.router,
        history.router,
        docs.router,
        gateways.router,  # the cluster's registry (kernelgw.cluster)
        # Jupyter's kernels API (/api/kernelspecs, /api/kernels, channels) on the same sessions
        jupyter_rest.public,
        jupyter_rest.router,
        jupyter_channels.router,
        # E2B's sandbox traffic: the code interpreter (/e2b/execute, /e2b/contexts) and envd's /e2b/health
        e2b_interpreter.router,
        # E2B's envd filesystem service (Connect RPC) and file transfers (/e2b/files)
        e2b_envd_watch.router,  # its watches, before its {method} route
        e2b_envd.router,
        e2b_envd_files.router,
        e2b_envd_process.router,  # envd's process service: commands (Connect RPC)
        # workspace files and packages
        files.router,
        packages.router,
        # the web page at /
        web.router,
        # E2B's control plane (/e2b/v2/sandboxes, ...); last: its catch-all answers the rest of /e2b
        e2b_control.router,
    )


def include_routes(app: FastAPI) -> None:
    """Import the route modules and add their routes (most of an app's build)."""
    for router in routers():
        _add_routes(app, router)


def _add_routes(app: FastAPI, router: APIRouter) -> None:
    """The router's routes, as they are, on the app. FastAPI (0.16x)'s
    ``include_router`` builds each route a second time for the app (when the first
    request walks past it: 0.1 s of CPU at every start for ours), to merge the
    include's own prefix, dependencies and responses, which we never give;
    a router's own are in its routes already."""
    app.router.routes.extend(router.routes)


def _prepare_routes(app: FastAPI, include: bool) -> None:
    """The route thread's work (blocking): the routes when they were deferred, then
    FastAPI's per-route build (`build_routes`)."""
    if include:
        include_routes(app)
    build_routes(app.router)


async def _make_backend(cfg: Settings, given: Backend | None) -> Backend:
    """The given backend, or Docker's, made in a thread: its module imports the
    Docker SDK (requests, charset_normalizer: 70-100 ms of CPU), which then
    overlaps the store's start instead of preceding it."""
    if given is not None:
        return given
    return await asyncio.to_thread(create_backend, cfg)


def create_app(
    settings: Settings | None = None, backend: Backend | None = None, *, defer_routes: bool = False
) -> FastAPI:
    """The gateway's app. ``defer_routes`` (`kernelgw serve`): its routes are added
    by the lifespan, in a thread beside the store's, Docker's and the kernels'
    waits, instead of here before it (~0.14 s of a restart's CPU, in series with
    the rest). uvicorn serves nothing before the lifespan has started, so no
    request sees the app without them; an app whose lifespan is not run (route
    listings, OpenAPI) is made without ``defer_routes``."""

    # routes still to add: by the first lifespan only (an app started again has them)
    deferred = [True] if defer_routes else []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cfg = settings or Settings()
        # before anything touches a container of this name: a live gateway of the
        # same name on this host keeps its kernels (GatewayNameInUse, start refused)
        owner_lock = InstanceLock(cfg.runtime_dir, cfg.gateway_name)
        try:
            await asyncio.to_thread(owner_lock.acquire, f"http://{cfg.host}:{cfg.port}")
        except GatewayNameInUse as exc:
            log.error("%s", exc.message)
            raise
        try:
            async with _gateway(app, cfg, backend):
                yield
        finally:
            owner_lock.release()

    @asynccontextmanager
    async def _gateway(app: FastAPI, cfg: Settings, backend: Backend | None) -> AsyncIterator[None]:
        # Beside the start-up's waits (store, Docker, kernels), one thread after the
        # other (their imports never race): the backend, then the routes (deferred)
        # and their build (the first request need not build them).
        made = asyncio.create_task(_make_backend(cfg, backend), name="backend")
        routes = asyncio.create_task(_routes_after(made), name="route-warm-up")
        try:
            async with _started(app, cfg, made):
                await routes  # before the first request: it would wait for the thread's lock on the loop
                yield
        finally:
            await cancel_and_wait(routes, made)

    async def _routes_after(made: asyncio.Task[Backend]) -> None:
        await asyncio.wait([made])
        await asyncio.to_thread(_prepare_routes, app, deferred.pop() if deferred else False)

    @asynccontextmanager
    async def _started(app: FastAPI, cfg: Settings, made: asyncio.Task[Backend]) -> AsyncIterator[None]:
        # --- history storage (sessions, executions, notes): the manager's recorder
        store = Store.from_settings(cfg)
        await store.start()
        # --- security: keys, rate limits, code policy
        auth = Authenticator(cfg, store)
        code_policy = CodePolicy.from_lists(cfg.policy_deny_imports, cfg.policy_deny_calls, cfg.policy_deny_shell)
        try:
            await auth.check_startup()
            be = await made
        except BaseException:
            await store.close()
            raise
        # ---
        metrics = Metrics()
        manager = SessionManager(cfg, be, recorder=store, metrics=metrics)
        cluster = None
        if cfg.cluster:  # imported here: most gateways are not in one, and it brings httpx
            from kernelgw.cluster.node import Cluster

            cluster = Cluster(cfg, running_sessions=lambda: len(manager))
        if cluster is not None:
            manager.held_elsewhere = cluster.held_elsewhere  # a key's session quota spans the cluster
        lone = None
        if cluster is None and store.dialect == "postgresql":  # a shared store: other gateways' sessions
            from kernelgw.cluster.lone import LoneGateway

            lone = LoneGateway(cfg)
        install(
            app,
            GatewayState(
                settings=cfg,
                backend=be,
                store=store,
                auth=auth,
                rate_limiter=ExecutionRateLimiter(),
                code_policy=code_policy,
                metrics=metrics,
                manager=manager,
                cluster=cluster,
                lone=lone,
            ),
        )
        if cluster is not None:  # another host's live gateway of this name: refused before any kernel is touched
            try:
                await cluster.registry.check_name()
            except BaseException as exc:
                if isinstance(exc, GatewayNameInUse):
                    log.error("%s", exc.message)
                await cluster.close(registered=False)
                await store.close()
                raise
        try:
            await manager.start()
        except KernelGWError as exc:
            log.error("could not clean up after a previous gateway: %s", exc.message)
        if cluster is not None:  # after the reattach: peers forward to this gateway once it is live
            await cluster.start()
        if lone is not None:
            await lone.warn_if_shared()
        # later: the first notebook export need not import it, nor the first answers wait on it
        warming = asyncio.create_task(_warm_up_nbformat(), name="nbformat-warm-up")
        trimming = asyncio.create_task(AllocatorTrimmer().run(), name="allocator-trim")
        try:
            yield
        finally:
            await cancel_and_wait(warming, trimming)
            from kernelgw.server.e2b.envd_process import close_commands  # with the routers: imported late

            await close_commands(app)  # E2B's running commands: their readers stop, their connections close
            if cluster is not None:
                await cluster.close()
            if lone is not None:
                await lone.close()
            await manager.shutdown()
            await be.close()
            await store.close()

    app = FastAPI(
        title="kernelgw",
        version=__version__,
        description="Stateful, sandboxed IPython kernels for AI agents.",
        lifespan=lifespan,
        # served by kernelgw.server.docs instead, behind the key when keys exist
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )

    @app.exception_handler(KernelGWError)
    async def _gw_error(request: Request, exc: KernelGWError) -> JSONResponse:
        response = error_response(exc.status_code, exc.code, exc.message)
        if (retry_after := retry_after_s(exc)) is not None:
            response.headers["Retry-After"] = str(retry_after)
        elif isinstance(exc, Unauthorized):
            response.headers["WWW-Authenticate"] = 'Bearer realm="kernelgw"'
            log.warning("unauthorized request", extra={"path": request.url.path, "client": _client(request)})
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_request", _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    app.add_middleware(Forwarder)  # inside PageGuard: Host and Origin are checked where requests land
    app.add_middleware(BodySizeLimit)  # before anything reads a body: unauthenticated ones are not read
    app.add_middleware(PageGuard)  # before routing, for every route and WebSocket
    app.add_middleware(ProxyHeaders)  # the client's address as every check sees it
    app.add_middleware(AnswerAtClose)  # outermost: every request is answered by the drain's end
    if not defer_routes:
        include_routes(app)
    return app
