"""Structured data beside a display's pictures: a matplotlib figure's chart and
a pandas DataFrame's columns, as two MIME types of their own.

A PNG of a plot tells a model or a UI nothing it can compute with; E2B's code
interpreter therefore sends, with each figure, what it shows (chart type,
title, axes, units, the points, bars, wedges or boxes) and, with each
DataFrame, its data. kernelgw's Python kernel does the same under its own
names, registered as IPython display formatters when the kernel starts
(:func:`install`, called by :mod:`kernelgw_kernel.launcher`):

``application/vnd.kernelgw.chart+json`` (:data:`CHART_MIME`)
    On a display (or result) of a ``matplotlib.figure.Figure``: the dict of
    E2B's MIT package ``e2b-charts`` (``e2b_charts.chart_figure_to_dict``),
    made JSON-safe. Always ``type`` (``line``, ``scatter``, ``bar``, ``pie``,
    ``box_and_whisker``, ``superchart`` or ``unknown``), ``title`` (str or
    null) and ``elements`` (a list); 2-D charts add ``x_label``, ``y_label``,
    ``x_unit``, ``y_unit`` (null when absent; a unit is what the label holds in
    ``(...)`` or ``[...]``); line and scatter charts add ``x_ticks``,
    ``x_tick_labels``, ``x_scale`` and the same for y. Elements: line and
    scatter ``{"label", "points": [[x, y], ...]}`` (x or y an ISO string on a
    date axis, a string on a categorical one); bar
    ``{"label", "group", "value"}``; pie ``{"label", "angle", "radius"}``;
    box_and_whisker ``{"label", "min", "first_quartile", "median",
    "third_quartile", "max", "outliers"}``; a ``superchart`` (a figure of
    several axes, its title the figure's suptitle) has one chart per axes as
    its elements. Example::

        {"type": "line", "title": "Growth", "x_label": "time (s)", "x_unit": "s",
         "y_label": null, "y_unit": null, "x_scale": "linear", "y_scale": "linear",
         "x_ticks": [0.0, 1.0], "x_tick_labels": ["0", "1"], "y_ticks": [...], "y_tick_labels": [...],
         "elements": [{"label": "Line 0", "points": [[0.0, 1.0], [1.0, 2.0]]}]}

``application/vnd.kernelgw.data+json`` (:data:`DATA_MIME`)
    On a display (or result) of a ``pandas.DataFrame``: its columns as lists,
    ``{"column name": [value, ...], ...}``, as ``df.to_dict(orient="list")``
    (E2B's ``data``): the index is not included, column names become strings
    (a repeated name keeps its last column, as pandas does). Values are JSON:
    NaN, infinities, ``None``, ``pd.NA`` and ``NaT`` become null, timestamps,
    dates and times ISO 8601 strings, numpy scalars and arrays numbers and
    lists, Decimals floats, anything else its ``str()``.

Bounds, so neither can slow a display down much or push it past the
gateway's output cap (the PNG would be lost with it): no chart for a blank
figure (no axes, or none with data), nor for one of more than
:data:`MAX_CHART_POINTS` points, bars, wedges and boxes; no data for a
DataFrame of more than :data:`MAX_DATA_CELLS` cells (rows x columns); neither
when its JSON would exceed about :data:`MAX_JSON_CHARS` characters. In those
cases the MIME type is simply absent; the display keeps its other types
(``text/plain``, ``text/html``, ``image/png``).

A formatter here never fails a display and never prints: an exception (a
figure e2b-charts cannot read, say) or a warning while extracting means that
MIME type is left out, silently. Nothing heavy is imported at kernel start:
the formatters know their types by module and class name, so matplotlib,
pandas, pydantic and e2b-charts are imported by user code, or, for e2b-charts
and pydantic, at the first figure displayed (about 0.2 s, once).
"""

from __future__ import annotations

import datetime as _dt
import enum
import math
import sys
import warnings
from decimal import Decimal
from typing import Any

