"""The gateway's shared objects, typed.

Starlette's ``app.state`` takes any attribute and gives back ``Any``; reading
``request.app.state.manager`` all over the server would leave every route
untyped. The lifespan makes one `GatewayState` and `install`s it; routes,
WebSocket and middleware read it with `gateway_state`. This module is the only
place that touches ``app.state``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import HTTPConnection

from kernelgw.config import Settings
from kernelgw.runtime.backends import Backend
from kernelgw.runtime.manager import SessionManager
from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.packages import PackageInstaller
from kernelgw.runtime.workspace import WorkspaceFiles
from kernelgw.server.authenticator import Authenticator
from kernelgw.server.drain import Drain
from kernelgw.server.policy import CodePolicy
from kernelgw.server.ratelimit import ExecutionRateLimiter
from kernelgw.storage import Store

if TYPE_CHECKING:  # made and imported only when the gateway is in a cluster (it brings httpx)
    from kernelgw.cluster.lone import LoneGateway
    from kernelgw.cluster.node import Cluster

_ATTRIBUTE = "gateway"


@dataclass(eq=False)
class GatewayState:
    """What the lifespan makes once and every request shares."""

    settings: Settings
    backend: Backend
    store: Store
    auth: Authenticator
    rate_limiter: ExecutionRateLimiter
    code_policy: CodePolicy
    metrics: Metrics
    manager: SessionManager
    drain: Drain = field(default_factory=Drain)
    """Set by a SIGTERM to `kernelgw serve`: new work refused, then sockets closed."""
    cluster: Cluster | None = None
    """This gateway as one of many (``cluster_secret`` set): registry, peers."""
    lone: LoneGateway | None = None
    """No ``cluster_secret`` on a PostgreSQL store: other gateways' sessions are told apart."""

    @cached_property
    def workspace_files(self) -> WorkspaceFiles:
        """Made on first use: a gateway that never moves files never needs one."""
        s = self.settings
        return WorkspaceFiles(self.backend, max_upload_bytes=s.max_upload_bytes, timeout=s.file_io_timeout_s)

    @cached_property
    def package_installer(self) -> PackageInstaller:
        """Made on first use: most gateways never install a package."""
        s = self.settings
        return PackageInstaller(
            self.backend,
            allowlist=s.package_allowlist,
            wheel_cache_dir=s.wheel_cache_dir,
            allow_download=s.package_download,
            timeout=s.package_install_timeout_s,
        )


def install(app: Starlette, state: GatewayState) -> None:
    """Make ``state`` what `gateway_state` returns for ``app`` (in the lifespan)."""
    setattr(app.state, _ATTRIBUTE, state)


def find_gateway_state(app: Starlette) -> GatewayState | None:
    """The app's state, or None before the lifespan ran (or in an app that is no gateway)."""
    state = getattr(app.state, _ATTRIBUTE, None)
    return state if isinstance(state, GatewayState) else None


def gateway_state(where: HTTPConnection | Starlette) -> GatewayState:
    """The state of the app serving ``where`` (a request, a WebSocket, or the app itself)."""
    app: Starlette = where.app if isinstance(where, HTTPConnection) else where
    state = find_gateway_state(app)
    if state is None:
        raise RuntimeError("the gateway's lifespan has not run: its state is not installed")
    return state
