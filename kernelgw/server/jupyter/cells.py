"""A Jupyter client's ``execute_request`` as a cell of the session's queue.

Both faces of a session run their cells through one queue (`runtime.execution_queue`):
the kernel gets one cell at a time, a /v1 cell's timeout starts when the kernel
gets it rather than while a Jupyter cell runs ahead of it, and every cell is in
the session's history, event stream, notebook and web page.

The client's own header goes to the kernel, so the iopub messages the
connection reads on its own socket carry the parent the client waits for. The
``execute_reply`` reaches the queue (through the session's kernel link) and is
handed to the client only once the cell's record is stored, and so is the
kernel's ``status: idle`` that ends the cell on the client's side (what
Open WebUI and AutoGen wait for): acknowledged means stored, on both faces.

``stop_on_error`` (on by default in the protocol): when a cell fails, the
client's cells queued behind it are answered ``aborted`` without running, as
ipykernel does with the requests waiting in its own queue.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelgw.runtime.execution import ARTIFACTS_EXPRESSION, QueuedExecution
from kernelgw.server.jupyter import caps, wire

ARTIFACTS_KEY = "artifacts"
"""The user_expression the gateway adds to read the files a cell wrote (`runtime.execution`)."""
_EXECUTION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""What /v1 accepts as an execution id (`models.ExecuteRequest`)."""

Message = tuple[str, dict[str, Any]]
"""A message for a client and the channel it goes on."""


@dataclass
class Gate:
    """A place in a connection's outbox that waits for a cell's record: what
    follows it is sent after the cell's answer."""

    opened: asyncio.Future[list[Message]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class CellOwner(Protocol):
    """The channels connection a cell came from."""

    def send_kernel(self, channel: str, msg: dict[str, Any]) -> None: ...

    def hold(self, gate: Gate) -> None:
        """Put ``gate`` in the outbox: nothing after it is sent until it opens."""
        ...


class ClientCells:
    """One connection's cells in the session's queue, oldest first."""

    def __init__(self, owner: CellOwner) -> None:
        self.owner = owner
        self.pending: dict[str, JupyterCell] = {}
        self.submitted = 0
        self.aborted_through = 0
        """Cells numbered up to this are aborted (a failed cell asked to stop on error)."""

    def new(self, msg: wire.ClientMessage) -> JupyterCell:
        self.submitted += 1
        cell = JupyterCell(self, msg, self.submitted)
        self.pending[msg.msg_id] = cell
        return cell

    def drop(self, cell: JupyterCell) -> None:
        """The queue refused it: it was never queued."""
        self.pending.pop(cell.msg_id, None)

    def idle(self, msg_id: str) -> bool:
        """The kernel's ``status: idle`` for ``msg_id`` reached the connection:
        True when it must wait behind a gate for the cell's record."""
        cell = self.pending.get(msg_id)
        if cell is None or cell.gate is not None:
            return False
        cell.gate = Gate()
        self.owner.hold(cell.gate)
        return True

    def owns(self, execution: QueuedExecution | None) -> bool:
        return execution is not None and isinstance(execution.client, JupyterCell) and execution.client.cells is self


class JupyterCell:
    """`runtime.execution.ClientRequest` for one ``execute_request``."""

    def __init__(self, cells: ClientCells, msg: wire.ClientMessage, number: int) -> None:
        self.cells = cells
        self.number = number
        self.header = msg.header
        self.msg_id = msg.msg_id
        self.stop_on_error = msg.content.get("stop_on_error", True) is not False
        content = dict(msg.content)
        expressions = content.get("user_expressions")
        expressions = dict(expressions) if isinstance(expressions, dict) else {}
        self.injected = ARTIFACTS_KEY not in expressions
        if self.injected:
            expressions[ARTIFACTS_KEY] = ARTIFACTS_EXPRESSION
        content["user_expressions"] = expressions
        self.message = {**msg.to_zmq(), "content": content}
        self.aborted = False
        self.gate: Gate | None = None

    @property
    def execution_id(self) -> str:
        """The /v1 execution id: the client's msg_id when it can serve as one."""
        return self.msg_id if _EXECUTION_ID.fullmatch(self.msg_id) else uuid.uuid4().hex

    # ------------------------------------------------------------ ClientRequest
    def should_abort(self) -> bool:
        self.aborted = self.number <= self.cells.aborted_through
        return self.aborted

    def on_stdin(self, msg: dict[str, Any]) -> None:
        self.cells.owner.send_kernel("stdin", msg)

    def ended(self, execution: QueuedExecution) -> None:
        cells = self.cells
        cells.pending.pop(self.msg_id, None)
        answer = self._answer(execution)
        status = (execution.reply or {}).get("status") if execution.reply_msg is not None else None
        if self.stop_on_error and not self.aborted and status != "ok":
            cells.aborted_through = cells.submitted
        if self.gate is not None:
            self.gate.opened.set_result(answer)
            return
        for channel, msg in answer:
            cells.owner.send_kernel(channel, msg)
        if execution.reply_msg is None:
            # the kernel never ran it (aborted, dead kernel, deleted session): no
            # idle of the kernel's will come
            cells.owner.send_kernel("iopub", caps.gateway_message("status", self.header, {"execution_state": "idle"}))

    def _answer(self, execution: QueuedExecution) -> list[Message]:
        """The messages that end the cell for the client."""
        if execution.reply_msg is not None:
            reply = execution.reply_msg
            if self.injected:
                content = dict(reply.get("content") or {})
                expressions = content.get("user_expressions")
                if isinstance(expressions, dict) and ARTIFACTS_KEY in expressions:
                    content["user_expressions"] = {k: v for k, v in expressions.items() if k != ARTIFACTS_KEY}
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
