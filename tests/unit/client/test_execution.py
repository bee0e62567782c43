"""Execution and ExecutionBuilder, from hand-written event lists."""

from __future__ import annotations

import base64

import pytest

from kernelgw.client.execution import Execution, ExecutionBuilder, ExecutionError
from kernelgw.errors import KernelGWError
from kernelgw.events import CHART_MIME, DATA_MIME, Display, Result, Stream

EID = "e1"
PNG1 = b"\x89PNG\r\n\x1a\n-one"
PNG2 = b"\x89PNG\r\n\x1a\n-two"
PNG3 = b"\x89PNG\r\n\x1a\n-three"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def ev(type_: str, seq: int, **fields):
    return {"type": type_, "seq": seq, "execution_id": EID, **fields}


def run_events(*body, status="ok", count=1, **done):
    """queued, busy, *body, done -- as the gateway sends them."""
    events = [ev("queued", 1, code="..."), ev("status", 2, state="busy")]
    events += [{**e, "seq": 3 + i} for i, e in enumerate(body)]
    events.append(ev("done", 3 + len(body), status=status, execution_count=count, duration_ms=12.5, **done))
    return events


def stream(name, text):
    return {"type": "stream", "execution_id": EID, "name": name, "text": text}


def display(data, display_id=None):
    return {"type": "display", "execution_id": EID, "data": data, "display_id": display_id}


def update(data, display_id):
    return {"type": "update_display", "execution_id": EID, "data": data, "display_id": display_id}


def clear(wait=False):
    return {"type": "clear_output", "execution_id": EID, "wait": wait}


def result(data, count=1):
    return {"type": "result", "execution_id": EID, "data": data, "execution_count": count}


def error(ename="ZeroDivisionError", evalue="division by zero"):
    return {
        "type": "error",
        "execution_id": EID,
        "ename": ename,
        "evalue": evalue,
        "traceback": ["\x1b[31mTraceback\x1b[0m", f"{ename}: {evalue}"],
        "traceback_text": ["Traceback", f"{ename}: {evalue}"],
    }


def test_ok_execution_basics():
    ex = Execution(run_events(result({"text/plain": "42"}, count=3), count=3))
    assert ex.execution_id == EID
    assert ex.status == "ok" and ex.ok and ex.finished
    assert ex.execution_count == 3
    assert ex.duration_ms == 12.5
    assert ex.reason is None and ex.state_lost is False
    assert ex.text == "42"
    assert ex.error is None
    assert ex.code == "..."
    assert ex.events[-1].type == "done"
    assert ex.raise_for_error() is ex


def test_stdout_and_stderr_are_concatenated_in_order():
    ex = Execution(
        run_events(
            stream("stdout", "a\n"),
            stream("stderr", "warn\n"),
            stream("stdout", "b"),
            stream("stdout", "c\n"),
            stream("stderr", "more\n"),
        )
    )
    assert ex.stdout == "a\nbc\n"
    assert ex.stderr == "warn\nmore\n"
    # The notebook view merges consecutive chunks of the same stream only.
    assert [(o.name, o.text) for o in ex.outputs] == [
        ("stdout", "a\n"),
        ("stderr", "warn\n"),
        ("stdout", "bc\n"),
        ("stderr", "more\n"),
    ]


def test_images_are_decoded_from_displays_and_results_in_order():
    ex = Execution(
        run_events(
            display({"image/png": b64(PNG1), "text/plain": "<Figure>"}),
            display({"text/plain": "no image"}),
            result({"image/png": b64(PNG2), "text/plain": "<Image>"}),
        )
    )
    assert ex.images == [PNG1, PNG2]
    assert ex._repr_png_() == PNG1
    assert len(ex.displays) == 2
    assert ex.text == "<Image>"


CHART = {"type": "line", "title": "Growth", "elements": [{"label": "a", "points": [[0, 1.0], [1, 2.0]]}]}
BAR = {"type": "bar", "title": None, "elements": [{"label": "x", "group": "Group 0", "value": 3.0}]}
TABLE = {"price": [9.5, None], "when": ["2024-01-01T00:00:00", None]}


