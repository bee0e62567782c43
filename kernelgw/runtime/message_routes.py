"""Where a kernel's messages go: to the request of the link's that they answer.

Messages are routed by their parent's msg_id to the request the link sent: the
kernel holds the HMAC key, so a valid signature proves nothing about honesty,
and anything else is dropped. What an execution's messages mean is the
`LinkListener`'s business.

The kernel's word does not end a cell. It holds its HMAC key, so user code can
send an ``execute_reply`` and a ``status: idle`` of its own for the running
request. Two checks that cost no extra message tell the real end:

* the request carries a nonce as a user_expression, which the kernel evaluates
  after the cell's code: a reply without it did not answer the request;
* jupyter_client numbers a session's messages as it makes them, across its
  sockets (`message_order`): the real idle is made after the real reply, an
  idle sent from the cell's code before it.

So a cell ends on the reply with its nonce and an idle made after it. IPython
skips user_expressions when a cell fails, so a reply without the nonce (a
failed cell's, or a forgery) gets an end probe: a silent request sent behind
it (the one that reads a failed cell's artifacts anyway), whose reply and idle
come after everything the cell really sent. Anything else (another reply, a
second idle, output for an ended cell) is an anomaly the listener records.
Code that reads the request's nonce and numbers its forgeries right can still
fool this; the cell's timeout and the container's state stay the gateway's.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from typing import Any, Literal, Protocol

from kernelgw.runtime.execution import MAX_SEEN_ORDERS, EndedCell, QueuedExecution, answers, message_order
from kernelgw.runtime.output_kinds import CAPPED_OUTPUT, LATE_OUTPUT

ENDED_REMEMBERED = 64
"""Ended cells whose late messages are still recognised (and reported)."""


class LinkListener(Protocol):
    """Who is told about an execution's messages (the execution queue)."""

    def current_execution(self) -> QueuedExecution | None:
        """The execution the kernel is running, if any."""
        ...

    def on_output(self, execution: QueuedExecution, msg: dict[str, Any]) -> None:
        """An iopub message of a running, published execution."""
        ...

    def on_message_refused(self, execution: QueuedExecution) -> None:
        """A message over the size limit was dropped while ``execution`` ran."""
        ...

    def on_anomaly(self, ended: EndedCell, what: str) -> None:
        """The kernel sent something for a cell after it had ended."""
        ...

    def on_late_output(self, ended: EndedCell, msg: dict[str, Any]) -> None:
        """Output for a cell after its end: kept in its record and sent as late
        (`kernelgw.runtime.late_output`)."""
        ...


