"""The app's routes as data, so tests follow the app instead of a hand-kept list."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.routing import BaseRoute, Route

PUBLIC = frozenset(
    {
        ("GET", "/healthz"),
        ("GET", "/readyz"),  # load balancers' readiness probe, like /healthz
        ("GET", "/api"),  # Jupyter's API version, public as in Jupyter Server
        # the web page and its assets (it asks for a key itself)
        ("GET", "/"),
        ("GET", "/favicon.ico"),
        ("GET", "/static/{name}"),
    }
)
"""Everything reachable without a key. Anything else must answer 401 without one."""

SAMPLE_PARAMS = {
    "session_id": "0123456789abcdef",
    "kernel_id": "01234567-89ab-cdef-0123-456789abcdef",
    "path": "a.txt",
    "key_id": "0123456789ab",
    "name": "app.js",
    "resource": "logo-64x64.png",
    "sandbox_id": "0123456789abcdef",
    "template_id": "base",
    "context_id": "python",
    "method": "Stat",  # envd's Connect calls: /e2b/filesystem.Filesystem/{method}
}


@dataclass(frozen=True)
class Endpoint:
    method: str  # "WS" for a WebSocket
    path: str  # as declared, e.g. /v1/sessions/{session_id}

    def url(self, **params: str) -> str:
        """The path with every parameter filled in (``SAMPLE_PARAMS`` unless given)."""
        values = {**SAMPLE_PARAMS, **params}
        return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: values[m.group(1)], self.path)

    @property
    def template(self) -> str:
        """The path with ``{name:path}`` converters dropped: ``/files/{path}``."""
        return re.sub(r"\{(\w+):\w+\}", r"{\1}", self.path)


def _routes(routes: Iterable[BaseRoute], prefix: str = "") -> Iterator[tuple[str, BaseRoute]]:
    """(prefix, route) for every route, also inside included routers: FastAPI
    0.16x keeps an included router as one entry (``original_router``) instead
    of copying its routes into the app's list."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            context = getattr(route, "include_context", None)
            yield from _routes(inner.routes, prefix + str(getattr(context, "prefix", "")))
        else:
            yield prefix, route


def endpoints(app: FastAPI) -> list[Endpoint]:
    """Every method and path the app answers (HEAD left out), WebSockets as ``WS``."""
    found: set[Endpoint] = set()
    for prefix, route in _routes(app.routes):
        if isinstance(route, APIWebSocketRoute):
            found.add(Endpoint("WS", prefix + route.path))
        elif isinstance(route, (APIRoute, Route)):
            for method in route.methods or ():
                if method != "HEAD":
                    found.add(Endpoint(method, prefix + route.path))
    return sorted(found, key=lambda e: (e.path, e.method))


DOCS = frozenset({"/openapi.json", "/docs", "/redoc"})


def face(endpoint: Endpoint) -> str:
    """Which face answers: ``jupyter`` (``{message, reason}`` errors), ``e2b``
    (``{code, message}``), ``docs`` (the API description, whose 401 hints at
    ``?token=``) or ``v1``. A 401 is the same for every credential within one face."""
    if endpoint.template.startswith(("/api/", "/kernelspecs/")):
        return "jupyter"
    if endpoint.template.startswith("/e2b/"):
        return "e2b"
    return "docs" if endpoint.template in DOCS else "v1"


def sandbox_traffic() -> frozenset[tuple[str, str]]:
    """E2B's sandbox traffic (the code interpreter, envd's files and commands): no key, the
    sandbox's access token instead; without it, E2B's 502 of a sandbox not found
    (a Connect error of the same meaning on envd's RPC)."""
    from kernelgw.server.e2b import envd, envd_files, envd_process, envd_watch, interpreter

    return frozenset(
        (method, route.path)
        for router in (interpreter.router, envd_watch.router, envd.router, envd_files.router, envd_process.router)
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
        if method != "HEAD"
    )


def protected(app: FastAPI) -> list[Endpoint]:
    """The routes that need a key (not public, not sandbox traffic)."""
    token_only = sandbox_traffic()
    return [e for e in endpoints(app) if (e.method, e.template) not in PUBLIC | token_only]
