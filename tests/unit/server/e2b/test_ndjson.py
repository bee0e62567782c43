"""kernelgw's events as E2B's NDJSON lines, read back by E2B's own SDK parser."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from e2b_code_interpreter.models import Execution, parse_output

from kernelgw import events as ev
from kernelgw.server.e2b import ndjson
from kernelgw.server.e2b.ndjson import Translation

NOW = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
EID = "e1"


def feed(events: list[ev.Event], translation: Translation | None = None) -> tuple[list[dict[str, Any]], Execution]:
    """The lines for ``events`` (each a whole line), decoded, and what E2B's SDK makes of them."""
    translation = translation or Translation()
    lines = [line for event in events for line in translation.feed(event, NOW)]
    assert all(line.endswith("\n") and line.count("\n") == 1 for line in lines)
    execution = Execution()
    for line in lines:
        parse_output(execution, line)
    return [json.loads(line) for line in lines], execution


def done(status: ev.DoneStatus = "ok", count: int | None = 3, reason: str | None = None) -> ev.Done:
    return ev.Done(execution_id=EID, status=status, execution_count=count, duration_ms=1.0, reason=reason)


def error(name: str = "ZeroDivisionError", value: str = "division by zero") -> ev.Error:
    return ev.Error(
        execution_id=EID,
        ename=name,
        evalue=value,
        traceback=["\x1b[31m---\x1b[0m", "Cell In[1], line 1\n----> 1 1/0\n", f"{name}: {value}"],
        traceback_text=["---", "Cell In[1], line 1\n----> 1 1/0\n", f"{name}: {value}"],
    )


def test_streams_carry_their_text_and_when_they_were_passed_on() -> None:
    lines, execution = feed(
        [
            ev.Stream(execution_id=EID, name="stdout", text="out\n"),
            ev.Stream(execution_id=EID, name="stderr", text="err\n"),
        ]
    )
    assert lines == [
        {"type": "stdout", "text": "out\n", "timestamp": "2026-01-02T03:04:05.678000+00:00"},
        {"type": "stderr", "text": "err\n", "timestamp": "2026-01-02T03:04:05.678000+00:00"},
    ]
    assert execution.logs.stdout == ["out\n"]
    assert execution.logs.stderr == ["err\n"]


def test_every_mime_type_of_a_display_reaches_its_field_and_the_rest_extra() -> None:
    data = {
        "text/plain": "<Figure>",
        "text/html": "<b>x</b>",
        "text/markdown": "**x**",
        "image/svg+xml": "<svg/>",
        "image/png": "iVBORw0KGgo=",
        "image/jpeg": "/9j/4AAQ",
        "application/pdf": "JVBERi0=",
        "text/latex": "$x$",
        "application/json": {"a": [1, 2]},
        "application/javascript": "alert(1)",
        "e2b/data": {"columns": ["a"]},
        "e2b/chart": {"type": "unknown", "title": "t", "elements": []},
        "application/vnd.custom+json": {"k": "v"},
    }
    lines, execution = feed([ev.Display(execution_id=EID, data=data)])
    assert lines == [
        {
            "type": "result",
            "text": "<Figure>",
            "html": "<b>x</b>",
            "markdown": "**x**",
            "svg": "<svg/>",
            "png": "iVBORw0KGgo=",
            "jpeg": "/9j/4AAQ",
            "pdf": "JVBERi0=",
            "latex": "$x$",
            "json": {"a": [1, 2]},
            "javascript": "alert(1)",
            "data": {"columns": ["a"]},
            "chart": {"type": "unknown", "title": "t", "elements": []},
            "extra": {"application/vnd.custom+json": {"k": "v"}},
            "is_main_result": False,
        }
    ]
    (result,) = execution.results
    assert (result.png, result.json, result.data) == ("iVBORw0KGgo=", {"a": [1, 2]}, {"columns": ["a"]})
    assert result.extra == {"application/vnd.custom+json": {"k": "v"}}
    assert result.chart is not None and result.chart.title == "t"
    assert not result.is_main_result
    assert execution.text is None  # a display is not the cell's value


def test_the_cells_value_is_the_main_result_without_its_quotes() -> None:
    lines, execution = feed(
        [
            ev.Result(execution_id=EID, execution_count=7, data={"text/plain": "'hello'"}),
            done(count=7),
        ]
    )
    assert lines[0] == {"type": "result", "text": "hello", "extra": {}, "is_main_result": True}
    assert execution.text == "hello"
    assert execution.execution_count == 7


@pytest.mark.parametrize(
    ("plain", "text"),
    [('"a"', "a"), ("'", "'"), ("'a\"", "'a\""), ("2", "2"), ("''", "")],
)
def test_only_one_pair_of_matching_enclosing_quotes_is_taken_off(plain: str, text: str) -> None:
    assert ndjson.result({"text/plain": plain}, main=True).text == text


def test_a_kernel_error_has_its_name_value_and_traceback_as_one_string() -> None:
    lines, execution = feed([error(), done("error")])
    assert lines[0] == {
        "type": "error",
        "name": "ZeroDivisionError",
        "value": "division by zero",
        "traceback": "\x1b[31m---\x1b[0mCell In[1], line 1\n----> 1 1/0\nZeroDivisionError: division by zero",
    }
    assert [line["type"] for line in lines] == ["error", "number_of_executions", "end_of_execution"]
    assert execution.error is not None and execution.error.name == "ZeroDivisionError"


