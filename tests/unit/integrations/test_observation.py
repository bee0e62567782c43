"""The observation a model sees of an execution (pure: events in, text out)."""

from __future__ import annotations

import base64
from typing import Any

from kernelgw.client.execution import Execution
from kernelgw.events import Error
from kernelgw.integrations.observation import format_traceback, observe, truncate_middle

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()

# What the kernel sent for a ZeroDivisionError two calls deep (traceback_text, no ANSI).
NESTED_TRACEBACK = [
    "---------------------------------------------------------------------------",
    "ZeroDivisionError                         Traceback (most recent call last)",
    "Cell In[1], line 5\n      1 def f(x):\n      2     return g(x)\n      3 def g(x):\n"
    "      4     return 1/x\n----> 5 f(0)\n",
    "Cell In[1], line 2, in f(x)\n      1 def f(x):\n----> 2     return g(x)\n",
    "Cell In[1], line 4, in g(x)\n      3 def g(x):\n----> 4     return 1/x\n",
    "ZeroDivisionError: division by zero",
]
SYNTAX_TRACEBACK = ["  Cell In[2], line 1\n    x = (\n         ^\nSyntaxError: incomplete input\n"]


def done(status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"type": "done", "status": status, "duration_ms": 3.0, "execution_count": 1, **extra}


def stdout(text: str) -> dict[str, Any]:
    return {"type": "stream", "name": "stdout", "text": text}


def error(ename: str, evalue: str, lines: list[str]) -> dict[str, Any]:
    return {"type": "error", "ename": ename, "evalue": evalue, "traceback": lines, "traceback_text": lines}


def test_stdout_and_result() -> None:
    obs = observe(
        Execution(
            [
                stdout("hello\n"),
                {"type": "result", "execution_count": 1, "data": {"text/plain": "3628800"}},
                done(),
            ]
        )
    )
    assert obs.text == "stdout:\nhello\nresult:\n3628800"
    assert obs.ok and not obs.is_error and obs.execution_count == 1
    assert obs.images == [] and obs.html == [] and obs.files == []


def test_no_output() -> None:
    assert observe(Execution([done()])).text == "ok (no output)"


def test_stderr_is_its_own_section() -> None:
    obs = observe(Execution([stdout("a\n"), {"type": "stream", "name": "stderr", "text": "warn\n"}, done()]))
    assert obs.text == "stdout:\na\nstderr:\nwarn"


def test_error_keeps_the_last_frames() -> None:
    obs = observe(
        Execution([error("ZeroDivisionError", "division by zero", NESTED_TRACEBACK), done("error")]),
        traceback_frames=2,
    )
    assert obs.is_error and obs.status == "error" and obs.error_name == "ZeroDivisionError"
    assert obs.text == (
        "error: ZeroDivisionError: division by zero\n"
        "traceback (last 2 of 3 frames):\n"
        "Cell In[1], line 2, in f(x)\n      1 def f(x):\n----> 2     return g(x)\n"
        "Cell In[1], line 4, in g(x)\n      3 def g(x):\n----> 4     return 1/x"
    )


def test_syntax_error_shows_the_line() -> None:
    obs = observe(
        Execution([error("SyntaxError", "incomplete input (2551227035.py, line 1)", SYNTAX_TRACEBACK), done("error")])
    )
    assert obs.text.startswith("error: SyntaxError: incomplete input")
    assert "    x = (\n         ^" in obs.text


def test_traceback_with_no_frames_wanted() -> None:
    err = Error.model_validate(error("ZeroDivisionError", "division by zero", NESTED_TRACEBACK))
    assert format_traceback(err, frames=0) == "traceback: 3 frames omitted"
    assert format_traceback(Error.model_validate(error("KeyboardInterrupt", "", []))) == ""


def test_error_without_message() -> None:
    lines = [
        "-" * 75,
        "KeyboardInterrupt                         Traceback (most recent call last)",
        "Cell In[3], line 1\n----> 1 while True: pass\n",
        "KeyboardInterrupt: ",
    ]
    obs = observe(
        Execution([error("KeyboardInterrupt", "", lines), done("interrupted", reason="interrupted by a client")])
    )
    assert obs.text == (
        "error: KeyboardInterrupt\ntraceback:\nCell In[3], line 1\n----> 1 while True: pass\n"
        "status: interrupted -- interrupted by a client"
    )


