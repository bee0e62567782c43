"""One execution as the session tracks it, from queued to done.

(The SDK's result object is `kernelgw.client.execution.Execution`.)
"""

from __future__ import annotations

import asyncio
import json
import secrets
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelgw import events as ev
from kernelgw.runtime.fanout import Published
from kernelgw.runtime.recorder import ClientOrigin

ARTIFACTS_EXPRESSION = "__import__('kernelgw_kernel').artifacts()"
"""Evaluated by the kernel after a cell (a user_expression: no extra round trip).
``kernelgw_kernel`` ships in the image; its text/plain is a JSON list of artifacts."""
ARTIFACTS_KEY = "artifacts"
END_KEY = "kernelgw_end"
"""A user_expression whose value is the cell's nonce: a reply that carries it
answered the request (`KernelLink`)."""


def message_order(msg: dict[str, Any]) -> int | None:
    """Where the kernel made ``msg`` among all it sent: jupyter_client numbers
    a session's messages (``<session>_<pid>_<n>``) as it creates them, across
    its sockets; None for a kernel that names them otherwise."""
    msg_id = (msg.get("header") or {}).get("msg_id")
    if not isinstance(msg_id, str):
        return None
    _, _, tail = msg_id.rpartition("_")
    return int(tail) if tail.isdigit() and len(tail) < 19 else None


def answers(reply: dict[str, Any], nonce: str) -> bool:
    """The reply carries the cell's nonce, evaluated by the kernel after the
    cell's code (IPython skips user_expressions when a cell fails)."""
    result = (reply.get("user_expressions") or {}).get(END_KEY) or {}
    return isinstance(result, dict) and (result.get("data") or {}).get("text/plain") == repr(nonce)


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

    def origin(self) -> ClientOrigin | None:
        """Who sent it, for its record (None: a client without ``session_id``)."""
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
    """How many of its events (`event_count`) were handed to the store (its ``queued`` event at start)."""
    stored_events: int = 0
    """How many of ``published``, from its start, are queued as output chunks
    (the store's; `take_chunk`): the cell's row holds only those after them."""
    unstored_bytes: int = 0
    """JSON bytes published since the store was last handed the output (`CHUNK_BYTES`)."""
    released: int = 0
    """Events dropped from the start of ``published`` once their chunk was committed (`release`)."""
    retain_output: bool = False
    """Keep every event in ``published`` (a caller answers with the whole output at the end)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables for this cell only (`kernelgw.runtime.cell_env`; Python
    kernels), set by the caller right after ``submit``, before it awaits anything."""
    last_error: ev.Error | None = None
    """The latest ``error`` event published (kept when its chunk is released)."""
    chunk_committed: Callable[[int], None] | None = None
    """Told the number of a chunk's first event once the chunk is committed (`release`)."""
    ending: ev.Done | None = None
    """The ``done`` built when the cell ended, published once its record is stored."""
    client: ClientRequest | None = None
    """Set for a Jupyter client's request (the channels WebSocket)."""
    seen_orders: set[int] | None = None
    """For a Jupyter client's cell: where (`message_order`) the iopub messages of
    it that the session has read sit, up to `MAX_SEEN_ORDERS`. A client that
    returns is sent those from the session's events, and its connection's own
    socket, which joined before, skips them (`server.jupyter.cells.rejoin`)."""
    reply_msg: dict[str, Any] | None = None
    """The kernel's whole ``execute_reply`` message (kept for a Jupyter client)."""

    nonce: str = field(default_factory=lambda: secrets.token_hex(8))
    injected: tuple[str, ...] = ()
    """The user_expressions the gateway added to a Jupyter client's request."""
    reply_verified: bool = False
    """The reply carries the nonce: it answered this request."""
    reply_order: int | None = None
    error_order: int | None = None
    """The latest error's place among the kernel's messages: after a verified
    reply's, the reply was forged (a kernel replies once its cell is over)."""
    idle_order: int = -1
    """The latest idle's place among the kernel's messages (`message_order`)."""
    end_probe: str | None = None
    """For a reply that cannot prove itself (a failed cell's, or a forgery): a
    silent request sent behind it, whose reply and idle come after everything
    the cell really sent. It also reads the failed cell's artifacts."""
    end_replied: bool = False
    end_idle: bool = False
    probe_reply: dict[str, Any] | None = None
    replies: int = 0
    counted: bool = False
    """The gateway's execution count was advanced for it."""
    anomalies: list[str] = field(default_factory=list)
    """What the kernel sent that a kernel does not send on its own (forged messages)."""
    replayable: bool = True
    """False: marked not to be replayed (``replay: false``, for side effects)."""
    replay_of: str | None = None
    """Set for a replayed execution: the execution it re-runs."""
    kernel_id: str | None = None
    """The kernel it was sent to (its lineage is that kernel's)."""
    death: str | None = None
    """Why the kernel died while it ran (it then ends ``dead``)."""
    followed: EndedCell | None = None
    """Set for a cell a previous gateway sent and left running in the kept kernel
    (`ExecutionQueue.follow`): its output goes to its record as late output of
    this, and its end completes that record."""
    followed_error: tuple[str, str] | None = None
    """A followed cell's latest error on iopub (``ename``, ``evalue``): its reply went
    to the previous gateway, so this says how it ended."""

    @property
    def origin(self) -> ClientOrigin | None:
        return self.client.origin() if self.client is not None else None

    @property
    def event_count(self) -> int:
        """Events published for it so far, also those released."""
        return self.released + len(self.published)

    def take_chunk(self) -> tuple[int, list[Published]]:
        """The events not yet queued as chunks, now the store's next chunk, with
        the number (from the cell's first event) of the first of them."""
        first = self.released + self.stored_events
        events = self.published[self.stored_events :]
        self.stored_events = len(self.published)
        return first, events

    def release(self, first: int, count: int) -> None:
        """The chunk of events ``first`` to ``first + count`` is committed: drop them
        from memory (the store's readers have them). Only when every event before
        them went the same way (a chunk the store dropped keeps all after it)."""
        if self.chunk_committed is not None:
            self.chunk_committed(first)
        if self.retain_output or first != self.released or count > self.stored_events:
            return
        del self.published[:count]
        self.stored_events -= count
        self.released += count

    def note_idle(self, msg: dict[str, Any]) -> None:
        if self.idle_seen:
            self.anomaly("more than one status: idle")
        self.idle_seen = True
        order = message_order(msg)
        if order is not None:
            self.idle_order = max(self.idle_order, order)
        self.check_finished()

    def check_finished(self) -> None:
        """The kernel is through with a request once its reply and an idle made
        after that reply are in (iopub keeps order, so its output is in too); a
        reply without the nonce waits for its end probe instead (`KernelLink`)."""
        if self.reply is None:
            if self.followed is not None and self.end_replied and self.end_idle:
                self.finished.set()  # a followed cell that ended before this gateway listened
            return
        if self.silent:
            done = self.idle_seen
        elif self.reply_verified:
            done = self.idle_order > self.reply_order if self.reply_order is not None else self.idle_seen
        else:
            done = self.end_replied and self.end_idle
        if done:
            self.finished.set()

    def anomaly(self, what: str) -> None:
        if what not in self.anomalies and len(self.anomalies) < 10:
            self.anomalies.append(what)

    def abort(self, reason: str) -> None:
        """End the wait for the kernel (a restart or deletion): the queue reports ``reason``."""
        if not self.finished.is_set():
            self.abort_reason = reason
            self.finished.set()


