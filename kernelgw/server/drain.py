"""The gateway's drain: what SIGTERM starts before the process exits.

Draining refuses new sessions and executions (503, ``Retry-After``) and turns
``/readyz`` unready at once, while running cells go on streaming. Once no cell
is running (or the grace is over) the drain *closes*: each WebSocket sends what
it still holds, its cells' ``done`` among it, then closes with 1012 (service
restart: reconnect), and a REST execute whose cell is still running is answered
503 naming the execution (`until_done_or_closing`, `cut_off_response`), so that
no open request holds the process past the grace. `kernelgw serve` calls
`Drain.run` from its signal handler and stops the server after it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from starlette.responses import JSONResponse

from kernelgw.runtime.manager import SessionManager

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.05
"""How often a drain looks whether cells are still running."""
CUT_OFF_CODE = "gateway_restarting"
CUT_OFF_RETRY_AFTER_S = 5
"""``Retry-After`` of the cut-off answer: about how long a restart takes."""

CLOSE_ANSWER_S = 1.0
"""After the close, how long a request not yet answering has to answer by itself
(a REST execute does at once) before the drain cuts it off with a 503."""

T = TypeVar("T")


@dataclass(eq=False)
class OpenRequest:
    """An HTTP request in flight (`kernelgw.server.cutoff.AnswerAtClose` keeps them)."""

    task: asyncio.Task[Any]
    answering: bool = False
    """Its response has started: it is left to finish (uvicorn bounds that)."""
    cut_off: bool = False
    """Cancelled by the drain: answered 503 instead."""


class Drain:
    """Not draining, draining (new work refused), closing (sockets end)."""

    def __init__(self) -> None:
        self.started_at: float | None = None
        self._closing = asyncio.Event()
        self.open: set[OpenRequest] = set()

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def begin(self) -> bool:
        """Refuse new work from now on; True the first time."""
        if self.started_at is not None:
            return False
        self.started_at = time.monotonic()
        return True

    def close(self) -> None:
        """End the WebSockets (after what they hold is sent)."""
        self.begin()
        self._closing.set()

    async def wait_closing(self) -> None:
        await self._closing.wait()

    async def run(self, manager: SessionManager, grace_s: float) -> bool:
        """Begin, wait up to ``grace_s`` for running and queued cells to end, close.

        True when every cell ended within the grace."""
        self.begin()
        busy = _busy(manager)
        log.warning("draining: %d cells running or queued, up to %gs for them to end", busy, grace_s)
        deadline = time.monotonic() + grace_s
        while busy and time.monotonic() < deadline:
            await asyncio.sleep(IDLE_POLL_S)
            busy = _busy(manager)
        if busy:
            log.error("draining: %d cells still running after the %gs grace", busy, grace_s)
        self.close()
        await self._cut_off_open()
        return busy == 0

    async def _cut_off_open(self) -> None:
        """Requests still not answering a moment after the close are cancelled and
        answered 503: uvicorn would wait for each (then cancel it unanswered)."""
        waiting = {r.task for r in self.open if not r.answering}
        if waiting:
            await asyncio.wait(waiting, timeout=CLOSE_ANSWER_S)
        late = [r for r in self.open if not r.answering]
        if late:
            log.warning("draining: cutting off %d requests not answered at the end of the grace", len(late))
        for request in late:
            request.cut_off = True
            request.task.cancel()


def _busy(manager: SessionManager) -> int:
    return sum(session.queue_length for session in manager.list())


async def until_done_or_closing(done: asyncio.Future[T], drain: Drain) -> T | None:
    """What ``done`` gives, or None once the drain closes first (``done`` is left
    as it is: the cell goes on until the shutdown keeps or ends its kernel)."""
    if drain.closing:
        return done.result() if done.done() else None
    closing = asyncio.ensure_future(drain.wait_closing())
    try:
        await asyncio.wait((done, closing), return_when=asyncio.FIRST_COMPLETED)
    finally:
        closing.cancel()
    return done.result() if done.done() else None


def cut_off_response(session_id: str, execution_id: str, on_shutdown: Literal["keep", "stop"]) -> JSONResponse:
    """The answer to a REST execute the drain's grace ran out on: 503 naming the
    execution, so the client reads its record from history instead of running
    the cell again."""
    history = f"GET /v1/sessions/{session_id}/history"
    if on_shutdown == "keep":
        what = (
            f"the kernel is kept and goes on running it. Do not send it again: after the restart its record is "
            f"in {history}, with its output up to now and status 'dead' until the restarted gateway, which "
            "follows the cell, records how it ended (what it prints while no gateway is connected is lost); "
            "what the cell leaves behind (variables, files) is in the session"
        )
    else:
        what = f"the session ends with the gateway (on_shutdown=stop). Its record (output up to now) is in {history}"
    message = f"The gateway is restarting and its shutdown grace ran out while execution {execution_id!r} ran: {what}."
    body = {"error": {"code": CUT_OFF_CODE, "message": message, "execution_id": execution_id}}
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(CUT_OFF_RETRY_AFTER_S)})
