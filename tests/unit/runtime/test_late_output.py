"""Late output (kernelgw.runtime.late_output, message_routes): what a kernel sends
for a cell after the gateway decided its end is routed as late, whatever the
timing, counted against the cell's output cap, and an error marks the cell."""

from __future__ import annotations

from typing import Any

from kernelgw import events as ev
from kernelgw.runtime.cell_end import error_after_reply
from kernelgw.runtime.cell_output import CellOutput
from kernelgw.runtime.execution import EndedCell, QueuedExecution
from kernelgw.runtime.late_output import late_events
from kernelgw.runtime.message_routes import MessageRoutes
from tests.unit.runtime.conftest import session_config


def iopub(msg_type: str, parent: str, **content: Any) -> dict[str, Any]:
    return {
        "header": {"msg_type": msg_type, "msg_id": "k_1_9"},
        "msg_type": msg_type,
        "parent_header": {"msg_id": parent},
        "content": content,
    }


def stream(parent: str, text: str) -> dict[str, Any]:
    return iopub("stream", parent, name="stdout", text=text)


def error(parent: str) -> dict[str, Any]:
    return iopub("error", parent, ename="ValueError", evalue="late", traceback=["tb"])


class Listener:
    def __init__(self, current: QueuedExecution | None = None) -> None:
        self.current = current
        self.output: list[str] = []
        self.late: list[tuple[EndedCell, str]] = []
        self.anomalies: list[str] = []

    def current_execution(self) -> QueuedExecution | None:
        return self.current

    def on_output(self, execution: QueuedExecution, msg: dict[str, Any]) -> None:
        self.output.append(msg["content"].get("text", msg["msg_type"]))

    def on_message_refused(self, execution: QueuedExecution) -> None:
        pass

    def on_anomaly(self, ended: EndedCell, what: str) -> None:
        self.anomalies.append(what)

    def on_late_output(self, ended: EndedCell, msg: dict[str, Any]) -> None:
        self.late.append((ended, msg["content"].get("text", msg["msg_type"])))


async def test_output_after_the_end_is_decided_is_late_before_and_after_the_cell_is_forgotten() -> None:
    routes = MessageRoutes(lambda: None)
    rec = QueuedExecution(execution_id="e1", code="x", timeout=10)
    routes.expect(rec, "m1")
    listener = Listener(rec)
    routes.on_iopub(stream("m1", "on time"), listener)
    rec.output_bytes = 7
    rec.finished.set()  # a reply and an idle, forged or not: the end is decided
    routes.on_iopub(stream("m1", "before forget"), listener)  # was dropped unseen
    routes.forget(rec)
    routes.on_iopub(stream("m1", "after forget"), listener)
    routes.on_iopub(iopub("clear_output", "m1", wait=False), listener)  # would hide output: not kept
    routes.on_iopub(stream("never-sent", "nobody's"), listener)
    routes.on_iopub({**stream("", "no parent"), "parent_header": {}}, listener)
    assert listener.output == ["on time"]
    assert [text for _, text in listener.late] == ["before forget", "after forget"]
    first, second = (cell for cell, _ in listener.late)
    assert first is second and first.execution_id == "e1" and first.output_bytes == 7
    assert len(listener.anomalies) == 2


async def test_silent_requests_have_no_late_output() -> None:
    routes = MessageRoutes(lambda: None)
    rec = QueuedExecution(execution_id="s", code="", timeout=10, silent=True)
    routes.expect(rec, "m1")
    rec.finished.set()
    listener = Listener()
    routes.on_iopub(stream("m1", "x"), listener)
    routes.forget(rec)
    routes.on_iopub(stream("m1", "y"), listener)
    assert listener.late == [] and listener.anomalies == []


async def ended(output_bytes: int = 0) -> EndedCell:
    rec = QueuedExecution(execution_id="e1", code="x", timeout=10, output_bytes=output_bytes)
    return EndedCell.of(rec)


async def test_late_output_counts_against_the_cells_cap_and_says_where_it_cut() -> None:
    config = session_config(max_output_bytes=100)
    cell = await ended(output_bytes=90)
    (kept,) = late_events(cell, stream("m1", "12345"), config)
    assert isinstance(kept, ev.Stream) and kept.text == "12345" and kept.execution_id == "e1"
    head, note = late_events(cell, stream("m1", "abcdefghij"), config)
    assert isinstance(head, ev.Stream) and head.text == "abcde"
    assert isinstance(note, ev.Truncated) and note.limit_bytes == 100
    assert cell.truncated
    assert late_events(cell, stream("m1", "more"), config) == []
    assert not cell.late_error
    (first,) = late_events(cell, error("m1"), config)  # past the cap, the first error is kept ...
    assert isinstance(first, ev.Error) and cell.late_error
    assert late_events(cell, error("m1"), config) == []  # ... the next ones are not


async def test_a_late_error_is_kept_trimmed_and_marks_the_cell() -> None:
    cell = await ended()
    (kept,) = late_events(cell, error("m1"), session_config())
    assert isinstance(kept, ev.Error) and kept.ename == "ValueError" and kept.traceback_text == ["tb"]
    assert cell.late_error


async def test_late_statuses_clears_and_unknown_messages_are_not_output() -> None:
    cell = await ended()
    config = session_config()
    for msg in (iopub("status", "m1", execution_state="idle"), iopub("clear_output", "m1"), iopub("comm_msg", "m1")):
        assert late_events(cell, msg, config) == []
    assert cell.output_bytes == 0


async def test_a_late_image_over_its_limit_is_replaced_by_a_note() -> None:
    cell = await ended()
    msg = iopub("display_data", "m1", data={"image/png": "A" * 500, "text/plain": "fig"}, metadata={})
    note, shown = late_events(cell, msg, session_config(max_image_bytes=100))
    assert isinstance(note, ev.Truncated) and isinstance(shown, ev.Display)
    assert "image/png" not in shown.data and "removed" in shown.data["text/plain"]


def test_a_late_event_round_trips_and_old_clients_can_skip_it() -> None:
    late = ev.Late(seq=9, execution_id="e1", event=ev.Stream(execution_id="e1", name="stdout", text="hi"))
    assert ev.parse_event(late.model_dump_json()) == late
    assert "late" in ev.EVENT_TYPES


def error_numbered(parent: str, order: int) -> dict[str, Any]:
    return {**error(parent), "header": {"msg_type": "error", "msg_id": f"k_1_{order}"}}


async def test_an_error_sent_after_the_verified_reply_means_the_reply_was_forged() -> None:
    """Before the gateway decided the end, an error ordered after the reply: the
    reply was forged (an honest kernel replies last), so the cell is an error."""
    rec = QueuedExecution(execution_id="e1", code="x", timeout=10)
    output = CellOutput(session_config(), lambda event, owner: None)
    rec.reply_order = 5
    output.handle(rec, error_numbered("m1", 4))  # a display formatter's error, before the reply
    assert not error_after_reply(rec)
    output.handle(rec, error_numbered("m1", 7))
    assert error_after_reply(rec)
    rec.reply_order = None  # an unverified reply waits for its end probe instead
    assert not error_after_reply(rec)