MAX_SEEN_ORDERS = 100_000
"""Past this many messages a Jupyter cell's `QueuedExecution.seen_orders` stops
growing: a returning client may then see some of its output twice, never lose it."""


def checkpoint_due(rec: QueuedExecution) -> bool:
    """Whether a running cell has events the store was not handed yet (at each
    state poll). The store then writes them as a chunk, never rewritten, or,
    under `kernelgw.runtime.recorder.TAIL_BYTES`, rewrites its row's short tail:
    what checkpoints write in sum is the output once plus small rewrites, and
    no write is large (a 16 MiB row rewritten kept other sessions' answers
    waiting 100-200 ms)."""
    return rec.event_count > rec.checkpointed


@dataclass
class EndedCell:
    """What a kernel link remembers of a cell after its end, to report the kernel's
    late messages for it and keep its late output (`kernelgw.runtime.late_output`):
    not the cell itself, whose output (up to the output cap) would stay in memory
    for as long as the link remembers it."""

    execution_id: str
    anomalies: list[str]
    """The cell's own list: a note made here reaches its ``done`` while that is not built."""
    execution: weakref.ref[QueuedExecution]
    """The cell while something else still holds it."""
    done: asyncio.Future[ev.Done]
    """Its ``done``: late output is stored and sent once that is out."""
    output_bytes: int = 0
    """Its output so far, late output included: late output counts against the same cap."""
    truncated: bool = False
    late_error: bool = False
    """An error came after its end: its record says ``error`` now."""
    late_parts: int = 0
    """How many batches of late output were stored (each is one chunk of its record)."""
    followed: bool = False
    """A cell a previous gateway left running, followed by this one: its output after
    the interim end is its own, not a forgery (an error does not mark it)."""

    @classmethod
    def of(cls, execution: QueuedExecution) -> EndedCell:
        return cls(
            execution.execution_id,
            execution.anomalies,
            weakref.ref(execution),
            execution.done,
            execution.output_bytes,
            execution.truncated,
        )


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