def test_charts_and_data_are_read_from_what_is_shown_in_order():
    ex = Execution(
        run_events(
            display({"image/png": b64(PNG1), CHART_MIME: CHART, "text/plain": "<Figure>"}),
            display({"text/plain": "<Figure>", "image/png": b64(PNG2)}),  # a blank figure: no chart
            display({CHART_MIME: "not a chart", "text/plain": "x"}),  # not a JSON object: ignored
            result({"text/plain": "   price", "text/html": "<table/>", DATA_MIME: TABLE}),
        )
    )
    assert ex.charts == [CHART]
    assert ex.charts[0]["type"] == "line" and ex.charts[0]["title"] == "Growth"
    assert ex.data == [TABLE]
    assert "charts=1" in repr(ex) and "data=1" in repr(ex)

    # the display view: a cleared chart is gone, an updated one replaced
    ex = Execution(
        run_events(
            display({CHART_MIME: CHART}, display_id="d"),
            clear(),
            display({CHART_MIME: CHART}, display_id="d"),
            update({CHART_MIME: BAR}, "d"),
        )
    )
    assert ex.charts == [BAR]
    assert ex.data == []


def test_base64_with_line_breaks_is_accepted():
    wrapped = "\n".join(b64(PNG1)[i : i + 8] for i in range(0, len(b64(PNG1)), 8)) + "\n"
    ex = Execution(run_events(display({"image/png": wrapped})))
    assert ex.images == [PNG1]


def test_no_output():
    ex = Execution(run_events())
    assert ex.stdout == "" and ex.stderr == ""
    assert ex.text is None and ex.images == [] and ex.displays == [] and ex.results == []
    assert ex._repr_png_() is None


def test_update_display_replaces_the_display_with_that_id():
    ex = Execution(
        run_events(
            display({"text/plain": "0%"}, display_id="bar"),
            display({"text/plain": "other"}, display_id="x"),
            update({"text/plain": "50%"}, display_id="bar"),
            update({"text/plain": "100%", "image/png": b64(PNG1)}, display_id="bar"),
            update({"text/plain": "ignored"}, display_id="not-shown-here"),
        )
    )
    assert [d.data["text/plain"] for d in ex.displays] == ["100%", "other"]
    assert ex.displays[0].display_id == "bar"
    assert ex.images == [PNG1]


def test_update_display_updates_every_display_with_that_id():
    ex = Execution(
        run_events(
            display({"text/plain": "a"}, display_id="d"),
            display({"text/plain": "a"}, display_id="d"),
            update({"text/plain": "b"}, display_id="d"),
        )
    )
    assert [d.data["text/plain"] for d in ex.displays] == ["b", "b"]


def test_clear_output_empties_what_was_shown_so_far():
    ex = Execution(
        run_events(
            stream("stdout", "frame 1\n"),
            display({"image/png": b64(PNG1)}),
            clear(wait=False),
            stream("stdout", "frame 2\n"),
            display({"image/png": b64(PNG2)}),
        )
    )
    assert ex.images == [PNG2]
    assert [type(o) for o in ex.outputs] == [Stream, Display]
    assert ex.outputs[0].text == "frame 2\n"
    # The log keeps everything.
    assert ex.stdout == "frame 1\nframe 2\n"


def test_clear_output_wait_clears_right_before_the_next_output():
    ex = Execution(
        run_events(
            display({"image/png": b64(PNG1)}),
            clear(wait=True),
        )
    )
    assert ex.images == [PNG1]  # nothing new arrived: the old output stays

    ex = Execution(
        run_events(
            display({"image/png": b64(PNG1)}),
            clear(wait=True),
            display({"image/png": b64(PNG2)}),
            display({"image/png": b64(PNG3)}),
        )
    )
    assert ex.images == [PNG2, PNG3]  # cleared once, not before every output


def test_animation_with_clear_output_wait_shows_the_last_frame():
    frames = []
    for png in (PNG1, PNG2, PNG3):
        frames += [clear(wait=True), display({"image/png": b64(png)})]
    ex = Execution(run_events(*frames))
    assert ex.images == [PNG3]


def test_update_display_does_not_trigger_a_pending_clear():
    ex = Execution(
        run_events(
            display({"text/plain": "a"}, display_id="d"),
            clear(wait=True),
            update({"text/plain": "b"}, display_id="d"),
        )
    )
    assert [d.data["text/plain"] for d in ex.displays] == ["b"]


def test_clear_output_without_wait_cancels_a_pending_clear():
    ex = Execution(
        run_events(
            stream("stdout", "x"),
            clear(wait=True),
            clear(wait=False),
            stream("stdout", "y"),
            stream("stdout", "z"),
        )
    )
    assert [o.text for o in ex.outputs] == ["yz"]