class MessageRoutes:
    """The link's requests by msg_id, and the routing of what the kernel sends
    for them. ``send_end_probe`` sends an end probe on the shell and returns its
    msg_id (None: there is no kernel to send it to)."""

    def __init__(self, send_end_probe: Callable[[], str | None]) -> None:
        self._send_end_probe = send_end_probe
        self._pending: dict[str, QueuedExecution] = {}
        self._iopub_probes: dict[str, asyncio.Event] = {}
        self._shell_probes: dict[str, asyncio.Event] = {}
        self._end_probes: dict[str, QueuedExecution] = {}
        self._ended: collections.OrderedDict[str, EndedCell] = collections.OrderedDict()
        """Recently ended cells by msg_id: what arrives for them later is an anomaly,
        and their output is kept as late output."""

    # ------------------------------------------------------------- requests
    def expect(self, execution: QueuedExecution, msg_id: str) -> None:
        """``execution`` went out as ``msg_id``: route what answers it to it."""
        execution.msg_id = msg_id
        self._pending[msg_id] = execution

    def forget(self, execution: QueuedExecution) -> None:
        """Stop routing messages to ``execution``: what comes later is late (output
        is kept as late output, and it and a reply are reported as an anomaly)."""
        if execution.msg_id is not None:
            self._pending.pop(execution.msg_id, None)
            if not execution.silent:
                self._ended_cell(execution.msg_id, execution)
        if execution.end_probe is not None:
            self._end_probes.pop(execution.end_probe, None)

    def _ended_cell(self, msg_id: str, execution: QueuedExecution) -> EndedCell:
        """What is remembered of ``execution`` once it ended (made once: its late
        output counts on from what came before)."""
        ended = self._ended.get(msg_id)
        if ended is None:
            ended = self._ended[msg_id] = execution.followed or EndedCell.of(execution)
            while len(self._ended) > ENDED_REMEMBERED:
                self._ended.popitem(last=False)
        return ended

    def ended(self, msg_id: str) -> EndedCell | None:
        """What is remembered of the ended cell sent as ``msg_id``, if anything."""
        return self._ended.get(msg_id)

    def forget_ended(self) -> None:
        """The kernel is gone: nothing more will come for its ended cells or end probes."""
        self._end_probes.clear()
        self._ended.clear()

    def nudge(self, msg_id: str) -> tuple[asyncio.Event, asyncio.Event]:
        """Events set when the kernel_info request ``msg_id`` is answered on the
        shell and its status comes on iopub (the readiness nudge); `unnudge` after."""
        replied, seen = asyncio.Event(), asyncio.Event()
        self._shell_probes[msg_id] = replied
        self._iopub_probes[msg_id] = seen
        return replied, seen

    def unnudge(self, msg_id: str) -> None:
        self._iopub_probes.pop(msg_id, None)
        self._shell_probes.pop(msg_id, None)

    def probe_end(self, execution: QueuedExecution) -> None:
        """Send the end probe for a reply that cannot prove itself (the module's
        docstring); once per cell."""
        if execution.silent or execution.end_probe is not None:
            return
        probe = self._send_end_probe()
        if probe is None:
            return
        execution.end_probe = probe
        self._end_probes[probe] = execution

    # ------------------------------------------------------------- iopub
    def content_unread(self, msg_type: str, parent: str | None) -> bool:
        """Output of a /v1 cell past its cap: dropped by `CellOutput` whatever it holds."""
        if msg_type not in CAPPED_OUTPUT or parent is None:
            return False
        execution = self._pending.get(parent)
        return execution is not None and execution.truncated and execution.client is None

    def note_orders(self, batch: list[dict[str, Any]]) -> None:
        """Where each message of a Jupyter client's cell sits (`QueuedExecution.seen_orders`);
        before coalescing, which keeps only the first message's header of a run."""
        for msg in batch:
            parent = msg["parent_header"].get("msg_id")
            execution = self._pending.get(parent) if parent else None
            if execution is None or (seen := execution.seen_orders) is None or len(seen) >= MAX_SEEN_ORDERS:
                continue
            if (order := message_order(msg)) is not None:
                seen.add(order)

    def on_iopub(self, msg: dict[str, Any], listener: LinkListener) -> None:
        parent = msg["parent_header"].get("msg_id")
        probe = self._iopub_probes.get(parent) if parent else None
        if probe is not None:
            probe.set()
            return
        if parent and (probed := self._end_probes.get(parent)) is not None:
            if msg["content"].get("execution_state") == "idle":
                probed.end_idle = True
                probed.check_finished()
            return
        execution = self._pending.get(parent) if parent else None
        if execution is not None and not execution.silent and not execution.finished.is_set():
            listener.on_output(execution, msg)
            return
        if not parent or (execution is not None and execution.silent):
            return  # not a request we sent, or an internal one
        # a cell the gateway has ended (its end decided, its done perhaps not yet
        # out), whatever the timing: late, never dropped
        ended = self._ended_cell(parent, execution) if execution is not None else self._ended.get(parent)
        if ended is not None and msg["msg_type"] in LATE_OUTPUT:
            if not ended.followed:  # a followed cell's output after its interim end is its own
                listener.on_anomaly(ended, f"a {msg['msg_type']} message after the cell had ended")
            listener.on_late_output(ended, msg)

    # ------------------------------------------------------------- shell
    def on_shell(self, msg: dict[str, Any], listener: LinkListener) -> None:
        parent = msg["parent_header"].get("msg_id")
        if parent and (probe := self._shell_probes.get(parent)) is not None:
            probe.set()
            return
        if parent and (probed := self._end_probes.get(parent)) is not None:
            if msg["msg_type"] == "execute_reply":
                probed.probe_reply = msg["content"]
                probed.end_replied = True
                probed.check_finished()
            return
        execution = self._pending.get(parent) if parent else None
        if msg["msg_type"] != "execute_reply":
            return
        if execution is None:
            ended = self._ended.get(parent) if parent else None
            if ended is not None and not ended.followed:
                listener.on_anomaly(ended, "an execute_reply after the cell had ended")
            return
        self._on_reply(execution, msg)

    def _on_reply(self, execution: QueuedExecution, msg: dict[str, Any]) -> None:
        """An execute_reply for ``execution``: take it if it proves itself (its
        nonce), else keep it provisionally and let the end probe tell the end."""
        content = msg.get("content") or {}
        execution.replies += 1
        if execution.silent:
            execution.reply, execution.reply_msg = content, msg
            execution.check_finished()
            return
        if execution.reply_verified:
            execution.anomaly("an execute_reply after the request's own")
            return
        if answers(content, execution.nonce):
            if execution.replies > 1:
                execution.anomaly("an execute_reply that did not answer the request")
            execution.reply, execution.reply_msg = content, msg
            execution.reply_verified = True
            execution.reply_order = message_order(msg)
        else:
            if execution.replies > 1 or content.get("status") == "ok":
                # an ok reply always carries the nonce: this one did not answer the request
                execution.anomaly("an execute_reply that did not answer the request")
            execution.reply, execution.reply_msg = content, msg
            self.probe_end(execution)
        execution.check_finished()

    # ------------------------------------------------------------- stdin
    def on_stdin(self, msg: dict[str, Any]) -> None:
        parent = msg["parent_header"].get("msg_id")
        execution = self._pending.get(parent) if parent else None
        if execution is None or execution.client is None or msg["msg_type"] != "input_request":
            return  # /v1 cells never allow stdin; nothing else may ask
        execution.client.on_stdin(msg)

    # ------------------------------------------------------------- refused
    def on_refused(
        self,
        channel: Literal["iopub", "shell"],
        execution: QueuedExecution | None,
        max_message_bytes: int,
        listener: LinkListener,
    ) -> None:
        """ZMQ refused a message over ``max_message_bytes`` on ``channel`` while
        ``execution`` ran: tell it that output was lost."""
        if execution is None or execution.silent or execution.finished.is_set():
            return
        if channel == "shell" and execution.reply is None:
            # the refused message was this execution's reply (the shell
            # carries nothing else while it runs): end it when idle comes
            execution.reply = {
                "status": "error",
                "ename": "ReplyTooLarge",
                "evalue": f"the kernel's reply was larger than {max_message_bytes} bytes",
            }
            self.probe_end(execution)
            execution.check_finished()
        listener.on_message_refused(execution)
