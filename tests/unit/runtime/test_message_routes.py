"""Where a kernel's messages go (`MessageRoutes`): pure routing, no kernel.

What a real kernel sends, and forges, is covered end to end by
tests/unit/runtime/test_untrusted_kernel.py; these pin the routing rules.
"""

from __future__ import annotations

import itertools
from typing import Any

from kernelgw.runtime.execution import END_KEY, EndedCell, QueuedExecution
from kernelgw.runtime.message_routes import MessageRoutes


class Listener:
    def __init__(self) -> None:
        self.output: list[tuple[QueuedExecution, str]] = []
        self.refused: list[QueuedExecution] = []
        self.anomalies: list[tuple[str, str]] = []
        self.late: list[tuple[str, str]] = []

    def current_execution(self) -> QueuedExecution | None:
        return None

    def on_output(self, execution: QueuedExecution, msg: dict[str, Any]) -> None:
        self.output.append((execution, msg["msg_type"]))

    def on_message_refused(self, execution: QueuedExecution) -> None:
        self.refused.append(execution)

    def on_anomaly(self, ended: EndedCell, what: str) -> None:
        self.anomalies.append((ended.execution_id, what))

    def on_late_output(self, ended: EndedCell, msg: dict[str, Any]) -> None:
        self.late.append((ended.execution_id, msg["msg_type"]))


class Client:
    """A Jupyter client's request (`ClientRequest`), as far as stdin goes."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.asked: list[dict[str, Any]] = []

    def should_abort(self) -> bool:
        return False

    def on_stdin(self, msg: dict[str, Any]) -> None:
        self.asked.append(msg)

    def origin(self) -> None:
        return None

    def ended(self, execution: QueuedExecution) -> None:
        pass


_ids = itertools.count(1)


def msg(msg_type: str, parent: str, content: dict[str, Any] | None = None) -> dict[str, Any]:
    """A kernel message, its msg_id numbered as jupyter_client numbers a session's."""
    return {
        "header": {"msg_id": f"kernel_1_{next(_ids)}", "msg_type": msg_type},
        "msg_type": msg_type,
        "parent_header": {"msg_id": parent},
        "content": content or {},
    }


def reply(execution: QueuedExecution, *, nonce: bool, status: str = "ok") -> dict[str, Any]:
    expressions = {END_KEY: {"status": "ok", "data": {"text/plain": repr(execution.nonce)}}} if nonce else {}
    assert execution.msg_id is not None
    return msg("execute_reply", execution.msg_id, {"status": status, "user_expressions": expressions})


class Probes:
    """The link's end of `MessageRoutes`: the end probes it was asked to send."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self) -> str:
        self.sent.append(f"probe-{len(self.sent) + 1}")
        return self.sent[-1]


def cell(routes: MessageRoutes, msg_id: str = "cell-1", **kwargs: Any) -> QueuedExecution:
    execution = QueuedExecution(execution_id=f"e-{msg_id}", code="1+1", timeout=10, **kwargs)
    routes.expect(execution, msg_id)
    return execution


async def test_a_reply_with_the_nonce_is_taken_and_needs_no_end_probe() -> None:
    probes, listener = Probes(), Listener()
    routes = MessageRoutes(probes)
    execution = cell(routes)
    routes.on_shell(reply(execution, nonce=True), listener)
    assert execution.reply_verified and execution.reply is not None
    assert probes.sent == [] and execution.anomalies == []


async def test_a_reply_without_the_nonce_ends_the_cell_only_with_its_end_probe() -> None:
    probes, listener = Probes(), Listener()
    routes = MessageRoutes(probes)
    execution = cell(routes)
    routes.on_shell(reply(execution, nonce=False, status="error"), listener)
    routes.on_shell(reply(execution, nonce=False, status="error"), listener)  # a second one: no second probe
    assert probes.sent == ["probe-1"] and execution.end_probe == "probe-1"
    assert execution.anomalies == ["an execute_reply that did not answer the request"]
    assert not execution.finished.is_set()
    routes.on_shell(msg("execute_reply", "probe-1", {"status": "ok"}), listener)
    routes.on_iopub(msg("status", "probe-1", {"execution_state": "idle"}), listener)
    assert execution.finished.is_set() and execution.probe_reply == {"status": "ok"}
    assert listener.output == []  # the probe's messages are the link's own


async def test_what_comes_for_a_cell_after_it_was_forgotten_is_an_anomaly() -> None:
    listener = Listener()
    routes = MessageRoutes(Probes())
    execution = cell(routes)
    routes.on_iopub(msg("stream", "cell-1", {"name": "stdout", "text": "1\n"}), listener)
    assert listener.output == [(execution, "stream")]
    routes.forget(execution)
    routes.on_iopub(msg("stream", "cell-1", {"name": "stdout", "text": "late\n"}), listener)
    routes.on_iopub(msg("status", "cell-1", {"execution_state": "idle"}), listener)  # an idle may come late
    routes.on_shell(reply(execution, nonce=True), listener)
    routes.on_iopub(msg("stream", "unknown", {"name": "stdout", "text": "?\n"}), listener)  # not ours: dropped
    assert listener.output == [(execution, "stream")]
    assert listener.late == [(execution.execution_id, "stream")]  # kept as the cell's late output
    assert listener.anomalies == [
        ("e-cell-1", "a stream message after the cell had ended"),
        ("e-cell-1", "an execute_reply after the cell had ended"),
    ]
    routes.forget_ended()
    routes.on_iopub(msg("stream", "cell-1", {"name": "stdout", "text": "later\n"}), listener)
    assert len(listener.anomalies) == 2


async def test_only_a_jupyter_clients_cell_is_asked_for_input() -> None:
    routes = MessageRoutes(Probes())
    client = Client()
    v1 = cell(routes, "v1")
    jupyter = cell(routes, "jupyter", client=client)
    routes.on_stdin(msg("input_request", v1.msg_id or "", {"prompt": "? "}))
    routes.on_stdin(msg("input_request", jupyter.msg_id or "", {"prompt": "name? "}))
    routes.on_stdin(msg("comm_msg", jupyter.msg_id or ""))
    assert [m["content"] for m in client.asked] == [{"prompt": "name? "}]


async def test_only_a_capped_v1_cells_output_is_left_unread() -> None:
    routes = MessageRoutes(Probes())
    capped = cell(routes, "capped", truncated=True)
    cell(routes, "open")
    cell(routes, "client", truncated=True, client=Client())
    assert routes.content_unread("stream", "capped")
    assert not routes.content_unread("error", "capped")  # errors are kept past the cap
    assert not routes.content_unread("stream", "open")
    assert not routes.content_unread("stream", "client")  # a Jupyter client gets its output
    assert not routes.content_unread("stream", None)
    routes.forget(capped)
    assert not routes.content_unread("stream", "capped")


async def test_a_refused_reply_ends_the_cell_with_an_error_after_its_end_probe() -> None:
    probes, listener = Probes(), Listener()
    routes = MessageRoutes(probes)
    execution = cell(routes)
    routes.on_refused("shell", execution, 1024, listener)
    assert execution.reply is not None and execution.reply["ename"] == "ReplyTooLarge"
    assert probes.sent == ["probe-1"] and listener.refused == [execution]
    routes.on_refused("iopub", None, 1024, listener)  # nothing was running
    assert listener.refused == [execution]