def test_error_and_raise_for_error():
    ex = Execution(run_events(stream("stdout", "before\n"), error(), status="error", count=2))
    assert not ex.ok and ex.status == "error"
    assert ex.error is not None
    assert ex.error.ename == "ZeroDivisionError"
    assert ex.error.evalue == "division by zero"
    with pytest.raises(ExecutionError) as info:
        ex.raise_for_error()
    exc = info.value
    assert isinstance(exc, KernelGWError)
    assert exc.ename == "ZeroDivisionError"
    assert exc.evalue == "division by zero"
    assert exc.traceback == ["Traceback", "ZeroDivisionError: division by zero"]
    assert "\x1b" not in exc.traceback_text
    assert str(exc) == "ZeroDivisionError: division by zero"
    assert exc.status == "error" and exc.execution_id == EID


@pytest.mark.parametrize("status", ["timeout", "dead"])
def test_raise_for_error_without_an_error_event(status):
    ex = Execution(run_events(status=status, count=None, reason="took longer than 1s", state_lost=True))
    assert ex.error is None
    assert ex.reason == "took longer than 1s"
    assert ex.state_lost is True
    assert ex.execution_count is None
    with pytest.raises(ExecutionError) as info:
        ex.raise_for_error()
    assert info.value.ename is None
    assert info.value.status == status
    assert status in str(info.value) and "took longer than 1s" in str(info.value)


def test_interrupted_with_keyboard_interrupt():
    ex = Execution(run_events(error("KeyboardInterrupt", ""), status="interrupted"))
    with pytest.raises(ExecutionError) as info:
        ex.raise_for_error()
    assert info.value.ename == "KeyboardInterrupt"
    assert info.value.status == "interrupted"


def test_from_response():
    body = {
        "execution_id": EID,
        "status": "ok",
        "execution_count": 1,
        "duration_ms": 12.5,
        "events": run_events(stream("stdout", "hi\n"), result({"text/plain": "1"})),
    }
    ex = Execution.from_response(body)
    assert ex.execution_id == EID and ex.ok and ex.stdout == "hi\n" and ex.text == "1"


def test_from_response_without_done_event_uses_the_answer_fields():
    body = {
        "execution_id": EID,
        "status": "timeout",
        "execution_count": None,
        "duration_ms": 1000.0,
        "events": [ev("stream", 1, name="stdout", text="x")],
    }
    ex = Execution.from_response(body)
    assert ex.status == "timeout" and ex.duration_ms == 1000.0 and ex.stdout == "x"


def test_builder_is_incremental_and_ignores_other_executions():
    builder = ExecutionBuilder()
    events = run_events(stream("stdout", "1"), stream("stdout", "2"), result({"text/plain": "3"}))
    for event in events[:3]:
        builder.add(event)
    partial = builder.build()
    assert partial.stdout == "1" and partial.status is None and not partial.finished
    assert not builder.finished
    partial.raise_for_error()  # no error so far: not raised

    other = {"type": "stream", "execution_id": "someone-else", "name": "stdout", "text": "nope"}
    assert builder.add(other).execution_id == "someone-else"
    for event in events[3:]:
        builder.add(event)
    assert builder.finished
    ex = builder.build()
    assert ex.stdout == "12" and ex.text == "3" and ex.ok
    assert isinstance(ex.results[0], Result)
    # The earlier snapshot did not change.
    assert partial.stdout == "1"


def test_builder_accepts_json_text():
    builder = ExecutionBuilder(EID)
    event = builder.add('{"type": "stream", "seq": 5, "execution_id": "e1", "name": "stdout", "text": "hi"}')
    assert isinstance(event, Stream)
    assert builder.build().stdout == "hi"


def test_text_joins_list_valued_text_plain():
    ex = Execution(run_events(result({"text/plain": ["4", "2"]})))
    assert ex.text == "42"


def test_repr_and_html():
    ex = Execution(
        run_events(
            stream("stdout", "<b>hi</b>\n"),
            display({"text/html": "<script>alert(1)</script>", "text/plain": "table"}),
            display({"image/png": b64(PNG1)}),
            result({"text/plain": "42"}),
        )
    )
    r = repr(ex)
    assert r.startswith("Execution(") and "'42'" in r and "images=1" in r
    page = ex._repr_html_()
    assert "&lt;b&gt;hi&lt;/b&gt;" in page
    assert "<script>" not in page  # sandbox HTML is not passed through
    assert f"data:image/png;base64,{b64(PNG1)}" in page
    assert "<pre>42</pre>" in page


def test_html_of_a_failed_execution_shows_traceback_and_reason():
    ex = Execution(run_events(error(), status="error"))
    assert "ZeroDivisionError: division by zero" in ex._repr_html_()
    ex = Execution(run_events(status="timeout", reason="too slow", state_lost=True))
    page = ex._repr_html_()
    assert "execution timeout: too slow" in page and "state is lost" in page
