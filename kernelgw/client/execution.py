"""`Execution`: the outcome of running one cell, built from its wire events.

Pure: no I/O. The REST answer of ``POST /execute`` becomes an `Execution` with
`Execution.from_response`; a live WebSocket stream builds one event at a time
through `ExecutionBuilder.add`.

Two views of the same events:

* the **log** -- everything the cell emitted, in order, never cleared:
  `Execution.stdout`, `Execution.stderr`, `Execution.results`, `Execution.text`,
  `Execution.error`, `Execution.events`;
* the **display** -- what a notebook frontend would show once the cell is done:
  `Execution.outputs`, `Execution.displays`, `Execution.images`, and the
  structured data beside them, `Execution.charts` (a figure's chart) and
  `Execution.data` (a DataFrame's columns). Here
  ``update_display`` replaces the data of every earlier display with the same
  ``display_id``, ``clear_output(wait=False)`` empties what was shown so far and
  ``clear_output(wait=True)`` does so right before the next output arrives
  (which is how animations and progress bars end up showing their last frame).
"""

from __future__ import annotations

import base64
import binascii
import html
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NotRequired, TypedDict, cast

from kernelgw.errors import KernelGWError
from kernelgw.events import (
    CHART_MIME,
    DATA_MIME,
    EVENT_LIST_ADAPTER,
    ClearOutput,
    Display,
    Done,
    DoneStatus,
    Error,
    Event,
    Queued,
    Result,
    Stream,
    Truncated,
    UpdateDisplay,
    parse_event,
)

__all__ = [
    "BarElement",
    "BoxElement",
    "Chart",
    "ChartType",
    "Execution",
    "ExecutionBuilder",
    "ExecutionError",
    "Output",
    "PieElement",
    "PointSeries",
    "TableData",
]

Output = Stream | Display | Result | Error
"""One output as a notebook shows it (nbformat: stream, display_data,
execute_result, error)."""

ChartType = Literal["line", "scatter", "bar", "pie", "box_and_whisker", "superchart", "unknown"]


class PointSeries(TypedDict):
    """One line or scatter series: ``points`` are ``[x, y]`` pairs (a number, an
    ISO 8601 string on a date axis, a label on a categorical one)."""

    label: str
    points: list[list[float | str]]


class BarElement(TypedDict):
    label: str
    group: str
    """The bar's container (its ``label=``, else ``Group N``)."""
    value: float


class PieElement(TypedDict):
    label: str
    angle: float
    """The wedge's angle in degrees."""
    radius: float


class BoxElement(TypedDict):
    label: str
    min: float
    first_quartile: float
    median: float
    third_quartile: float
    max: float
    outliers: list[float]


class Chart(TypedDict):
    """A figure's structured chart (the ``application/vnd.kernelgw.chart+json``
    MIME type; E2B's chart): what the picture shows, for a model or a UI to use.

    ``elements`` by ``type``: `PointSeries` (line, scatter), `BarElement` (bar),
    `PieElement` (pie), `BoxElement` (box_and_whisker), one `Chart` per axes
    (superchart, a figure of several axes; its title is the figure's), nothing
    for unknown. Labels, units and scales are absent or None where the figure
    has none; a unit is what an axis label holds in ``(...)`` or ``[...]``."""

    type: ChartType
    title: str | None
    elements: list[Any]
    x_label: NotRequired[str | None]
    y_label: NotRequired[str | None]
    x_unit: NotRequired[str | None]
    y_unit: NotRequired[str | None]
    x_scale: NotRequired[str]
    """line and scatter: linear, datetime, categorical, log, ..."""
    y_scale: NotRequired[str]
    x_ticks: NotRequired[list[float | str]]
    x_tick_labels: NotRequired[list[str]]
    y_ticks: NotRequired[list[float | str]]
    y_tick_labels: NotRequired[list[str]]


TableData = dict[str, list[Any]]
"""A table's columns as lists of JSON values, by column name (the
``application/vnd.kernelgw.data+json`` MIME type; E2B's data): the DataFrame's
``to_dict(orient="list")``, without its index; missing values are None and
timestamps ISO 8601 strings."""

_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/svg+xml")