def test_images_html_and_files() -> None:
    obs = observe(
        Execution(
            [
                {
                    "type": "display",
                    "data": {"text/plain": "<Figure size 640x480 with 1 Axes>", "image/png": PNG + "\n"},
                },
                {
                    "type": "result",
                    "execution_count": 1,
                    "data": {"text/plain": "   x\n0  1", "text/html": "<table><tr><td>1</td></tr></table>"},
                },
                done(
                    artifacts=[
                        {"path": "plot.png", "size": 20331, "mime_type": "image/png", "change": "created"},
                        {"path": "data.csv", "size": 12, "mime_type": "text/csv", "change": "modified"},
                    ]
                ),
            ]
        )
    )
    assert obs.text == (
        "result:\n   x\n0  1\n"
        "displayed: 1 image (image/png), 1 HTML output\n"
        "files: created plot.png (20,331 bytes, image/png); modified data.csv (12 bytes, text/csv)"
    )
    assert [(i.mime_type, i.data) for i in obs.images] == [("image/png", PNG)]
    assert obs.html == ["<table><tr><td>1</td></tr></table>"]
    artifact = obs.artifact(session_id="s1")
    assert artifact == {
        "status": "ok",
        "execution_count": 1,
        "images": [{"mime_type": "image/png", "data": PNG}],
        "html": ["<table><tr><td>1</td></tr></table>"],
        "files": [
            {"path": "plot.png", "size": 20331, "mime_type": "image/png", "change": "created"},
            {"path": "data.csv", "size": 12, "mime_type": "text/csv", "change": "modified"},
        ],
        "session_id": "s1",
    }


def test_updated_and_cleared_displays_count_as_shown() -> None:
    obs = observe(
        Execution(
            [
                {"type": "display", "data": {"text/plain": "step 1"}, "display_id": "p"},
                {"type": "update_display", "data": {"text/plain": "step 9"}, "display_id": "p"},
                {"type": "display", "data": {"image/jpeg": "abcd"}},
                {"type": "clear_output", "wait": False},
                {"type": "display", "data": {"application/json": {"a": 1}}},
                done(),
            ]
        )
    )
    # only what is still shown: the cleared JPEG is gone, the JSON output is described
    assert obs.text == "displayed: 1 output of type application/json"
    obs = observe(
        Execution(
            [
                {"type": "display", "data": {"text/plain": "step 1"}, "display_id": "p"},
                {"type": "update_display", "data": {"text/plain": "step 9"}, "display_id": "p"},
                done(),
            ]
        )
    )
    assert obs.text == "display:\nstep 9"


def test_timeout_restart_and_dropped_output() -> None:
    obs = observe(
        Execution(
            [
                stdout("working\n"),
                {"type": "truncated", "limit_bytes": 1000, "message": "output limit reached"},
                done(
                    "timeout",
                    reason="the execution exceeded its 5 s timeout; the kernel was restarted",
                    state_lost=True,
                ),
            ]
        )
    )
    assert obs.is_error and obs.status == "timeout"
    assert obs.text == (
        "stdout:\nworking\n"
        "note: output past the gateway's limit was dropped; the code kept running.\n"
        "status: timeout -- the execution exceeded its 5 s timeout; the kernel was restarted\n"
        "note: the kernel was restarted; variables, imports and files from earlier runs are gone."
    )


def test_long_output_is_cut_head_and_tail_with_a_note() -> None:
    lines = "".join(f"line {i}\n" for i in range(10_000))
    obs = observe(Execution([stdout(lines), done()]), max_section_chars=500)
    assert obs.text.startswith("stdout:\nline 0\nline 1\n")
    assert obs.text.endswith("line 9998\nline 9999")
    assert len(obs.text) < 700
    note = [line for line in obs.text.splitlines() if line.startswith("[...")]
    assert len(note) == 1 and note[0].endswith("cut ...]")
    cut = int(note[0].split()[1].replace(",", ""))
    kept = len(obs.text) - len("stdout:\n") - len(note[0]) - 1
    assert cut + kept == len(lines.rstrip("\n"))  # nothing lost silently


