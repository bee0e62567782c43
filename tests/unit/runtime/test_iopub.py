"""Jupyter iopub message -> event mapping (pure)."""

from __future__ import annotations

from typing import Any

import orjson

from kernelgw import events as ev
from kernelgw.runtime.iopub import payload_size, strip_ansi, to_event


def msg(msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
    return {"header": {"msg_type": msg_type}, "parent_header": {"msg_id": "p"}, "content": content}


def test_stream() -> None:
    event = to_event(msg("stream", {"name": "stderr", "text": "oops\n"}), "e1")
    assert event == ev.Stream(execution_id="e1", name="stderr", text="oops\n")


def test_display_keeps_bundle_untouched_and_display_id() -> None:
    png = "iVBORw0KGgo" * 1000
    event = to_event(
        msg(
            "display_data",
            {
                "data": {"image/png": png, "text/plain": "<Figure>"},
                "metadata": {"a": 1},
                "transient": {"display_id": "d"},
            },
        ),
        "e1",
    )
    assert isinstance(event, ev.Display)
    assert event.data["image/png"] is png  # passed through, never decoded
    assert event.display_id == "d" and event.metadata == {"a": 1}


def test_update_display_needs_a_display_id() -> None:
    assert to_event(msg("update_display_data", {"data": {}, "metadata": {}}), "e") is None
    event = to_event(msg("update_display_data", {"data": {"text/plain": "2"}, "transient": {"display_id": "d"}}), "e")
    assert isinstance(event, ev.UpdateDisplay) and event.display_id == "d"


def test_execute_result_and_clear_output() -> None:
    event = to_event(msg("execute_result", {"execution_count": 3, "data": {"text/plain": "42"}, "metadata": {}}), "e")
    assert isinstance(event, ev.Result) and event.execution_count == 3
    assert to_event(msg("clear_output", {"wait": True}), "e") == ev.ClearOutput(execution_id="e", wait=True)


def test_error_keeps_ansi_and_plain_traceback() -> None:
    tb = ["\x1b[0;31mZeroDivisionError\x1b[0m: division by zero"]
    event = to_event(msg("error", {"ename": "ZeroDivisionError", "evalue": "division by zero", "traceback": tb}), "e")
    assert isinstance(event, ev.Error)
    assert event.traceback == tb
    assert event.traceback_text == ["ZeroDivisionError: division by zero"]


def test_status_and_ignored_messages() -> None:
    assert to_event(msg("status", {"execution_state": "busy"}), "e") == ev.Status(execution_id="e", state="busy")
    assert to_event(msg("status", {"execution_state": "starting"}), "e") is None
    assert to_event(msg("execute_input", {"code": "1"}), "e") is None
    assert to_event(msg("comm_open", {}), "e") is None
    assert to_event(msg("stream", {"name": "weird", "text": "x"}), "e") is None


def test_strip_ansi_handles_common_sequences() -> None:
    assert strip_ansi("\x1b[1;32mgreen\x1b[0m \x1b[?25lx") == "green x"


def test_payload_size() -> None:
    assert payload_size(ev.Stream(name="stdout", text="abc")) == 3
    assert payload_size(ev.Display(data={"text/plain": "ab", "image/png": "cdef"})) == 6
    assert payload_size(ev.Done(status="ok", duration_ms=1)) == 0


def test_payload_size_counts_json_values_as_their_json() -> None:
    chart = {"type": "line", "elements": [{"label": "a", "points": [[i * 0.5, i] for i in range(10_000)]}]}
    display = ev.Display(data={"text/plain": "ab", "application/vnd.kernelgw.chart+json": chart})
    assert payload_size(display) == 2 + len(orjson.dumps(chart)) > 100_000
    huge = {"n": 2**70}  # past orjson's 64 bits: str() instead
    assert payload_size(ev.Result(data={"application/json": huge})) == len(str(huge))


def test_payload_size_counts_metadata_errors_in_full_and_clear_output() -> None:
    from kernelgw import events as ev
    from kernelgw.runtime.iopub import payload_size

    display = ev.Display(execution_id="e", data={"text/plain": "x"}, metadata={"pad": "y" * 1000})
    assert payload_size(display) > 1000
    error = ev.Error(execution_id="e", ename="E", evalue="v" * 10, traceback=["a" * 5], traceback_text=["a" * 5])
    assert payload_size(error) == 1 + 10 + 5 + 5
    assert payload_size(ev.ClearOutput(execution_id="e")) > 0


def test_a_huge_error_is_trimmed_to_its_start_and_last_frames() -> None:
    from kernelgw import events as ev
    from kernelgw.runtime.iopub import payload_size, trim_error

    tb = [f"frame {i}\n" for i in range(1000)] + ["ValueError: " + "x" * 100_000]
    error = ev.Error(execution_id="e", ename="ValueError", evalue="x" * 3_000_000, traceback=tb, traceback_text=tb)
    trimmed = trim_error(error, 64 * 1024)
    assert payload_size(trimmed) < 80 * 1024
    assert trimmed.ename == "ValueError" and trimmed.evalue.startswith("x" * 1000)
    assert "characters cut" in trimmed.evalue
    assert trimmed.traceback[0] == "... [981 traceback lines cut]"
    assert trimmed.traceback[-1].startswith("ValueError: xxx") and trimmed.traceback[-2] == "frame 999\n"
    small = ev.Error(execution_id="e", ename="E", evalue="v", traceback=["t"], traceback_text=["t"])
    assert trim_error(small, 64 * 1024) is small