def test_an_ok_cell_ends_with_its_count_then_the_end() -> None:
    lines, execution = feed([done(count=4)])
    assert lines == [{"type": "number_of_executions", "execution_count": 4}, {"type": "end_of_execution"}]
    assert execution.error is None
    assert execution.execution_count == 4


def test_a_cell_without_a_count_ends_with_the_end_only() -> None:
    lines, _ = feed([done(status="dead", count=None, reason="the session was deleted")])
    assert [line["type"] for line in lines] == ["error", "end_of_execution"]


def test_the_count_of_the_result_serves_when_the_done_has_none() -> None:
    lines, _ = feed([ev.Result(execution_id=EID, execution_count=2, data={"text/plain": "1"}), done(count=None)])
    assert {"type": "number_of_executions", "execution_count": 2} in lines


@pytest.mark.parametrize(
    ("status", "reason", "name"),
    [
        ("timeout", "the execution exceeded its timeout of 2s and was interrupted", ndjson.EXECUTION_TIMEOUT),
        ("interrupted", "interrupted", ndjson.EXECUTION_INTERRUPTED),
        ("dead", "out-of-memory: the kernel used more memory than the session's limit", ndjson.OUT_OF_MEMORY),
        ("dead", "the kernel exited with code 1", ndjson.KERNEL_DIED),
        ("error", "the kernel's reply was larger than the limit", ndjson.EXECUTION_FAILED),
    ],
)
def test_how_the_gateway_ended_a_cell_is_the_last_error(status: ev.DoneStatus, reason: str, name: str) -> None:
    # a timeout's interrupt makes the kernel raise first: the gateway's verdict comes after it, and wins
    events: list[ev.Event] = [error("KeyboardInterrupt", "")] if status != "error" else []
    lines, execution = feed([*events, done(status, reason=reason)])
    assert lines[-3] == {"type": "error", "name": name, "value": reason, "traceback": ""}
    assert execution.error is not None and (execution.error.name, execution.error.value) == (name, reason)


def test_an_error_cell_whose_error_was_sent_gets_no_second_one() -> None:
    lines, _ = feed([error(), done("error", reason="ZeroDivisionError: division by zero")])
    assert [line["type"] for line in lines].count("error") == 1


def test_output_over_the_cap_is_an_error_and_a_later_kernel_error_wins() -> None:
    cut = ev.Truncated(execution_id=EID, limit_bytes=100, message="output exceeded 100 bytes; the rest was dropped")
    lines, execution = feed([cut, done()])
    assert lines[0] == {
        "type": "error",
        "name": ndjson.OUTPUT_TRUNCATED,
        "value": "output exceeded 100 bytes; the rest was dropped",
        "traceback": "",
    }
    assert execution.error is not None and execution.error.name == ndjson.OUTPUT_TRUNCATED
    _, execution = feed([cut, error(), done("error")])
    assert execution.error is not None and execution.error.name == "ZeroDivisionError"


def test_events_with_no_e2b_form_give_no_line() -> None:
    events: list[ev.Event] = [
        ev.Queued(execution_id=EID, code="1"),
        ev.Status(execution_id=EID, state="busy"),
        ev.ClearOutput(execution_id=EID),
        ev.UpdateDisplay(execution_id=EID, data={"text/plain": "x"}, display_id="d"),
        ev.Replay(execution_id=EID, phase="cell", trigger="requested", cells=1),
        ev.Late(execution_id=EID, event=ev.Stream(execution_id=EID, name="stdout", text="late")),
    ]
    assert feed(events)[0] == []


def test_nothing_comes_after_the_end() -> None:
    translation = Translation()
    feed([done()], translation)
    assert translation.ended
    assert translation.feed(ev.Stream(execution_id=EID, name="stdout", text="x"), NOW) == []
    assert translation.feed(done(), NOW) == []
    assert translation.cut_short("why") == []


def test_a_stream_cut_short_ends_with_e2b_unexpected_end() -> None:
    translation = Translation()
    lines = [json.loads(line) for line in translation.cut_short("the gateway is restarting")]
    assert lines == [
        {"type": "error", "name": "UnexpectedEndOfExecution", "value": "the gateway is restarting", "traceback": ""},
        {"type": "end_of_execution"},
    ]
    assert translation.ended


def test_a_keepalive_is_a_line_the_sdk_skips() -> None:
    execution = Execution()
    parse_output(execution, ndjson.KEEPALIVE)
    assert ndjson.KEEPALIVE.endswith("\n")
    assert (execution.results, execution.error, execution.logs.stdout) == ([], None, [])


def test_kernelgw_chart_and_data_types_are_e2b_chart_and_data() -> None:
    chart = {"type": "line", "title": "t", "x_label": "x", "y_label": "y", "x_unit": None, "y_unit": None}
    chart |= {"x_ticks": [], "x_tick_labels": [], "x_scale": "linear", "y_ticks": [], "y_tick_labels": []}
    chart |= {"y_scale": "linear", "elements": []}
    data = {"a": [1, 2]}
    lines, execution = feed(
        [ev.Result(execution_id=EID, data={"text/plain": "<Figure>", ev.CHART_MIME: chart, ev.DATA_MIME: data})]
    )
    assert (lines[0]["chart"], lines[0]["data"], lines[0]["extra"]) == (chart, data, {})
    (result,) = execution.results
    assert result.data == data
    assert result.chart is not None and result.chart.title == "t"
