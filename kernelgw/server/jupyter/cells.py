"""A Jupyter client's ``execute_request`` as a cell of the session's queue.

Both faces of a session run their cells through one queue (`runtime.execution_queue`):
the kernel gets one cell at a time, a /v1 cell's timeout starts when the kernel
gets it rather than while a Jupyter cell runs ahead of it, and every cell is in
the session's history, event stream, notebook and web page.

The client's own header goes to the kernel, so the iopub messages the
connection reads on its own socket carry the parent the client waits for. The
``execute_reply`` reaches the queue (through the session's kernel link), which
decides when the cell really ended (the kernel's messages are untrusted: see
`runtime.message_routes`). The client gets the reply and a ``status: idle`` of
the gateway's only then, once the cell's record is stored, and only after the
connection has read the kernel's own idle made after that reply (so every
output of the cell came first). The kernel's idles for the cell are not
forwarded: one forged by the cell's code would end it early for clients that
stop at the idle (Open WebUI, AutoGen). Acknowledged means stored, on both faces.

``stop_on_error`` (on by default in the protocol): when a cell fails, the
client's cells queued behind it are answered ``aborted`` without running, as
ipykernel does with the requests waiting in its own queue.

A client that loses its connection keeps its cells: they run on, and when it
reconnects with the same ``session_id`` (JupyterLab does) it is sent what its
cells produced meanwhile, rebuilt from the session's event stream, and their
replies (`Orphans`). After a gateway restart, or once the client is
forgotten here, its cells' answers come from their stored records instead
(`missed`).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelgw.runtime.execution import QueuedExecution, message_order
from kernelgw.runtime.recorder import ClientOrigin
from kernelgw.runtime.session import KernelSession
from kernelgw.server.jupyter import caps, wire

_EXECUTION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""What /v1 accepts as an execution id (`models.ExecuteRequest`)."""

Message = tuple[str, dict[str, Any]]
"""A message for a client and the channel it goes on."""


IDLE_WAIT_S = 1.0
"""How long an ended cell's answer waits for the kernel's idle on the
connection's own socket (it may have been dropped) before it is sent anyway."""


class CellOwner(Protocol):
    """The channels connection a cell came from."""

    def send_kernel(self, channel: str, msg: dict[str, Any]) -> None: ...


class ClientCells:
    """One client's cells in the session's queue, oldest first."""

    def __init__(self, owner: CellOwner, client_session: str | None = None) -> None:
        self.owner: CellOwner | None = owner
        """The connection answers go to; None while the client is away."""
        self.client_session = client_session
        """The ``session_id`` the client connected with (its cells' records keep it)."""
        self.pending: dict[str, JupyterCell] = {}
        self.submitted = 0
        self.aborted_through = 0
        """Cells numbered up to this are aborted (a failed cell asked to stop on error)."""
        self.missed: list[tuple[JupyterCell, list[Message]]] = []
        """Cells that ended while the client was away, with their answers."""
        self.waiting: dict[str, JupyterCell] = {}
        """Ended cells whose answer waits: for the kernel's idle on this connection,
        or for an earlier cell's answer (answers go out in the order cells were sent)."""

    def send(self, channel: str, msg: dict[str, Any]) -> None:
        if self.owner is not None:
            self.owner.send_kernel(channel, msg)

    def new(self, msg: wire.ClientMessage) -> JupyterCell:
        self.submitted += 1
        cell = JupyterCell(self, msg, self.submitted)
        self.pending[msg.msg_id] = cell
        return cell

    def drop(self, cell: JupyterCell) -> None:
        """The queue refused it: it was never queued."""
        self.pending.pop(cell.msg_id, None)

    def flush(self) -> None:
        """Send the ready answers of the oldest waiting cells, up to the first one
        still waiting for its idle: a cell aborted behind a failed one is not
        answered before it (ipykernel answers its queue in order, and clients
        that collect one msg_id at a time would miss the later reply)."""
        for cell in sorted(self.waiting.values(), key=lambda c: c.number):
            if not cell.ready:
                return
            del self.waiting[cell.msg_id]
            answer, cell.answer = cell.answer, None
            for channel, msg in answer or ():
                self.send(channel, msg)

    def idle(self, msg_id: str, msg: dict[str, Any]) -> bool:
        """The kernel's ``status: idle`` for ``msg_id`` reached the connection:
        True when it is one of our cells' (it is not forwarded; the cell's answer
        may now go out)."""
        cell = self.pending.get(msg_id) or self.waiting.get(msg_id)
        if cell is None:
            return False
        order = message_order(msg)
        cell.idle_order = max(cell.idle_order, order if order is not None else -1)
        if msg_id in self.waiting and (cell.after is None or cell.idle_order > cell.after):
            cell.release()
        return True

    def already_sent(self, msg_id: str | None, msg: dict[str, Any]) -> bool:
        """An iopub message of a cell still running that the client was sent when it
        came back (`rejoin`): its connection's own socket, which joined before
        that, reads it too; it is not sent twice."""
        cell = self.pending.get(msg_id) if msg_id else None
        return cell is not None and bool(cell.replayed) and message_order(msg) in cell.replayed

    def owns(self, execution: QueuedExecution | None) -> bool:
        return execution is not None and isinstance(execution.client, JupyterCell) and execution.client.cells is self