class ExecutionError(KernelGWError):
    """The code raised, timed out, was interrupted, or its kernel died.

    Raised by `Execution.raise_for_error`. ``ename``/``evalue``/``traceback`` come
    from the kernel's error event when there is one (``traceback`` is the list of
    lines without ANSI colour codes); a timeout or a dead kernel may have none,
    in which case they are ``None``/``""``/``[]`` and ``reason`` explains.
    """

    code = "execution_error"

    def __init__(
        self,
        ename: str | None,
        evalue: str,
        traceback: list[str],
        *,
        status: DoneStatus | None = "error",
        reason: str | None = None,
        execution_id: str | None = None,
    ) -> None:
        if ename is not None:
            message = f"{ename}: {evalue}" if evalue else ename
        else:
            message = f"execution {status}"
        if reason and status != "error":
            message = f"{message} ({reason})"
        super().__init__(message)
        self.ename = ename
        self.evalue = evalue
        self.traceback = traceback
        self.status = status
        self.reason = reason
        self.execution_id = execution_id

    @property
    def traceback_text(self) -> str:
        """The kernel's traceback as one plain-text string."""
        return "\n".join(self.traceback)


def _decode_b64(value: Any) -> bytes | None:
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value)
    except (binascii.Error, ValueError):
        return None


class ExecutionBuilder:
    """Folds events into an `Execution`, one at a time (for live streams).

    >>> builder = ExecutionBuilder()
    >>> for event in session.stream(code):   # doctest: +SKIP
    ...     builder.add(event)
    >>> execution = builder.build()          # doctest: +SKIP

    Events of other executions are ignored once the execution id is known
    (given here, or taken from the first event that carries one).
    """

    def __init__(self, execution_id: str | None = None) -> None:
        self.execution_id = execution_id
        self.done: Done | None = None
        self._events: list[Event] = []
        self._outputs: list[Output] = []
        self._clear_on_next_output = False

    @property
    def finished(self) -> bool:
        """True once the ``done`` event arrived."""
        return self.done is not None

    def add(self, event: Event | Mapping[str, Any] | str | bytes) -> Event:
        """Add one event (a model, a decoded dict or JSON text); return it parsed."""
        if isinstance(event, Mapping):
            event = parse_event(dict(event))
        elif isinstance(event, (str, bytes)):
            event = parse_event(event)
        if event.execution_id is not None:
            if self.execution_id is None:
                self.execution_id = event.execution_id
            elif event.execution_id != self.execution_id:
                return event
        self._events.append(event)

        if isinstance(event, ClearOutput):
            if event.wait:
                self._clear_on_next_output = True
            else:
                self._outputs.clear()
                self._clear_on_next_output = False
        elif isinstance(event, UpdateDisplay):
            # Like a frontend: updates what is shown, and is not itself a new
            # output, so it does not trigger a pending clear_output(wait=True).
            self._outputs = [
                o.model_copy(update={"data": event.data, "metadata": event.metadata})
                if isinstance(o, Display) and o.display_id == event.display_id
                else o
                for o in self._outputs
            ]
        elif isinstance(event, (Stream, Display, Result, Error)):
            if self._clear_on_next_output:
                self._outputs.clear()
                self._clear_on_next_output = False
            last = self._outputs[-1] if self._outputs else None
            if isinstance(event, Stream) and isinstance(last, Stream) and last.name == event.name:
                # Consecutive stream chunks show as one output, as in nbformat.
                self._outputs[-1] = last.model_copy(update={"text": last.text + event.text})
            else:
                self._outputs.append(event)
        elif isinstance(event, Done):
            self.done = event
        return event

    def build(self) -> Execution:
        """A snapshot of what arrived so far (complete once `finished`)."""
        return Execution._from_parts(tuple(self._events), tuple(self._outputs), self.done, self.execution_id)


