"""`DrainingServer`: uvicorn, with SIGTERM starting a drain instead of an exit,
and connections that must send their headers in time.

uvicorn's own handling stops accepting connections at the first SIGTERM (so
``/healthz`` refuses), waits for requests without bound, ignores a second
SIGTERM and ends WebSockets with 1012 before their cells' ``done``. Here the
first SIGTERM or SIGINT starts the gateway's `Drain` (new work refused,
``/readyz`` 503, ``/healthz`` still answering), waits for running cells up to
``shutdown_grace_s``, closes the WebSockets after their events, and only then
asks uvicorn to exit; a second signal exits at once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import sys
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette

from kernelgw.config import Settings
from kernelgw.server.state import find_gateway_state
from kernelgw.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0005
"""How long another thread (the history writer's, the WAL checkpoint's) may hold
the GIL while the event loop waits for it (CPython's default: 5 ms). The loop
is what answers; those threads give the GIL back at their next blocking call
anyway, so a shorter interval only bounds the time between."""
CLOSE_WAIT_S = 10
"""After the drain, how long connections have to finish (uvicorn's ``timeout_graceful_shutdown``)."""


def uvicorn_config(app: Starlette, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """The gateway's uvicorn options (``kernelgw serve`` and the tests' servers)."""
    options: dict[str, Any] = dict(
        host=settings.host,
        port=settings.port,
        http=header_deadline_protocol(settings.header_timeout_s),
        ws="websockets-sansio",  # uvicorn's implementation on websockets' maintained API
        ws_max_size=settings.ws_max_message_bytes,  # a bigger frame: close 1009
        timeout_keep_alive=settings.keepalive_timeout_s,
        log_config=None,  # uvicorn's loggers go through ours (JSON or text)
        timeout_graceful_shutdown=CLOSE_WAIT_S,
        # uvicorn would believe X-Forwarded-For from 127.0.0.1 (any local process):
        # kernelgw.server.proxies believes only ``trusted_proxies``
        proxy_headers=False,
    )
    options.update(overrides)
    return uvicorn.Config(app, **options)


class HeaderDeadline:
    """A connection must complete each request's headers within ``header_timeout_s``
    of opening or of its previous response, else it is closed. uvicorn has no such
    limit (its keep-alive timer restarts at every byte), so a client dripping a
    header byte now and then held a connection, and its file descriptor, forever;
    a thousand such clients exhausted the gateway. A request whose headers
    arrived runs as long as it needs (a long cell, a WebSocket)."""

    header_timeout_s: float
    _header_timer: asyncio.TimerHandle | None = None
    # set by the uvicorn protocol this is mixed into
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._disarm()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        self._awaited = self.cycle  # a new cycle starts once a request's headers are complete
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        protocol: object = self.transport.get_protocol()
        if self.transport.is_closing() or protocol is not self:
            return  # closed, or upgraded to a WebSocket
        if self.cycle is self._awaited:
            log.info("closing a connection that sent no complete request headers in %gs", self.header_timeout_s)
            self.transport.close()


def header_deadline_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools when installed, as uvicorn would pick)
    with `HeaderDeadline`."""
    base: type[asyncio.Protocol]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # pragma: no cover - httptools is a dependency of uvicorn[standard]
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    return type("HeaderDeadlineProtocol", (HeaderDeadline, base), {"header_timeout_s": header_timeout_s})


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: Starlette, grace_s: float) -> None:
        super().__init__(config)
        self._app = app
        self._grace_s = grace_s
        self._signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drainer: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        # from the lifespan on: its threads (the backend's and the routes' imports)
        # run beside the loop's start-up steps, which must not wait 5 ms for the GIL
        # at each of their wake-ups
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        try:
            await super().serve(sockets)
        finally:
            await cancel_and_wait(self._drainer)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not gc.isenabled():  # `kernelgw serve` paused it for its start-up
            gc.freeze()  # what start-up made lives as long as the process: never scan it again
            gc.enable()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler (main thread, between any two bytecodes: hand over to the loop)."""
        self._signals += 1
        if self._loop is None or self._loop.is_closed():
            self.should_exit = True
            return
        self._loop.call_soon_threadsafe(self._on_signal, signal.Signals(sig).name)

    def _on_signal(self, name: str) -> None:
        state = find_gateway_state(self._app)
        if self._signals > 1 or self._drainer is not None:
            log.warning("%s again: exiting now, without waiting for running cells", name)
            self.force_exit = True
            self.should_exit = True
            if self._drainer is not None:
                self._drainer.cancel()
            return
        if state is None or not self.started:  # still starting: nothing to drain
            self.should_exit = True
            return
        log.warning("%s: draining (new work refused, up to %gs for running cells)", name, self._grace_s)
        self._drainer = asyncio.create_task(self._drain_then_exit(), name="drain")

    async def _drain_then_exit(self) -> None:
        state = find_gateway_state(self._app)
        assert state is not None
        try:
            await state.drain.run(state.manager, self._grace_s)
        finally:
            self.should_exit = True
