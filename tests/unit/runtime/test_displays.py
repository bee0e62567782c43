"""The Python kernel's chart and data formatters (images/python/kernelgw_kernel/displays.py):
their pure logic on the host's matplotlib, pandas and e2b-charts (the image pins
the same e2b-charts), and, in real ipykernel processes running the image's
launcher (tests/support/local_backend.py), that a display carries both MIME types,
that a failing extraction shows nothing, and that the kernel starts without
importing matplotlib or pandas.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import warnings
from collections.abc import Iterator
from decimal import Decimal
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from kernelgw.events import CHART_MIME, DATA_MIME
from tests.support.local_backend import image_helper
from tests.unit.runtime.conftest import SessionFactory
from tests.unit.runtime.test_session import run


@pytest.fixture(scope="module")
def displays() -> Iterator[ModuleType]:
    with image_helper("displays") as module:
        yield module


def chart(displays: ModuleType, figure: Figure) -> dict[str, Any] | None:
    """``figure_chart`` itself (its exceptions propagate), with matplotlib's
    deprecation warnings about e2b-charts' reads silenced as the formatter does."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        result: dict[str, Any] | None = displays.figure_chart(figure)
    if result is not None:
        json.dumps(result, allow_nan=False)  # plain JSON, nothing else
    return result


def axes(title: str = "") -> tuple[Figure, Any]:
    figure = Figure()
    ax = figure.add_subplot()
    if title:
        ax.set_title(title)
    return figure, ax


def test_the_kernel_and_the_event_schema_name_the_same_mime_types(displays: ModuleType) -> None:
    assert (displays.CHART_MIME, displays.DATA_MIME) == (CHART_MIME, DATA_MIME)
    assert CHART_MIME == "application/vnd.kernelgw.chart+json" and DATA_MIME == "application/vnd.kernelgw.data+json"


# ---------------------------------------------------------------- json_safe


class Colour(enum.Enum):
    RED = "red"


class Label(str):
    def __str__(self) -> str:
        return "not the text"


def test_json_safe_makes_every_value_plain_json(displays: ModuleType) -> None:
    value = {
        "nan": float("nan"),
        "inf": [float("inf"), -float("inf"), 1.5],
        "numpy": [np.int64(3), np.float32(0.5), np.bool_(True), np.float64("nan"), np.array([[1, 2]])],
        "dates": [
            dt.datetime(2024, 1, 2, 3, 4, 5),
            dt.date(2024, 1, 2),
            dt.time(3, 4),
            pd.Timestamp("2024-01-02T03:04:05"),
            np.datetime64("2024-01-02T03:04:05"),
        ],
        "missing": [None, pd.NA, pd.NaT],
        "decimal": [Decimal("1.25"), Decimal("NaN"), Decimal("sNaN")],
        "tuple": (1, "a"),
        "enum": Colour.RED,
        "str subclass": Label("text"),
        3: "int key",
        "other": [complex(1, 2), b"raw"],
    }
    safe = displays.json_safe(value)
    json.dumps(safe, allow_nan=False)
    assert safe == {
        "nan": None,
        "inf": [None, None, 1.5],
        "numpy": [3, 0.5, True, None, [[1, 2]]],
        "dates": [
            "2024-01-02T03:04:05",
            "2024-01-02",
            "03:04:00",
            "2024-01-02T03:04:05",
            "2024-01-02T03:04:05",
        ],
        "missing": [None, None, None],
        "decimal": [1.25, None, None],
        "tuple": [1, "a"],
        "enum": "red",
        "str subclass": "text",
        "3": "int key",
        "other": ["(1+2j)", "b'raw'"],
    }


def test_json_safe_refuses_more_than_its_budget(displays: ModuleType) -> None:
    assert displays.json_safe(["x" * 90], budget=100) == ["x" * 90]
    with pytest.raises(displays.TooLarge):
        displays.json_safe(["x" * 200], budget=100)
    with pytest.raises(displays.TooLarge):
        displays.json_safe(list(range(1000)), budget=100)


def test_json_safe_ends_deep_or_self_containing_structures(displays: ModuleType) -> None:
    loop: list[Any] = []
    loop.append(loop)
    safe = displays.json_safe(loop)
    json.dumps(safe)  # no recursion error: the depth limit ends it with a str()
    depth = 0
    while isinstance(safe, list):
        safe, depth = safe[0], depth + 1
    assert isinstance(safe, str) and depth == displays.MAX_DEPTH


# ------------------------------------------------------------------ charts


def test_a_line_chart_has_its_title_labels_units_and_points(displays: ModuleType) -> None:
    figure, ax = axes("Growth")
    ax.plot([0, 1, 2], [1.0, float("nan"), 4.0], label="speed")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("distance [m]")
    got = chart(displays, figure)
    assert got is not None
    assert (got["type"], got["title"]) == ("line", "Growth")
    assert (got["x_label"], got["x_unit"], got["y_label"], got["y_unit"]) == ("time (s)", "s", "distance [m]", "m")
    assert got["elements"] == [{"label": "speed", "points": [[0, 1.0], [1, None], [2, 4.0]]}]
    assert got["x_scale"] == "linear" and got["x_ticks"] and got["x_tick_labels"]


