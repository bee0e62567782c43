"""What a model sees of one execution: a compact text plus the rich outputs.

Pure (no I/O, no extra dependencies); shared by the LangChain tool, the MCP
server and the OpenAI / Anthropic tool-call helpers, so every integration
reports an execution the same way.

    obs = observe(session.run(code))
    obs.text        # stdout, stderr, result, error with the last traceback frames, ...
    obs.images      # [ImageOutput(mime_type="image/png", data="<base64>"), ...]
    obs.artifact()  # a JSON-able dict of the rich outputs, for a UI or a LangChain artifact

The text is sized for a model's context: each section (stdout, stderr, a result,
a display) is cut to ``max_section_chars`` and the whole to ``max_chars``, always
head and tail with a note of how much was cut in the middle, because both the
first lines (what started) and the last lines (how it ended) matter. Of a
traceback only the last ``traceback_frames`` frames are kept (where the error
happened), each cut to ``max_frame_chars``.

Layout (sections only when they have something)::

    stdout:
    3.14156
    result:
    3628800
    error: ZeroDivisionError: division by zero
    traceback (last 2 of 3 frames):
    Cell In[4], line 2, in f(x)
    ----> 2     return 1/x
    ...
    displayed: 1 image (image/png), 1 HTML output
    files: created plot.png (20,331 bytes, image/png)
    status: timeout -- the execution exceeded its 5 s timeout ...
    note: the kernel was restarted; variables, imports and files from earlier runs are gone.

An execution that printed and returned nothing reads ``ok (no output)``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kernelgw.client.execution import Execution
from kernelgw.events import Artifact, Display, Done, Error, Result

__all__ = [
    "DEFAULT_MAX_CHARS",
    "DEFAULT_MAX_SECTION_CHARS",
    "DEFAULT_TRACEBACK_FRAMES",
    "ImageOutput",
    "Observation",
    "format_traceback",
    "observe",
    "truncate_middle",
]

DEFAULT_MAX_CHARS = 8000
"""The whole observation text."""
DEFAULT_MAX_SECTION_CHARS = 3000
"""Each of stdout, stderr, a result, a display."""
DEFAULT_TRACEBACK_FRAMES = 3
DEFAULT_MAX_FRAME_CHARS = 800

IMAGE_MIME_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
"""Images a model can be shown (SVG is text, and most model APIs refuse it)."""

_LINE_WINDOW = 200
"""How far a cut may move to land on a line boundary."""


@dataclass(frozen=True)
class ImageOutput:
    """An image the code displayed; ``data`` is base64, as the kernel sent it."""

    mime_type: str
    data: str


@dataclass(frozen=True)
class Observation:
    """One execution as a model sees it (`text`) plus its rich outputs."""

    text: str
    status: str | None
    """``ok``, ``error``, ``timeout``, ``interrupted`` or ``dead``."""
    execution_count: int | None = None
    images: list[ImageOutput] = field(default_factory=list)
    html: list[str] = field(default_factory=list)
    """``text/html`` of results and displays, e.g. DataFrame tables."""
    files: list[Artifact] = field(default_factory=list)
    """Workspace files the execution created or changed."""
    error_name: str | None = None
    """The exception's class name when the code raised."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def is_error(self) -> bool:
        """True when the code raised, timed out, was interrupted or its kernel died."""
        return self.status != "ok"

    def artifact(self, **extra: Any) -> dict[str, Any]:
        """The rich outputs as a JSON-able dict (``extra`` keys are added)."""
        return {
            "status": self.status,
            "execution_count": self.execution_count,
            "images": [{"mime_type": i.mime_type, "data": i.data} for i in self.images],
            "html": list(self.html),
            "files": [f.model_dump() for f in self.files],
            **extra,
        }


# ---------------------------------------------------------------- truncation