CHART_MIME = "application/vnd.kernelgw.chart+json"
DATA_MIME = "application/vnd.kernelgw.data+json"
MAX_DATA_CELLS = 10_000
"""A DataFrame of more cells (rows x columns) gets no data MIME type."""
MAX_CHART_POINTS = 10_000
"""A figure with more line and scatter points, bars, wedges and boxes (all axes
together) gets no chart: e2b-charts takes about 5 ms per 1,000 points."""
MAX_JSON_CHARS = 2 * 1024 * 1024
"""Either MIME type is left out when its JSON would be longer than about this
(the gateway's output cap is 16 MiB per cell by default, images included)."""
MAX_DEPTH = 32
"""Nested lists and dicts in a DataFrame cell deeper than this become their
``str()``, which also ends a structure that contains itself."""

FIGURE_TYPES = (("matplotlib.figure", "Figure"),)
FRAME_TYPES = (("pandas", "DataFrame"), ("pandas.core.frame", "DataFrame"))
"""(module, class name) of the classes formatted, subclasses included: pandas 3
names ``pandas`` as DataFrame's module, older versions ``pandas.core.frame``."""


class TooLarge(Exception):
    """The JSON would be longer than its budget."""


# ---------------------------------------------------------------- JSON-safe


def json_safe(value: Any, budget: int = MAX_JSON_CHARS) -> Any:
    """``value`` as plain JSON data (dicts with string keys, lists, str, int,
    finite float, bool, None); raises :class:`TooLarge` once its JSON would
    pass about ``budget`` characters."""
    left = [budget]
    return _safe(value, left, 0)


def _spend(left: list[int], cost: int) -> None:
    left[0] -= cost
    if left[0] < 0:
        raise TooLarge


def _safe(value: Any, left: list[int], depth: int) -> Any:
    kind = type(value)
    if value is None or kind is bool:
        _spend(left, 5)
        return value
    if kind is int:
        _spend(left, 8)
        return value
    if kind is float:
        _spend(left, 12)
        return value if math.isfinite(value) else None
    if kind is str:
        _spend(left, len(value) + 3)
        return value
    if kind is list or kind is tuple:
        if depth >= MAX_DEPTH:
            return _text(value, left)
        _spend(left, 2)
        return [_safe(item, left, depth + 1) for item in value]
    if kind is dict:
        if depth >= MAX_DEPTH:
            return _text(value, left)
        _spend(left, 2)
        return {_key(key, left): _safe(item, left, depth + 1) for key, item in value.items()}
    return _other(value, left, depth)


def _key(key: Any, left: list[int]) -> str:
    text = key if type(key) is str else _plain_str(key)
    _spend(left, len(text) + 4)
    return text


def _plain_str(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str):
        return str.__str__(value)  # a str subclass's text, not its __str__
    return str(value)


def _text(value: Any, left: list[int]) -> str:
    text = _plain_str(value)
    _spend(left, len(text) + 3)
    return text


def _other(value: Any, left: list[int], depth: int) -> Any:
    """Everything but the exact JSON types: subclasses, numpy, pandas, dates."""
    if isinstance(value, enum.Enum):
        return _safe(value.value, left, depth)
    if isinstance(value, bool):
        return _safe(bool(value), left, depth)
    if isinstance(value, float):  # numpy.float64 is one
        return _safe(float(value), left, depth)
    if isinstance(value, int):
        return _safe(int(value), left, depth)
    if isinstance(value, str):
        return _safe(str.__str__(value), left, depth)
    if isinstance(value, Decimal):
        return _safe(None if value.is_nan() else float(value), left, depth)
    if _missing(value):
        return _safe(None, left, depth)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):  # pandas.Timestamp too
        return _safe(value.isoformat(), left, depth)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(value, (numpy.datetime64, numpy.timedelta64)):
            return _safe(str(value), left, depth)  # ISO 8601 ('2024-01-01T00:00:00')
        if isinstance(value, (numpy.generic, numpy.ndarray)):
            return _safe(value.tolist(), left, depth)  # Python scalars, nested lists
    if isinstance(value, (list, tuple, dict)):  # subclasses
        return _safe(dict(value) if isinstance(value, dict) else list(value), left, depth)
    isoformat = getattr(value, "isoformat", None)  # pandas.Timedelta, Period-likes
    if callable(isoformat) and not isinstance(value, type):
        text = isoformat()
        if isinstance(text, str):
            return _safe(text, left, depth)
    return _text(value, left)