def test_bar_scatter_pie_and_box_charts(displays: ModuleType) -> None:
    figure, ax = axes("Sales")
    ax.bar(["north", "south"], [3, 5], label="2024")
    bar = chart(displays, figure)
    assert bar is not None and (bar["type"], bar["title"]) == ("bar", "Sales")
    assert bar["elements"] == [
        {"label": "north", "group": "2024", "value": 3.0},
        {"label": "south", "group": "2024", "value": 5.0},
    ]

    figure, ax = axes()
    ax.scatter(np.array([1, 2]), np.array([3.5, 4.5]), label="obs")
    scatter = chart(displays, figure)
    assert scatter is not None and scatter["type"] == "scatter"
    assert scatter["elements"] == [{"label": "obs", "points": [[1.0, 3.5], [2.0, 4.5]]}]

    figure, ax = axes()
    ax.pie([1, 3], labels=["a", "b"])
    pie = chart(displays, figure)
    assert pie is not None and pie["type"] == "pie"
    assert [(e["label"], e["angle"]) for e in pie["elements"]] == [("a", 90.0), ("b", 270.0)]

    figure, ax = axes()
    ax.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4]], tick_labels=["p", "q"], patch_artist=True)  # boxes as patches
    box = chart(displays, figure)
    assert box is not None and box["type"] == "box_and_whisker"
    assert box["elements"][0] == {
        "label": "p",
        "min": 1.0,
        "first_quartile": 2.25,
        "median": 3.5,
        "third_quartile": 4.75,
        "max": 5.0,
        "outliers": [20.0],
    }
    assert box["elements"][1]["label"] == "q" and box["elements"][1]["outliers"] == []


def test_a_figure_of_several_axes_is_a_superchart(displays: ModuleType) -> None:
    figure = Figure()
    left, right = figure.subplots(1, 2)
    left.plot([1, 2], [3, 4])
    left.set_title("left")
    right.bar(["a"], [1])
    figure.suptitle("both")
    got = chart(displays, figure)
    assert got is not None and (got["type"], got["title"]) == ("superchart", "both")
    assert [(e["type"], e["title"]) for e in got["elements"]] == [("line", "left"), ("bar", None)]


def test_dates_on_an_axis_are_iso_strings(displays: ModuleType) -> None:
    figure, ax = axes()
    ax.plot(pd.date_range("2024-01-01", periods=2), [1, 2])
    got = chart(displays, figure)
    assert got is not None and got["x_scale"] == "datetime"
    assert got["elements"][0]["points"] == [["2024-01-01T00:00:00", 1.0], ["2024-01-02T00:00:00", 2.0]]


def test_no_chart_for_a_blank_figure_or_one_of_too_many_points(displays: ModuleType) -> None:
    assert chart(displays, Figure()) is None  # no axes
    figure, ax = axes("only a title")
    ax.text(0.5, 0.5, "and text")
    assert chart(displays, figure) is None  # axes without data

    figure, ax = axes()
    ax.plot(np.arange(displays.MAX_CHART_POINTS))
    assert displays.plotted_points(figure) == displays.MAX_CHART_POINTS
    assert chart(displays, figure) is not None
    ax.scatter([1], [1])
    assert displays.plotted_points(figure) == displays.MAX_CHART_POINTS + 1
    assert chart(displays, figure) is None


def test_e2bs_sdk_reads_every_kind_of_chart(displays: ModuleType) -> None:
    """What E2B's face passes on as a result's ``chart`` (the kernel's JSON, lists
    for E2B's tuples) is what e2b-code-interpreter's client builds its charts from."""
    from e2b_code_interpreter.charts import _deserialize_chart

    figures = []
    figure, ax = axes("line")
    ax.plot(pd.date_range("2024-01-01", periods=3), [1, 2, 3])
    figures.append(figure)
    figure, ax = axes("scatter")
    ax.scatter([1, 2], [3, 4])
    figures.append(figure)
    figure, ax = axes("bar")
    ax.bar(["a", "b"], [1, 2])
    figures.append(figure)
    figure, ax = axes("pie")
    ax.pie([1, 2])
    figures.append(figure)
    figure, ax = axes("box")
    ax.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4]], patch_artist=True)
    figures.append(figure)
    figure = Figure()
    for i, ax in enumerate(figure.subplots(1, 2)):
        ax.plot([0, i])
    figures.append(figure)
    kinds = []
    for figure in figures:
        got = chart(displays, figure)
        assert got is not None
        parsed = _deserialize_chart(json.loads(json.dumps(got)))
        assert parsed is not None
        kinds.append(parsed.type.value)
    assert kinds == ["line", "scatter", "bar", "pie", "box_and_whisker", "superchart"]


# -------------------------------------------------------------- DataFrames