def test_whole_text_is_capped_too() -> None:
    events = [stdout("a" * 3000 + "\n"), {"type": "stream", "name": "stderr", "text": "b" * 3000}, done()]
    obs = observe(Execution(events), max_section_chars=10_000, max_chars=1000)
    assert len(obs.text) <= 1000
    assert obs.text.startswith("stdout:\naaaa") and obs.text.endswith("bbbb")
    assert "characters" in obs.text and "cut ...]" in obs.text


def test_truncate_middle() -> None:
    assert truncate_middle("short", 100) == "short"
    assert truncate_middle("x" * 50, 0) == "x" * 50  # no limit
    cut = truncate_middle("x" * 1000, 200)
    assert cut.startswith("x" * 70) and cut.endswith("x" * 70)
    assert "[... 860 characters cut ...]" in cut
    lined = truncate_middle("".join(f"{i:04d}\n" for i in range(400)), 300)
    kept = lined.splitlines()
    notes = [line for line in kept if not line.isdigit()]
    assert len(notes) == 1 and notes[0].endswith("lines cut ...]")  # cuts land on line boundaries
    assert kept[0] == "0000" and kept[-1] == "0399"


def test_chained_exception_shows_the_final_one() -> None:
    # pandas' KeyError for a missing column, as the kernel sent it (abridged frames)
    lines = [
        "-" * 75,
        "KeyError                                  Traceback (most recent call last)",
        "File .../pandas/core/indexes/base.py:3816, in Index.get_loc(self, key)\n-> 3816     return self._engine.get_loc(casted_key)\n",
        "File pandas/_libs/index.pyx:172, in pandas._libs.index.IndexEngine.get_loc()\n",
        "KeyError: 'b'",
        "\nThe above exception was the direct cause of the following exception:\n",
        "KeyError                                  Traceback (most recent call last)",
        "Cell In[1], line 3\n      2 df = pd.DataFrame({'a': [1]})\n----> 3 df['b']\n",
        "File .../pandas/core/frame.py:4330, in DataFrame.__getitem__(self, key)\n-> 4330 indexer = self.columns.get_loc(key)\n",
        "File .../pandas/core/indexes/base.py:3823, in Index.get_loc(self, key)\n-> 3823     raise KeyError(key) from err\n",
        "KeyError: 'b'",
    ]
    obs = observe(Execution([error("KeyError", "'b'", lines), done("error")]), traceback_frames=2)
    assert obs.text.splitlines()[:4] == [
        "error: KeyError: 'b'",
        "traceback (last 2 of 3 frames, and the cell's; 1 chained exception before it not shown):",
        "Cell In[1], line 3",
        "      2 df = pd.DataFrame({'a': [1]})",
    ]
    assert "File .../pandas/core/frame.py:4330" in obs.text
    assert obs.text.endswith("raise KeyError(key) from err")
    assert "index.pyx" not in obs.text  # the chained exception's frames


def test_the_cells_frame_is_kept_when_the_error_is_deep_in_a_library() -> None:
    lines = [
        "-" * 75,
        "KeyError                                  Traceback (most recent call last)",
        "Cell In[7], line 1\n----> 1 orders.groupby('regoin')\n",
    ]
    lines += [f"File .../pandas/core/groupby/lib{i}.py:{i}, in f{i}()\n" for i in range(5)]
    lines += ["KeyError: 'regoin'"]
    text = observe(Execution([error("KeyError", "'regoin'", lines), done("error")])).text
    assert text == (
        "error: KeyError: 'regoin'\n"
        "traceback (last 3 of 6 frames, and the cell's):\n"
        "Cell In[7], line 1\n----> 1 orders.groupby('regoin')\n"
        "[... 2 frames ...]\n"
        "File .../pandas/core/groupby/lib2.py:2, in f2()\n"
        "File .../pandas/core/groupby/lib3.py:3, in f3()\n"
        "File .../pandas/core/groupby/lib4.py:4, in f4()"
    )
