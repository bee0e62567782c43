"""History -> notebook mapping and the restore plan (kernelgw.notebook), pure."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import nbformat
import pytest

from kernelgw import events as ev
from kernelgw.runtime.execution_queue import FOLLOW_MISSED
from kernelgw.runtime.session import DETACHED_DONE_REASON
from kernelgw.server.notebook import (
    LATE_NOTE,
    InvalidNotebook,
    build_notebook,
    plan_from_executions,
    read_notebook,
    replay_plan,
)
from kernelgw.storage.records import ExecutionRecord, NoteRecord

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def execution(
    position: int, code: str, events: list[ev.Event], *, status: str = "ok", count: int | None = None, seq: int = 0
) -> ExecutionRecord:
    eid = f"e{position}"
    done = ev.Done(
        execution_id=eid,
        status=status,
        execution_count=count,
        duration_ms=12.5,
        reason=None if status == "ok" else f"{status} happened",
    )  # type: ignore[arg-type]
    all_events = [ev.Queued(execution_id=eid, code=code), ev.Status(execution_id=eid, state="busy"), *events, done]
    return ExecutionRecord(
        session_id="s1",
        position=position,
        execution_id=eid,
        seq=seq or (position + 1) * 100,
        code=code,
        status=status,
        execution_count=count,
        started_at=T0,
        duration_ms=12.5,
        reason=done.reason,
        state_lost=False,
        events_json="[" + ",".join(e.model_dump_json() for e in all_events) + "]",
    )


def out(kind: str, **fields: Any) -> dict[str, Any]:
    return {"output_type": kind, **fields}


def outputs(cell: Any) -> list[dict[str, Any]]:
    return json.loads(json.dumps(cell["outputs"]))


def test_stream_chunks_merge_per_name_like_jupyter() -> None:
    nb = build_notebook(
        [
            execution(
                0,
                "...",
                [
                    ev.Stream(name="stdout", text="a"),
                    ev.Stream(name="stdout", text="b\n"),
                    ev.Stream(name="stderr", text="warn\n"),
                    ev.Stream(name="stdout", text="c\n"),
                ],
                count=1,
            ),
        ]
    )
    assert outputs(nb.cells[0]) == [
        out("stream", name="stdout", text="ab\n"),
        out("stream", name="stderr", text="warn\n"),
        out("stream", name="stdout", text="c\n"),
    ]
    assert nb.cells[0].execution_count == 1


def test_display_result_and_error_map_to_nbformat_outputs() -> None:
    tb = ["\x1b[0;31mZeroDivisionError\x1b[0m Traceback", "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero"]
    nb = build_notebook(
        [
            execution(
                0,
                "plot",
                [
                    ev.Display(
                        data={"image/png": PNG, "text/plain": "<Figure>"},
                        metadata={"image/png": {"width": 1}},
                        display_id="d1",
                    ),
                    ev.Result(execution_count=3, data={"text/plain": "42", "text/html": "<b>42</b>"}),
                    ev.Error(
                        ename="ZeroDivisionError", evalue="division by zero", traceback=tb, traceback_text=["x", "y"]
                    ),
                ],
                status="error",
                count=3,
            ),
        ]
    )
    assert outputs(nb.cells[0]) == [
        out("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}, metadata={"image/png": {"width": 1}}),
        out("execute_result", data={"text/plain": "42", "text/html": "<b>42</b>"}, metadata={}, execution_count=3),
        out("error", ename="ZeroDivisionError", evalue="division by zero", traceback=tb),
    ]
    assert "transient" not in nb.cells[0].outputs[0]
    assert nb.cells[0].metadata["kernelgw"]["status"] == "error"
    nbformat.validate(nb)


def test_update_display_reaches_outputs_in_earlier_cells() -> None:
    nb = build_notebook(
        [
            execution(
                0,
                "h = display('v1', display_id=True)",
                [
                    ev.Display(data={"text/plain": "'v1'"}, display_id="d"),
                    ev.Display(data={"text/plain": "'other'"}, display_id="x"),
                ],
                count=1,
            ),
            execution(1, "h.display('again')", [ev.Display(data={"text/plain": "'again'"}, display_id="d")], count=2),
            execution(
                2,
                "h.update('v2')",
                [
                    ev.UpdateDisplay(data={"text/plain": "'v2'"}, metadata={"m": 1}, display_id="d"),
                ],
                count=3,
            ),
        ]
    )
    assert outputs(nb.cells[0]) == [
        out("display_data", data={"text/plain": "'v2'"}, metadata={"m": 1}),
        out("display_data", data={"text/plain": "'other'"}, metadata={}),
    ]
    assert outputs(nb.cells[1]) == [out("display_data", data={"text/plain": "'v2'"}, metadata={"m": 1})]
    assert outputs(nb.cells[2]) == []  # an update is not an output of its own cell


def test_update_of_an_unknown_display_id_is_ignored() -> None:
    nb = build_notebook([execution(0, "u", [ev.UpdateDisplay(data={"text/plain": "z"}, display_id="nope")])])
    assert outputs(nb.cells[0]) == []


def test_clear_output_now_and_wait() -> None:
    nb = build_notebook(
        [
            execution(
                0,
                "now",
                [
                    ev.Stream(name="stdout", text="1\n"),
                    ev.ClearOutput(wait=False),
                    ev.Stream(name="stdout", text="2\n"),
                ],
            ),
            execution(
                1,
                "wait",
                [
                    ev.Stream(name="stdout", text="frame 1\n"),
                    ev.ClearOutput(wait=True),
                    ev.Display(data={"text/plain": "frame 2"}),
                    ev.ClearOutput(wait=True),
                ],
            ),
            execution(
                2,
                "wait then update",
                [
                    ev.Display(data={"text/plain": "p0"}, display_id="p"),
                    ev.ClearOutput(wait=True),
                    ev.UpdateDisplay(data={"text/plain": "p1"}, display_id="p"),
                ],
            ),
        ]
    )
    assert outputs(nb.cells[0]) == [out("stream", name="stdout", text="2\n")]
    # the last clear(wait=True) has no output after it: the last frame stays
    assert outputs(nb.cells[1]) == [out("display_data", data={"text/plain": "frame 2"}, metadata={})]
    # update_display is not a new output: the pending clear does not run
    assert outputs(nb.cells[2]) == [out("display_data", data={"text/plain": "p1"}, metadata={})]


def test_clear_output_does_not_cross_cells() -> None:
    nb = build_notebook(
        [
            execution(0, "a", [ev.Stream(name="stdout", text="kept\n"), ev.ClearOutput(wait=True)]),
            execution(1, "b", [ev.Stream(name="stdout", text="b\n")]),
        ]
    )
    assert outputs(nb.cells[0]) == [out("stream", name="stdout", text="kept\n")]
    assert outputs(nb.cells[1]) == [out("stream", name="stdout", text="b\n")]


def test_truncation_and_unfinished_executions_leave_a_note_on_stderr() -> None:
    nb = build_notebook(
        [
            execution(
                0,
                "spam",
                [
                    ev.Stream(name="stderr", text="x"),
                    ev.Truncated(limit_bytes=10, message="output exceeded 10 bytes"),
                ],
            ),
            execution(1, "while True: pass", [], status="timeout"),
            execution(2, "boom", [ev.Stream(name="stdout", text="hi\n")], status="dead"),
        ]
    )
    assert outputs(nb.cells[0]) == [out("stream", name="stderr", text="x[kernelgw: output exceeded 10 bytes]\n")]
    assert outputs(nb.cells[1]) == [
        out("stream", name="stderr", text="[kernelgw: execution timeout: timeout happened]\n")
    ]
    assert outputs(nb.cells[2])[1]["text"].startswith("[kernelgw: execution dead")
    assert [c.metadata["kernelgw"]["status"] for c in nb.cells] == ["ok", "timeout", "dead"]
    nbformat.validate(nb)


def followed(
    position: int, late: list[ev.LateOutput], *, status: str, count: int | None = None, reason: str | None = None
) -> ExecutionRecord:
    """A cell a drain (``on_shutdown=keep``) cut off, as the follow path stores it:
    its output, the interim ``done`` its clients were sent, the output the kernel
    sent after it as ``late`` events, and its row as the next gateway completed it
    (`Store.execution_followed`): ``status``, ``count`` and ``reason``."""
    eid = f"e{position}"
    interim = ev.Done(execution_id=eid, status="dead", reason=DETACHED_DONE_REASON, duration_ms=5.0)
    events: list[ev.Event] = [
        ev.Queued(execution_id=eid, code="wait()"),
        ev.Stream(execution_id=eid, name="stdout", text="before the stop\n"),
        interim,
        *(ev.Late(execution_id=eid, event=e) for e in late),
    ]
    return ExecutionRecord(
        session_id="s1",
        position=position,
        execution_id=eid,
        seq=(position + 1) * 100,
        code="wait()",
        status=status,
        execution_count=count,
        started_at=T0,
        duration_ms=900.0,
        reason=reason,
        state_lost=False,
        events_json=ev.json_array(e.model_dump_json() for e in events),
    )


def test_a_followed_cell_shows_its_real_end_and_its_later_output_as_its_own() -> None:
    """The cell's row says how it ended (what the history answers); its stored
    ``done`` was an interim end. The notebook shows the row's end, and what the
    kernel sent after the interim end as the cell's own output (it showed the
    interim ``dead`` with its reason and that output after the late-output note).
    Still followed, or ended while no gateway listened: ``dead`` with the row's
    reason. A cell whose output came after its real end keeps the note."""
    after = ev.Stream(name="stdout", text="after the stop\n")
    error = ev.Error(ename="ValueError", evalue="later", traceback=["tb"], traceback_text=["tb"])
    nb = build_notebook(
        [
            followed(0, [after], status="ok", count=7),
            followed(1, [after, error], status="error", count=8),
            followed(2, [], status="dead", reason=FOLLOW_MISSED),
            followed(3, [after], status="dead", reason=DETACHED_DONE_REASON),  # still followed
            execution(4, "after()", [], count=9),
        ]
    )
    assert [(c.execution_count, c.metadata["kernelgw"]["status"]) for c in nb.cells] == [
        (7, "ok"),
        (8, "error"),
        (None, "dead"),
        (None, "dead"),
        (9, "ok"),
    ]
    assert "reason" not in nb.cells[0].metadata["kernelgw"]
    assert nb.cells[2].metadata["kernelgw"]["reason"] == FOLLOW_MISSED
    assert outputs(nb.cells[0]) == [out("stream", name="stdout", text="before the stop\nafter the stop\n")]
    assert outputs(nb.cells[1]) == [
        out("stream", name="stdout", text="before the stop\nafter the stop\n"),
        out("error", ename="ValueError", evalue="later", traceback=["tb"]),
    ]
    assert outputs(nb.cells[2]) == [
        out("stream", name="stdout", text="before the stop\n"),
        out("stream", name="stderr", text=f"[kernelgw: execution dead: {FOLLOW_MISSED}]\n"),
    ]
    assert outputs(nb.cells[3]) == [
        out("stream", name="stdout", text="before the stop\nafter the stop\n"),
        out("stream", name="stderr", text=f"[kernelgw: execution dead: {DETACHED_DONE_REASON}]\n"),
    ]
    nbformat.validate(nb)
    # a restore runs the cells that ended, not the dead ones
    plan = replay_plan(read_notebook(json.loads(nbformat.writes(nb))))
    assert [s.skip_reason is None for s in plan] == [True, True, False, False, True]
    assert [s.skip_reason is None for s in plan_from_executions([followed(0, [], status="ok", count=7)])] == [True]


def test_output_after_a_real_end_keeps_the_late_note() -> None:
    """Output after the cell's real end (its code forged it) comes after a note;
    a late error makes the cell ``error``, as its row says."""
    record = execution(0, "forged()", [ev.Stream(name="stdout", text="on time\n")], count=3)
    error = ev.Error(execution_id="e0", ename="ValueError", evalue="late", traceback=["tb"], traceback_text=["tb"])
    events = [
        *record.events,
        ev.Late(execution_id="e0", event=ev.Stream(name="stdout", text="late\n")),
        ev.Late(execution_id="e0", event=error),
    ]
    reason = "an error came after this execution had ended"
    stored = ExecutionRecord(
        **{
            **record.__dict__,
            "status": "error",
            "reason": reason,
            "events_json": ev.json_array(e.model_dump_json() for e in events),
        }
    )
    (cell,) = build_notebook([stored]).cells
    assert (cell.execution_count, cell.metadata["kernelgw"]["status"]) == (3, "error")
    assert outputs(cell) == [
        out("stream", name="stdout", text="on time\n"),
        out("stream", name="stderr", text=LATE_NOTE),
        out("stream", name="stdout", text="late\n"),
        out("error", ename="ValueError", evalue="late", traceback=["tb"]),
    ]


def test_notebook_metadata_notes_and_validity() -> None:
    lang = {"name": "python", "version": "3.11.2", "mimetype": "text/x-python", "file_extension": ".py"}
    nb = build_notebook(
        [execution(1, "b = 2", [], seq=200), execution(0, "a = 1", [], seq=100)],
        [
            NoteRecord("s1", after_seq=150, markdown="## between", created_at=T0),
            NoteRecord("s1", after_seq=0, markdown="# first", created_at=T0),
            NoteRecord("s1", after_seq=999, markdown="the end", created_at=T0),
        ],
        language_info=lang,
        session_id="s1",
        image="img:1",
    )
    assert [(c.cell_type, c.source) for c in nb.cells] == [
        ("markdown", "# first"),
        ("code", "a = 1"),
        ("markdown", "## between"),
        ("code", "b = 2"),
        ("markdown", "the end"),
    ]
    assert nb.nbformat == 4
    assert nb.metadata.kernelspec == {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    assert nb.metadata.language_info == lang
    assert nb.metadata.kernelgw == {"session_id": "s1", "image": "img:1"}
    assert nb.cells[1].id == "e0" and len({c.id for c in nb.cells}) == 5
    assert nb.cells[1].metadata.execution["shell.execute_reply.started"] == "2026-01-02T03:04:05Z"
    nbformat.validate(nb)
    # and it survives a write/read round trip unchanged
    again = nbformat.reads(nbformat.writes(nb), as_version=4)
    assert again == nb


def test_empty_history_is_a_valid_notebook() -> None:
    nb = build_notebook([])
    assert nb.cells == [] and nb.metadata.language_info.name == "python"
    nbformat.validate(nb)


# ------------------------------------------------------------------ restore


def test_replay_plan_runs_code_cells_and_skips_unfinished_ones() -> None:
    nb = build_notebook(
        [
            execution(0, "a = 1", []),
            execution(1, "1/0", [], status="error"),
            execution(2, "while True: pass", [], status="timeout"),
            execution(3, "  \n", []),
            execution(4, "x = 1", [], status="interrupted"),
            execution(5, "b = a + 1", []),
        ],
        [NoteRecord("s1", after_seq=0, markdown="# notes are not run", created_at=T0)],
    )
    plan = replay_plan(read_notebook(json.loads(nbformat.writes(nb))))
    assert [(s.index, s.code, s.skip_reason is None) for s in plan] == [
        (1, "a = 1", True),
        (2, "1/0", True),
        (3, "while True: pass", False),
        (4, "  \n", False),
        (5, "x = 1", False),
        (6, "b = a + 1", True),
    ]
    assert "timeout" in (plan[2].skip_reason or "")


def test_replay_plan_of_a_plain_jupyter_notebook_joins_source_lines() -> None:
    nb = {
        "nbformat": 4,
        "nbformat_minor": 4,
        "metadata": {},
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# t"]},
            {
                "cell_type": "code",
                "metadata": {},
                "source": ["x = 1\n", "y = 2"],
                "outputs": [],
                "execution_count": None,
            },
        ],
    }
    assert [(s.index, s.code) for s in replay_plan(read_notebook(nb))] == [(1, "x = 1\ny = 2")]


def test_plan_from_stored_executions() -> None:
    plan = plan_from_executions([execution(0, "a = 1", []), execution(1, "dead", [], status="dead")])
    assert [(s.index, s.skip_reason is None) for s in plan] == [(0, True), (1, False)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"nbformat": 3, "cells": []}, "nbformat v4"),
        ({"cells": []}, "nbformat v4"),
        ({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code"}]}, "cells/0"),
        ({"nbformat": 4, "nbformat_minor": 5, "metadata": {}}, "cells"),
    ],
)
def test_invalid_notebooks_are_refused_with_a_reason(data: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidNotebook, match=message):
        read_notebook(data)


@pytest.mark.parametrize("kernel", ["deno", "ir", "bash", "java", "go", "cpp", "ruby"])
def test_a_notebook_names_its_kernel_and_falls_back_to_the_profile_s_language(kernel: str) -> None:
    """Jupyter opens an export in the kernel it ran in: the kernelspec is the
    session's kernel, and when the kernel reported no language_info the profile's
    stands in (a valid notebook either way)."""
    from kernelgw.kernels import profile

    nb = build_notebook([], language_info={}, session_id="s", kernel=kernel)
    assert nb.metadata.kernelspec.name == kernel
    assert nb.metadata.kernelspec.language == profile(kernel).language
    assert nb.metadata.language_info.name == profile(kernel).language
    assert nb.metadata.language_info.file_extension.startswith(".")
    reported = {"name": "ruby", "version": "3.1.2"}
    assert build_notebook([], language_info=reported, kernel=kernel).metadata.language_info == reported
    nbformat.validate(nb)