def test_a_dataframes_data_is_its_columns_as_json_lists(displays: ModuleType) -> None:
    frame = pd.DataFrame(
        {
            "n": [1, 2, 3],
            "x": [0.5, np.nan, np.inf],
            "when": [pd.Timestamp("2024-01-01"), pd.NaT, pd.Timestamp("2024-01-03 12:00")],
            "name": ["a", None, "c"],
            "maybe": pd.array([1, None, 3], dtype="Int64"),
            7: pd.Categorical(["u", "v", None]),
        },
        index=["r1", "r2", "r3"],  # not part of the data, as df.to_dict(orient="list")
    )
    data = displays.frame_data(frame)
    json.dumps(data, allow_nan=False)
    assert data == {
        "n": [1, 2, 3],
        "x": [0.5, None, None],
        "when": ["2024-01-01T00:00:00", None, "2024-01-03T12:00:00"],
        "name": ["a", None, "c"],
        "maybe": [1, None, 3],
        "7": ["u", "v", None],
    }
    plain = pd.DataFrame({"n": [1, 2], "s": ["a", "b"], "f": [0.5, 1.5]})
    assert displays.frame_data(plain) == plain.to_dict(orient="list")  # E2B's data, where that is JSON


def test_no_data_past_the_cell_or_size_bound(displays: ModuleType) -> None:
    at_bound = pd.DataFrame({"a": range(displays.MAX_DATA_CELLS // 2), "b": 0})
    assert at_bound.size == displays.MAX_DATA_CELLS
    data = displays.frame_data(at_bound)
    assert data is not None and len(data["a"]) == displays.MAX_DATA_CELLS // 2
    assert displays.frame_data(pd.DataFrame({"a": range(displays.MAX_DATA_CELLS + 1)})) is None

    huge_text = pd.DataFrame({"a": ["x" * (displays.MAX_JSON_CHARS // 2)] * 3})
    with pytest.raises(displays.TooLarge):
        displays.frame_data(huge_text)
    assert displays.quiet(displays.frame_data)(huge_text) is None  # what the formatter gives


def test_quiet_turns_failures_and_warnings_into_no_mime_type(displays: ModuleType) -> None:
    def fails(obj: Any) -> dict[str, Any]:
        raise RuntimeError(obj)

    def warns(obj: Any) -> dict[str, Any]:
        warnings.warn("not shown", UserWarning, stacklevel=1)
        return {"ok": obj}

    def not_a_dict(obj: Any) -> Any:
        return [obj]

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert displays.quiet(fails)(1) is None
        assert displays.quiet(warns)(1) == {"ok": 1}
        assert displays.quiet(not_a_dict)(1) is None
    assert seen == []


# ------------------------------------------------- in a real kernel process


INLINE = "%matplotlib inline\nimport matplotlib.pyplot as plt\n"


def bundles(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["type"] in ("display", "result")]


async def test_the_kernel_starts_without_matplotlib_or_pandas(new_session: SessionFactory) -> None:
    session = await new_session()
    events = await run(
        session,
        "import sys\nf = get_ipython().display_formatter.formatters\n"
        f"print({CHART_MIME!r} in f, {DATA_MIME!r} in f, "
        "[m for m in ('matplotlib', 'pandas', 'pydantic', 'e2b_charts') if m in sys.modules])",
    )
    assert "".join(e["text"] for e in events if e["type"] == "stream") == "True True []\n"


async def test_a_shown_figure_and_a_dataframe_carry_their_mime_types(new_session: SessionFactory) -> None:
    session = await new_session()
    events = await run(session, INLINE + "plt.plot([1, 2, 3], [2, 4, 8])\nplt.title('Doubling')\nplt.show()")
    assert events[-1]["status"] == "ok"
    (shown,) = bundles(events)
    assert "image/png" in shown
    assert shown[CHART_MIME]["type"] == "line" and shown[CHART_MIME]["title"] == "Doubling"
    assert shown[CHART_MIME]["elements"][0]["points"] == [[1, 2], [2, 4], [3, 8]]

    events = await run(session, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', float('nan')]})")
    (result,) = bundles(events)
    assert result[DATA_MIME] == {"a": [1, 2], "b": ["x", None]}
    assert "text/html" in result and "text/plain" in result

    events = await run(session, "display(plt.figure())\nplt.close('all')")
    (blank,) = bundles(events)
    assert CHART_MIME not in blank and "text/plain" in blank


async def test_an_extraction_that_fails_shows_nothing_and_keeps_the_display(new_session: SessionFactory) -> None:
    session = await new_session()
    events = await run(
        session,
        INLINE + "import e2b_charts.main\n"
        "def broken(figure):\n    raise RuntimeError('extraction failed')\n"
        "e2b_charts.main.get_chart_from_ax = broken\n"  # what chart_figure_to_dict calls
        "plt.plot([1, 2])\nplt.show()",
    )
    assert events[-1]["status"] == "ok"
    assert [e["type"] for e in events if e["type"] in ("stream", "error")] == []  # no traceback, no warning
    (shown,) = bundles(events)
    assert "image/png" in shown and CHART_MIME not in shown