class JupyterCell:
    """`runtime.execution.ClientRequest` for one ``execute_request``."""

    def __init__(self, cells: ClientCells, msg: wire.ClientMessage, number: int) -> None:
        self.cells = cells
        self.number = number
        self.header = msg.header
        self.msg_id = msg.msg_id
        self.execution_id = self.msg_id if _EXECUTION_ID.fullmatch(self.msg_id) else uuid.uuid4().hex
        """The /v1 execution id: the client's msg_id when it can serve as one."""
        self.stop_on_error = msg.content.get("stop_on_error", True) is not False
        self.message = msg.to_zmq()
        self.aborted = False
        self.ready = False
        """Its answer may go out (its idle came, or need not be waited for)."""
        self.adopted = False
        """The client reconnected while this cell was queued or running."""
        self.idle_order = -1
        """The latest kernel idle for this cell the connection read (`message_order`)."""
        self.after: int | None = None
        """Where the reply the cell ended on sits among the kernel's messages."""
        self.answer: list[Message] | None = None
        self.execution: QueuedExecution | None = None
        """Its place in the session's queue (set once it is queued)."""
        self.replayed: frozenset[int] = frozenset()
        """Its messages (`message_order`) a returning client was sent from the
        session's events: the connection's own socket read them too (`rejoin`)."""

    # ------------------------------------------------------------ ClientRequest
    def origin(self) -> ClientOrigin | None:
        session = self.cells.client_session
        if not session:
            return None
        return ClientOrigin(session=session, header=self.header, answered=self.cells.owner is not None)

    def should_abort(self) -> bool:
        self.aborted = self.number <= self.cells.aborted_through
        return self.aborted

    def on_stdin(self, msg: dict[str, Any]) -> None:
        self.cells.send("stdin", msg)

    def ended(self, execution: QueuedExecution) -> None:
        cells = self.cells
        cells.pending.pop(self.msg_id, None)
        status = (execution.reply or {}).get("status") if execution.reply_msg is not None else None
        if self.stop_on_error and not self.aborted and status != "ok":
            cells.aborted_through = cells.submitted
        idle = caps.gateway_message("status", self.header, {"execution_state": "idle"})
        self.answer = [*self._answer(execution), ("iopub", idle)]
        if cells.owner is None:
            cells.missed.append((self, self.answer))
            self.answer = None
            return
        reply = execution.reply_msg
        self.after = execution.reply_order if execution.reply_verified else (message_order(reply) if reply else None)
        cells.waiting[self.msg_id] = self
        if reply is None or self.after is None or self.idle_order > self.after:
            # never ran, no order to go by, or the kernel's idle is in: all output came first
            self.release()
            return
        asyncio.get_running_loop().call_later(IDLE_WAIT_S, self.release)

    def release(self) -> None:
        """The cell's answer may go out (once), after those of the client's earlier cells."""
        self.ready = True
        self.cells.flush()

    def _answer(self, execution: QueuedExecution) -> list[Message]:
        """The messages that end the cell for the client."""
        if execution.reply_msg is not None:
            reply = execution.reply_msg
            content = dict(reply.get("content") or {})
            expressions = content.get("user_expressions")
            if isinstance(expressions, dict) and execution.injected:
                # the gateway's own expressions are not the client's business
                content["user_expressions"] = {k: v for k, v in expressions.items() if k not in execution.injected}
                reply = {**reply, "content": content}
            return [("shell", reply)]
        busy = ("iopub", caps.gateway_message("status", self.header, {"execution_state": "busy"}))
        if self.aborted:
            aborted = {"status": "aborted", "execution_count": None}
            return [busy, ("shell", caps.gateway_message("execute_reply", self.header, aborted))]
        done = execution.ending
        reason = (done.reason if done is not None else None) or "the cell did not run"
        ename = "KernelGatewayError"
        error = {"ename": ename, "evalue": reason, "traceback": [f"{ename}: {reason}"]}
        reply_content = {"status": "error", "execution_count": None, **error}
        return [
            busy,
            ("iopub", caps.gateway_message("error", self.header, error)),
            ("shell", caps.gateway_message("execute_reply", self.header, reply_content)),
        ]


