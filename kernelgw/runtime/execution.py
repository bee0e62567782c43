"""One execution as the session tracks it, from queued to done.

(The SDK's result object is `kernelgw.client.execution.Execution`.)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelgw import events as ev
from kernelgw.runtime.fanout import Published

ARTIFACTS_EXPRESSION = "__import__('kernelgw_kernel').artifacts()"
"""Evaluated by the kernel after a cell (a user_expression: no extra round trip).
``kernelgw_kernel`` ships in the image; its text/plain is a JSON list of artifacts."""


class ClientRequest(Protocol):
    """An ``execute_request`` a Jupyter client sent on the channels WebSocket,
    run as a cell of the session's queue: its own header goes to the kernel (so
    the client's iopub and reply match it), and the client is told how it ends."""

    message: dict[str, Any]
    """The request as jupyter_client's ``Session.send`` takes it."""

    def should_abort(self) -> bool:
        """An earlier request of the same client failed with ``stop_on_error``:
        this one is answered ``aborted`` instead of run (as ipykernel would)."""
        ...

    def on_stdin(self, msg: dict[str, Any]) -> None:
        """The kernel asks for input (``input_request``)."""
        ...

    def ended(self, execution: QueuedExecution) -> None:
        """The cell is over and its record stored: answer the client (the kernel's
        ``execute_reply`` in ``execution.reply_msg``, or an error if it never came)."""
        ...


@dataclass
class QueuedExecution:
    execution_id: str
    code: str
    timeout: float
    published: list[Published] = field(default_factory=list)
    done: asyncio.Future[ev.Done] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    msg_id: str | None = None
    started: float = 0.0
    output_bytes: int = 0
    truncated: bool = False
    interrupted: bool = False
    reply: dict[str, Any] | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the kernel is through with it (reply and idle in), or when it is aborted."""
    idle_seen: bool = False
    abort_reason: str | None = None
    artifacts: list[ev.Artifact] = field(default_factory=list)
    silent: bool = False
    """A gateway-internal request: its iopub messages are not published."""
    idle_lost: bool = False
    recorded: bool = False
    checkpointed: int = 1
    """How many of ``published`` the running row holds (its ``queued`` event at start)."""
    ending: ev.Done | None = None
    """The ``done`` built when the cell ended, published once its record is stored."""
    client: ClientRequest | None = None
    """Set for a Jupyter client's request (the channels WebSocket)."""
    reply_msg: dict[str, Any] | None = None
    """The kernel's whole ``execute_reply`` message (kept for a Jupyter client)."""

    end_probe: str | None = None
    """The msg_id of the request sent behind this one to learn when it really ended."""
    end_replied: bool = False
    """The end probe's reply came (on the shell, after this request's real reply)."""
    end_idle: bool = False
    """The end probe's idle came (on iopub, after all of this request's real output)."""
    replies: int = 0
    counted: bool = False
    """The gateway's execution count was advanced for it."""
    anomalies: list[str] = field(default_factory=list)
    """What the kernel sent that a kernel does not send on its own (forged messages)."""

    @property
    def end_confirmed(self) -> bool:
        return self.end_replied and self.end_idle

    def check_finished(self) -> None:
        """The kernel is done with a request once its reply and its idle are in; for
        a cell, once the request sent behind it was answered on both channels (its
        reply and idle come after everything this one really sent: `KernelLink`)."""
        if self.reply is not None and (self.end_confirmed if not self.silent else self.idle_seen):
            self.finished.set()

    def anomaly(self, what: str) -> None:
        if what not in self.anomalies and len(self.anomalies) < 10:
            self.anomalies.append(what)

    def abort(self, reason: str) -> None:
        """End the wait for the kernel (a restart or deletion): the queue reports ``reason``."""
        if not self.finished.is_set():
            self.abort_reason = reason
            self.finished.set()


def parse_artifacts(reply: dict[str, Any]) -> list[ev.Artifact]:
    """Artifacts from an execute_reply's user_expressions; [] when absent or malformed
    (an image without the kernel helper, or user code that replaced it)."""
    result = (reply.get("user_expressions") or {}).get("artifacts") or {}
    if result.get("status") != "ok":
        return []
    text = (result.get("data") or {}).get("text/plain", "")
    try:
        items = json.loads(text)
        return [ev.Artifact.model_validate(item) for item in items][:1000]
    except (ValueError, TypeError):
        return []