def truncate_middle(text: str, limit: int, *, what: str = "characters") -> str:
    """``text`` cut to about ``limit`` characters: head and tail, and in the middle
    a note of how much was cut. Cuts land on line boundaries when one is near."""
    if limit <= 0 or len(text) <= limit:
        return text
    # The note takes room too; budget the kept text so the result stays near ``limit``.
    keep = max(limit - 60, 2)
    head_end = keep // 2
    tail_start = len(text) - (keep - head_end)
    newline = text.rfind("\n", max(head_end - _LINE_WINDOW, 0), head_end)
    if newline > 0:
        head_end = newline + 1
    newline = text.find("\n", tail_start, tail_start + _LINE_WINDOW)
    if newline != -1 and newline + 1 < len(text):
        tail_start = newline + 1
    cut = tail_start - head_end
    head, tail = text[:head_end], text[tail_start:]
    sep_before = "" if head.endswith("\n") or not head else "\n"
    lines_cut = text.count("\n", head_end, tail_start)
    lines = f", {lines_cut:,} lines" if lines_cut > 1 else ""
    return f"{head}{sep_before}[... {cut:,} {what}{lines} cut ...]\n{tail}"


# ----------------------------------------------------------------- tracebacks

_SEPARATOR = re.compile(r"^-{20,}$")
_HEADER = re.compile(r"Traceback \(most recent call last\)\s*$")
_CELL_FRAME = ("Cell In[", "Input In [", "File <ipython-input")
"""How IPython names a frame in a cell's code (8.x, 7.x, older)."""


def format_traceback(
    error: Error,
    *,
    frames: int = DEFAULT_TRACEBACK_FRAMES,
    max_frame_chars: int = DEFAULT_MAX_FRAME_CHARS,
) -> str:
    """The last ``frames`` frames of an IPython traceback, without ANSI colours.

    IPython sends a separator, a header line, one entry per frame and the final
    ``ename: evalue`` line; a SyntaxError is a single entry that shows the
    offending line. Anything else is kept whole (then cut to size).
    """
    lines = [line.rstrip("\n") for line in error.traceback_text]
    headers = [i for i, line in enumerate(lines) if _HEADER.search(line)]
    if headers:  # a chained exception repeats the layout: keep the final exception's part
        body = lines[headers[-1] + 1 :]
    else:
        body = lines[1:] if lines and _SEPARATOR.match(lines[0].strip()) else list(lines)
    final = f"{error.ename}: {error.evalue}".rstrip()
    if body and (body[-1].strip() == final or body[-1].startswith(f"{error.ename}:") or body[-1] == error.ename):
        body = body[:-1]
    body = [b for b in body if b.strip()]
    if not body:
        return ""
    total = len(body)
    if len(lines) == 1:  # SyntaxError and the like: one entry, no frames
        return truncate_middle(body[0], max_frame_chars)
    kept = body[-frames:] if frames > 0 else []
    parts = [truncate_middle(b, max_frame_chars) for b in kept]
    # The line of the model's own code matters most: keep the last frame in a cell
    # even when the error was raised deep inside a library.
    cells = [i for i, b in enumerate(body) if b.startswith(_CELL_FRAME)]
    if parts and cells and cells[-1] < total - len(parts):
        skipped = total - len(parts) - cells[-1] - 1
        gap = [f"[... {_plural(skipped, 'frame')} ...]"] if skipped else []
        parts = [truncate_middle(body[cells[-1]], max_frame_chars), *gap, *parts]
    chained = len(headers) - 1
    notes = []
    if total > len(kept):
        notes.append(f"last {len(kept)} of {total} frames" + (", and the cell's" if len(parts) > len(kept) else ""))
    if chained > 0:
        notes.append(f"{_plural(chained, 'chained exception')} before it not shown")
    if not parts:
        return f"traceback: {total} frames omitted"
    title = f"traceback ({'; '.join(notes)}):" if notes else "traceback:"
    return title + "\n" + "\n".join(parts)


# ---------------------------------------------------------------- observation