class Execution:
    """What running one cell produced: output, result, error and final status.

    Build one from events with ``Execution(events)``, from the REST answer with
    `Execution.from_response`, or incrementally with `ExecutionBuilder`. In a
    notebook an Execution displays itself (text, images and traceback; HTML from
    the sandbox is deliberately not passed through, since it could run script in
    your notebook).
    """

    __slots__ = ("_done", "_events", "_execution_id", "_outputs")

    def __init__(
        self,
        events: Iterable[Event | Mapping[str, Any]],
        *,
        execution_id: str | None = None,
    ) -> None:
        builder = ExecutionBuilder(execution_id)
        for event in events:
            builder.add(event)
        self._events = tuple(builder._events)
        self._outputs = tuple(builder._outputs)
        self._done = builder.done
        self._execution_id = builder.execution_id

    @classmethod
    def _from_parts(
        cls,
        events: tuple[Event, ...],
        outputs: tuple[Output, ...],
        done: Done | None,
        execution_id: str | None,
    ) -> Execution:
        self = cls.__new__(cls)
        self._events, self._outputs = events, outputs
        self._done, self._execution_id = done, execution_id
        return self

    @classmethod
    def from_response(cls, data: Mapping[str, Any]) -> Execution:
        """From the JSON answer of ``POST /v1/sessions/{id}/execute``."""
        events = EVENT_LIST_ADAPTER.validate_python(data.get("events", []))
        if not any(isinstance(e, Done) for e in events) and "status" in data:
            # The answer always ends with `done`; rebuild it if a gateway did not.
            events.append(
                Done(
                    execution_id=data.get("execution_id"),
                    status=data["status"],
                    execution_count=data.get("execution_count"),
                    duration_ms=data.get("duration_ms") or 0.0,
                    reason=data.get("reason"),
                    state_lost=bool(data.get("state_lost", False)),
                )
            )
        return cls(events, execution_id=data.get("execution_id"))

    # ------------------------------------------------------------ the outcome

    @property
    def execution_id(self) -> str | None:
        return self._execution_id

    @property
    def events(self) -> tuple[Event, ...]:
        """Every event of this execution, in order, ending with ``done``."""
        return self._events

    @property
    def finished(self) -> bool:
        """True when the ``done`` event is in (always, except for a partial build)."""
        return self._done is not None

    @property
    def status(self) -> DoneStatus | None:
        """``ok``, ``error``, ``timeout``, ``interrupted`` or ``dead``; None until done."""
        return self._done.status if self._done is not None else None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def execution_count(self) -> int | None:
        if self._done is not None and self._done.execution_count is not None:
            return self._done.execution_count
        for event in reversed(self._events):
            if isinstance(event, Result) and event.execution_count is not None:
                return event.execution_count
        return None

    @property
    def duration_ms(self) -> float | None:
        return self._done.duration_ms if self._done is not None else None

    @property
    def reason(self) -> str | None:
        """Why the status is not ``ok``, in words (from the ``done`` event)."""
        return self._done.reason if self._done is not None else None

    @property
    def state_lost(self) -> bool:
        """True when the kernel was restarted, so earlier variables are gone."""
        return self._done.state_lost if self._done is not None else False

    @property
    def code(self) -> str | None:
        """The code that ran, when the ``queued`` event is among the events."""
        for event in self._events:
            if isinstance(event, Queued):
                return event.code
        return None

    @property
    def truncated(self) -> bool:
        """True when output past the gateway's cap was dropped."""
        return any(isinstance(e, Truncated) for e in self._events)

    # ------------------------------------------------------------------ the log

    def _stream_text(self, name: str) -> str:
        return "".join(e.text for e in self._events if isinstance(e, Stream) and e.name == name)

    @property
    def stdout(self) -> str:
        """Everything printed to stdout, concatenated (clear_output does not apply)."""
        return self._stream_text("stdout")

    @property
    def stderr(self) -> str:
        return self._stream_text("stderr")

    @property
    def results(self) -> list[Result]:
        """The ``result`` events (the value of the cell's last expression)."""
        return [e for e in self._events if isinstance(e, Result)]

    @property
    def text(self) -> str | None:
        """``text/plain`` of the result, e.g. ``"42"``; None when there is none."""
        for result in reversed(self.results):
            value = result.data.get("text/plain")
            if value is not None:
                return value if isinstance(value, str) else "".join(value)
        return None

    @property
    def error(self) -> Error | None:
        """The exception the code raised, if any."""
        for event in reversed(self._events):
            if isinstance(event, Error):
                return event
        return None

    def raise_for_error(self) -> Execution:
        """Raise `ExecutionError` unless the execution succeeded; return self."""
        error = self.error
        if error is None and self.status in (None, "ok"):
            return self
        raise ExecutionError(
            error.ename if error else None,
            error.evalue if error else "",
            list(error.traceback_text) if error else [],
            status=self.status,
            reason=self.reason,
            execution_id=self.execution_id,
        )

    # -------------------------------------------------------------- the display

    @property
    def outputs(self) -> list[Output]:
        """What a notebook would show: update_display and clear_output applied,
        consecutive stream chunks of the same name merged."""
        return list(self._outputs)

    @property
    def displays(self) -> list[Display]:
        """Displays still shown, each with its latest ``update_display`` data."""
        return [o for o in self._outputs if isinstance(o, Display)]

    @property
    def images(self) -> list[bytes]:
        """Decoded ``image/png`` of the displays and results shown, in order."""
        images = []
        for output in self._outputs:
            if isinstance(output, (Display, Result)):
                png = _decode_b64(output.data.get("image/png"))
                if png is not None:
                    images.append(png)
        return images

    def _shown(self, mime: str) -> list[dict[str, Any]]:
        return [
            output.data[mime]
            for output in self._outputs
            if isinstance(output, (Display, Result)) and isinstance(output.data.get(mime), dict)
        ]

    @property
    def charts(self) -> list[Chart]:
        """The structured charts of the figures shown, in order (`Chart`): the
        Python kernel adds one to each matplotlib figure with data (not to a
        blank one, nor past 10,000 points); other kernels send none.

        ```pycon
        >>> execution.charts[0]["type"], execution.charts[0]["title"]  # doctest: +SKIP
        ('line', 'Growth')
        ```
        """
        return cast(list[Chart], self._shown(CHART_MIME))

    @property
    def data(self) -> list[TableData]:
        """The data of the tables shown (each DataFrame displayed or left as the
        cell's value), in order, as columns of values (`TableData`); a DataFrame of
        more than 10,000 cells has none (its text and HTML are still shown).

        ```pycon
        >>> execution.data[0]["price"]  # doctest: +SKIP
        [9.5, 12.0, None]
        ```
        """
        return cast(list[TableData], self._shown(DATA_MIME))

    # ------------------------------------------------------ notebook / repr

    def __repr__(self) -> str:
        parts = [f"execution_id={self.execution_id!r}", f"status={self.status!r}"]
        if self.text is not None:
            text = self.text if len(self.text) <= 40 else self.text[:37] + "..."
            parts.append(f"text={text!r}")
        if self.error is not None:
            parts.append(f"error={self.error.ename!r}")
        if self.stdout:
            parts.append(f"stdout={len(self.stdout)} chars")
        if self.images:
            parts.append(f"images={len(self.images)}")
        if self.charts:
            parts.append(f"charts={len(self.charts)}")
        if self.data:
            parts.append(f"data={len(self.data)}")
        return f"Execution({', '.join(parts)})"

    def _repr_png_(self) -> bytes | None:
        images = self.images
        return images[0] if images else None

    def _repr_html_(self) -> str:
        chunks = []
        for output in self._outputs:
            if isinstance(output, Stream):
                style = ' style="background:#fdd"' if output.name == "stderr" else ""
                chunks.append(f"<pre{style}>{html.escape(output.text)}</pre>")
            elif isinstance(output, Error):
                tb = "\n".join(output.traceback_text)
                chunks.append(f'<pre style="color:#b00">{html.escape(tb)}</pre>')
            else:
                chunks.append(_bundle_html(output.data))
        if self.status not in (None, "ok", "error"):
            note = f"execution {self.status}"
            if self.reason:
                note += f": {self.reason}"
            chunks.append(f"<p><em>{html.escape(note)}</em></p>")
        if self.state_lost:
            chunks.append("<p><em>The kernel restarted; earlier state is lost.</em></p>")
        return "\n".join(chunks)


def _bundle_html(data: Mapping[str, Any]) -> str:
    """Safe HTML for a MIME bundle: images as data URIs, else escaped text/plain."""
    for mime in _IMAGE_TYPES:
        value = data.get(mime)
        if value is None:
            continue
        if mime == "image/svg+xml":
            svg = value if isinstance(value, str) else "".join(value)
            value = base64.b64encode(svg.encode()).decode()
        elif isinstance(value, bytes):
            value = base64.b64encode(value).decode()
        # As an <img> source, even an SVG cannot run script.
        return f'<img src="data:{mime};base64,{html.escape(str(value).strip())}"/>'
    text = data.get("text/plain")
    if text is None:
        return ""
    text = text if isinstance(text, str) else "".join(text)
    return f"<pre>{html.escape(text)}</pre>"