# ------------------------------------------------------------------ reconnecting clients
ORPHAN_TTL_S = 600.0
"""How long a client's cells wait for it to reconnect (jupyter_server keeps its
buffer for a disconnected client until another client connects)."""
MAX_ORPHANS = 16
"""Disconnected clients remembered per session (the oldest are forgotten)."""


@dataclass
class Orphan:
    cells: ClientCells
    since_seq: int
    """The session's last event when the client went away: later ones are missed."""
    left_at: float = field(default_factory=time.monotonic)


_orphans: weakref.WeakKeyDictionary[KernelSession, dict[str, Orphan]] = weakref.WeakKeyDictionary()


def leave(session: KernelSession, client_session: str | None, cells: ClientCells) -> None:
    """A connection closed: keep its cells for the client's return, if it has any."""
    cells.owner = None
    if not client_session or not (cells.pending or cells.missed):
        return
    for cell in sorted(cells.waiting.values(), key=lambda c: c.number):
        cells.missed.append((cell, cell.answer or []))
        cell.answer = None
    cells.waiting.clear()
    kept = _orphans.setdefault(session, {})
    kept[client_session] = Orphan(cells, session.last_seq)
    now = time.monotonic()
    for key in [k for k, o in kept.items() if now - o.left_at > ORPHAN_TTL_S]:
        del kept[key]
    while len(kept) > MAX_ORPHANS:
        del kept[next(iter(kept))]


@dataclass
class Rejoined:
    cells: ClientCells
    """The client's cells, now answered on the new connection."""
    answered: list[str]
    """The execution ids of the ended cells whose answers were just sent."""


def rejoin(session: KernelSession, client_session: str | None, owner: CellOwner) -> Rejoined | None:
    """The client is back (same ``session_id``): its cells, after sending what it
    missed; None if it left nothing behind in this process."""
    orphan = _orphans.get(session, {}).pop(client_session or "", None)
    if orphan is None or time.monotonic() - orphan.left_at > ORPHAN_TTL_S:
        return None
    cells = orphan.cells
    by_id = {cell.execution_id: cell for cell in cells.pending.values()}
    by_id.update({cell.execution_id: cell for cell, _ in cells.missed})
    for running in cells.pending.values():
        # what the session has read of it is what the events below hold (both
        # change only between batches of the kernel's messages, not during this)
        if running.execution is not None and running.execution.seen_orders:
            running.replayed = frozenset(running.execution.seen_orders)
    for seq, text in session.events_since(orphan.since_seq):
        event = json.loads(text)
        cell = by_id.get(event.get("execution_id") or "")
        if cell is not None and seq > orphan.since_seq and not _is_idle(event):
            for channel, msg in to_messages(event, cell.header):
                owner.send_kernel(channel, msg)
    for _cell, answer in cells.missed:
        for channel, msg in answer:
            owner.send_kernel(channel, msg)
    answered = [cell.execution_id for cell, _ in cells.missed]
    cells.missed = []
    for cell in cells.pending.values():
        cell.adopted = True
    cells.owner = owner
    return Rejoined(cells, answered)


def _is_idle(event: dict[str, Any]) -> bool:
    """The kernel's idle: a cell's end is its answer's to tell (it comes last)."""
    return event.get("type") == "status" and event.get("state") == "idle"


def to_messages(event: dict[str, Any], parent: dict[str, Any]) -> list[Message]:
    """The iopub messages a /v1 event stands for (none for ``queued`` and ``done``:
    the execute_input is not kept, and the reply is the cell's answer)."""
    kind = event.get("type")
    content: dict[str, Any]
    if kind == "status":
        msg_type, content = "status", {"execution_state": event["state"]}
    elif kind == "stream":
        msg_type, content = "stream", {"name": event["name"], "text": event["text"]}
    elif kind in ("display", "update_display"):
        msg_type = "display_data" if kind == "display" else "update_display_data"
        content = {"data": event["data"], "metadata": event.get("metadata") or {}, "transient": {}}
        if event.get("display_id"):
            content["transient"] = {"display_id": event["display_id"]}
    elif kind == "result":
        msg_type = "execute_result"
        content = {
            "execution_count": event.get("execution_count"),
            "data": event["data"],
            "metadata": event.get("metadata") or {},
        }
    elif kind == "clear_output":
        msg_type, content = "clear_output", {"wait": bool(event.get("wait"))}
    elif kind == "error":
        msg_type = "error"
        content = {"ename": event["ename"], "evalue": event["evalue"], "traceback": event["traceback"]}
    elif kind == "truncated":
        return [("iopub", caps.truncation_note(parent, str(event.get("message", ""))))]
    else:
        return []
    return [("iopub", caps.gateway_message(msg_type, parent, content))]