def _missing(value: Any) -> bool:
    """pandas' missing values (``pd.NA``, ``NaT``) and numpy's NaT, without
    importing pandas (a DataFrame's values only exist once it is imported)."""
    pandas = sys.modules.get("pandas")
    if pandas is None:
        return False
    try:
        return pandas.isna(value) is True
    except Exception:  # an object whose comparisons raise
        return False


# ------------------------------------------------------------------ charts


def plotted_points(figure: Any) -> int:
    """Points, bars, wedges and boxes on all of ``figure``'s axes (what the
    chart would list), counted without extracting anything."""
    total = 0
    for ax in figure.get_axes():
        for line in ax.get_lines():
            total += len(line.get_xdata())
        for collection in ax.collections:
            offsets = collection.get_offsets()
            total += len(offsets) if offsets is not None else 0
        total += len(ax.patches)
    return total


def figure_chart(figure: Any) -> dict[str, Any] | None:
    """The chart of a matplotlib figure (:data:`CHART_MIME`), or None: a blank
    figure, one past :data:`MAX_CHART_POINTS` or :data:`MAX_JSON_CHARS`, or one
    e2b-charts cannot read."""
    axes = figure.get_axes()
    if not axes or not any(ax.has_data() for ax in axes):
        return None
    if plotted_points(figure) > MAX_CHART_POINTS:
        return None
    from e2b_charts import chart_figure_to_dict

    chart = chart_figure_to_dict(figure)
    if not chart:
        return None
    safe = json_safe(chart)
    return safe if isinstance(safe, dict) else None


# -------------------------------------------------------------- DataFrames


def frame_data(frame: Any) -> dict[str, Any] | None:
    """A DataFrame's columns as lists (:data:`DATA_MIME`), or None past
    :data:`MAX_DATA_CELLS` or :data:`MAX_JSON_CHARS`."""
    if frame.size > MAX_DATA_CELLS:
        return None
    left = [MAX_JSON_CHARS]
    out: dict[str, Any] = {}
    for name, column in frame.items():
        out[_key(name, left)] = _safe(column.tolist(), left, 1)
    return out


# ---------------------------------------------------------- the formatters


def quiet(extract: Any) -> Any:
    """``extract`` made unable to fail a display: no exception leaves it (IPython
    would print a traceback into the cell) and no warning it raises is shown;
    None (no MIME type) instead, also when the JSON would be too large."""

    def formatted(obj: Any) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = extract(obj)
        except Exception:
            return None
        return result if isinstance(result, dict) else None

    formatted.__name__ = getattr(extract, "__name__", "formatted")
    formatted.__doc__ = extract.__doc__
    return formatted


def of_types(obj: Any, types: tuple[tuple[str, str], ...]) -> bool:
    """Whether ``obj``'s class, or one it derives from, is one of ``types`` by
    (module, class name): no import of the module needed."""
    for cls in type(obj).__mro__:
        if (getattr(cls, "__module__", None), getattr(cls, "__name__", None)) in types:
            return True
    return False


def _formatter_class() -> type:
    from IPython.core.formatters import BaseFormatter

    class JSONDataFormatter(BaseFormatter):
        """Formats objects of fixed types (by name) with one extraction that
        cannot fail the display (:func:`quiet`). IPython's type registry is not
        used: matplotlib's inline backend, when it is set up (pyplot's import,
        ``%matplotlib inline``), removes every formatter's printer for
        ``Figure`` (``select_figure_formats``)."""

        def __init__(self, extract: Any, types: tuple[tuple[str, str], ...], **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.extract = quiet(extract)
            self.types = types

        def __call__(self, obj: Any) -> Any:
            if not self.enabled or not of_types(obj, self.types):
                return None
            return self.extract(obj)

    return JSONDataFormatter


def install(shell: Any) -> None:
    """Register the chart and data formatters on ``shell`` (once; a second call
    changes nothing). Imports neither matplotlib nor pandas."""
    display = shell.display_formatter
    formatters = display.formatters
    if CHART_MIME in formatters and DATA_MIME in formatters:
        return
    formatter_class = _formatter_class()
    formatters[CHART_MIME] = formatter_class(figure_chart, FIGURE_TYPES, parent=display, format_type=CHART_MIME)
    formatters[DATA_MIME] = formatter_class(frame_data, FRAME_TYPES, parent=display, format_type=DATA_MIME)
