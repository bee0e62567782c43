"""`DrainingServer`: uvicorn, with SIGTERM starting a drain instead of an exit.

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
import logging
import signal
import socket
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from kernelgw.server.state import find_gateway_state
from kernelgw.tasks import cancel_and_wait

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 10
"""After the drain, how long connections have to finish (uvicorn's ``timeout_graceful_shutdown``)."""


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
        try:
            await super().serve(sockets)
        finally:
            await cancel_and_wait(self._drainer)

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