def _plain(data: Mapping[str, Any]) -> str | None:
    value = data.get("text/plain")
    if value is None:
        return None
    return value if isinstance(value, str) else "".join(value)


def _image(data: Mapping[str, Any]) -> ImageOutput | None:
    for mime in IMAGE_MIME_TYPES:
        value = data.get(mime)
        if isinstance(value, str) and value:
            return ImageOutput(mime, value.strip())
    return None


def _html(data: Mapping[str, Any]) -> str | None:
    value = data.get("text/html")
    if value is None:
        return None
    return value if isinstance(value, str) else "".join(value)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _describe_files(files: Iterable[Artifact]) -> str:
    return "; ".join(f"{f.change} {f.path} ({f.size:,} bytes, {f.mime_type})" for f in files)


def observe(
    execution: Execution,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_section_chars: int = DEFAULT_MAX_SECTION_CHARS,
    traceback_frames: int = DEFAULT_TRACEBACK_FRAMES,
    max_frame_chars: int = DEFAULT_MAX_FRAME_CHARS,
) -> Observation:
    """The `Observation` of an execution: compact text plus images, HTML and files."""
    sections: list[str] = []

    def section(title: str, text: str) -> None:
        text = text.rstrip("\n")
        if text.strip():
            sections.append(f"{title}:\n{truncate_middle(text, max_section_chars)}")

    section("stdout", execution.stdout)
    section("stderr", execution.stderr)

    images: list[ImageOutput] = []
    html: list[str] = []
    shown: list[str] = []  # what the displays were, for the summary line
    other_kinds: dict[str, int] = {}
    for output in execution.outputs:
        if not isinstance(output, (Display, Result)):
            continue
        image = _image(output.data)
        table = _html(output.data)
        if image is not None:
            images.append(image)
            shown.append(image.mime_type)
        elif table is not None:
            html.append(table)
        if isinstance(output, Result):
            if image is None and (text := _plain(output.data)) is not None:
                section("result", text)
        elif image is None:
            text = _plain(output.data)
            if text is not None:
                section("display", text)
            elif table is None:
                kind = next(iter(output.data), "empty")
                other_kinds[kind] = other_kinds.get(kind, 0) + 1

    error = execution.error
    if error is not None:
        sections.append(f"error: {error.ename}: {error.evalue}".rstrip().rstrip(":"))
        traceback = format_traceback(error, frames=traceback_frames, max_frame_chars=max_frame_chars)
        if traceback:
            sections.append(traceback)

    summary: list[str] = []
    if images:
        counts: dict[str, int] = {}
        for mime in shown:
            counts[mime] = counts.get(mime, 0) + 1
        summary.append(", ".join(f"{_plural(n, 'image')} ({mime})" for mime, n in counts.items()))
    if html:
        summary.append(_plural(len(html), "HTML output"))
    summary.extend(f"{_plural(n, 'output')} of type {kind}" for kind, n in other_kinds.items())
    if summary:
        sections.append("displayed: " + ", ".join(summary))

    done = next((e for e in reversed(execution.events) if isinstance(e, Done)), None)
    files = list(done.artifacts) if done is not None else []
    if files:
        sections.append("files: " + truncate_middle(_describe_files(files), max_section_chars))
    if execution.truncated:
        sections.append("note: output past the gateway's limit was dropped; the code kept running.")
    status = execution.status
    if status not in ("ok", "error"):
        reason = f" -- {execution.reason}" if execution.reason else ""
        sections.append(f"status: {status or 'unfinished'}{reason}")
    if execution.state_lost:
        sections.append("note: the kernel was restarted; variables, imports and files from earlier runs are gone.")

    text = "\n".join(sections) if sections else ("ok (no output)" if status == "ok" else f"status: {status}")
    return Observation(
        text=truncate_middle(text, max_chars),
        status=status,
        execution_count=execution.execution_count,
        images=images,
        html=html,
        files=files,
        error_name=error.ename if error is not None else None,
    )
