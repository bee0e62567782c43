"""A failed cell's traceback is bounded in the kernel (kernelgw_kernel.launcher):
IPython formats at most the first and last frames of each traceback, and the
text is capped, so a deep recursion ends the cell promptly with its error.

Real ipykernel processes (tests/support/local_backend.py) run the image's
extension; the pure parts are imported from images/python.
"""

from __future__ import annotations

from types import ModuleType

from tests.unit.runtime.conftest import SessionFactory
from tests.unit.runtime.test_session import run, stdout

DEEP = "import sys\nsys.setrecursionlimit(100000)\ndef f(n):\n    return f(n + 1)\nf(0)"
"""About 100,000 frames: IPython took minutes to format them (the cell timed out)."""


def errors(events: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in events if e["type"] == "error"]


async def test_a_deep_recursion_ends_promptly_with_a_shortened_traceback(new_session: SessionFactory) -> None:
    session = await new_session()
    # the cell's own timeout (30 s) is the bound: before the fix it ran into it
    events = await run(session, DEEP, timeout=30)
    done = events[-1]
    assert done["status"] == "error" and done["state_lost"] is False, done
    assert done["reason"] == "RecursionError: maximum recursion depth exceeded"
    (error,) = errors(events)
    assert error["ename"] == "RecursionError" and error["evalue"] == "maximum recursion depth exceeded"
    text = "\n".join(error["traceback_text"])  # type: ignore[arg-type]
    assert "frames omitted from this traceback" in text, text[:2000]
    assert "f(0)" in text and text.rstrip().endswith("RecursionError: maximum recursion depth exceeded")
    assert len(text) < 20_000

    # the exception keeps all its frames, and %debug's sys.last_traceback too
    check = (
        "import sys\n"
        "from kernelgw_kernel.launcher import frame_count\n"
        "print(frame_count(sys.last_traceback) > 99_000, frame_count(sys.last_value.__traceback__) > 99_000)"
    )
    assert stdout(await run(session, check)) == "True True\n"


async def test_a_chain_of_deep_tracebacks_is_shortened_as_a_whole(new_session: SessionFactory) -> None:
    session = await new_session()
    code = (
        "import sys\nsys.setrecursionlimit(100000)\n"
        "def g(n):\n"
        "    try:\n"
        "        return g(n + 1)\n"
        "    except RecursionError as e:\n"
        "        raise ValueError(f'gave up at {n}') from e\n"
        "g(0)"
    )
    events = await run(session, code, timeout=30)
    assert events[-1]["status"] == "error", events[-1]
    (error,) = errors(events)
    assert error["ename"] == "ValueError" and str(error["evalue"]).startswith("gave up at ")
    text = "\n".join(error["traceback_text"])  # type: ignore[arg-type]
    assert "RecursionError" in text and "frames omitted" in text and len(text) < 40_000
    assert stdout(await run(session, "print('next')")) == "next\n"


async def test_a_short_traceback_is_untouched(new_session: SessionFactory) -> None:
    session = await new_session()
    events = await run(session, "def f(n):\n    return 1 / n if n == 0 else f(n - 1)\nf(5)")
    (error,) = errors(events)
    text = "\n".join(error["traceback_text"])  # type: ignore[arg-type]
    assert "omitted" not in text and "ZeroDivisionError: division by zero" in text
    assert text.count("f(n - 1)") >= 1


def test_shorten_keeps_the_first_and_last_frames(launcher: ModuleType) -> None:
    def f(n: int) -> int:
        return f(n + 1) if n < 200 else 1 // 0

    try:
        f(0)
    except ZeroDivisionError as exc:
        tb = exc.__traceback__
    total = launcher.frame_count(tb)
    short, omitted = launcher.shorten(tb)
    assert launcher.frame_count(short) == launcher.MAX_FRAMES and omitted == total - launcher.MAX_FRAMES
    assert short.tb_frame is tb.tb_frame  # the outermost frame first
    last = short
    while last.tb_next is not None:
        last = last.tb_next
    assert last.tb_frame.f_locals["n"] == 200  # the innermost frame last
    assert launcher.frame_count(tb) == total  # the original is untouched


def test_cap_text_bounds_entries_and_the_whole(launcher: ModuleType) -> None:
    big = ["\x1b[31mhead\x1b[39m"] + [f"frame {i} " + "y" * 5000 for i in range(100)] + ["E: " + "x" * (40 << 20)]
    capped = launcher.cap_text(big, omitted=7)
    assert sum(map(len, capped)) < launcher.MAX_TRACEBACK_CHARS + 4 * 1024
    assert capped[0] == big[0] and "7 frames omitted" in capped[1]
    assert any("traceback entries cut" in entry for entry in capped)
    assert capped[-1].startswith("E: xxx") and "characters cut" in capped[-1]
    assert launcher.cap_text(["a", "b"]) == ["a", "b"]
    # a cut never ends inside a colour code
    line = "\x1b[31m" + "z" * (launcher.MAX_ENTRY_CHARS - 3) + "\x1b[39m" * 10
    (cut,) = launcher.cap_text([line])
    assert "\x1b[3\x1b" not in cut and not cut.split("\x1b[0m...")[0].endswith(("\x1b[", "\x1b[3", "\x1b[39"))
