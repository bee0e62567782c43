"""A figure's structured chart and a DataFrame's data from the Python kernel image,
end to end on a real container: /v1 events, history, output caps and the SDK.

The kernel's formatters (images/python/kernelgw_kernel/displays.py) add
``application/vnd.kernelgw.chart+json`` to a matplotlib figure's display and
``application/vnd.kernelgw.data+json`` to a DataFrame's; the gateway passes them
through like any MIME type.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import nbformat
import pytest

from kernelgw.client import Client, Session
from kernelgw.events import CHART_MIME, DATA_MIME
from tests.integration.conftest import RunningGateway, gateway_settings, run, start_gateway

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bundles(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The MIME bundles of a cell's displays and result, in order."""
    assert result["status"] == "ok", result
    return [e["data"] for e in result["events"] if e["type"] in ("display", "result")]


def shown_chart(result: dict[str, Any]) -> dict[str, Any]:
    """The one figure the cell showed: its PNG is there, and its chart."""
    (bundle,) = bundles(result)
    assert base64.b64decode(bundle["image/png"]).startswith(PNG_MAGIC)
    chart: dict[str, Any] = bundle[CHART_MIME]
    return chart


def test_the_kernel_starts_without_importing_matplotlib_or_pandas(http: httpx.Client, session_id: str) -> None:
    result = run(
        http,
        session_id,
        "import sys\nformats = get_ipython().display_formatter.formatters\n"
        f"print({CHART_MIME!r} in formats, {DATA_MIME!r} in formats,"
        " [m for m in ('matplotlib', 'pandas', 'pydantic', 'e2b_charts') if m in sys.modules])",
    )
    assert "".join(e["text"] for e in result["events"] if e["type"] == "stream") == "True True []\n"


def test_a_line_chart_has_its_title_axes_and_points(http: httpx.Client, session_id: str) -> None:
    chart = shown_chart(
        run(
            http,
            session_id,
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3], [1, 4, 9], label='squares')\n"
            "plt.title('Growth'); plt.xlabel('step'); plt.ylabel('size (m)')\n"
            "plt.show()",
        )
    )
    assert (chart["type"], chart["title"]) == ("line", "Growth")
    assert (chart["x_label"], chart["y_label"], chart["y_unit"]) == ("step", "size (m)", "m")
    assert chart["elements"] == [{"label": "squares", "points": [[1, 1], [2, 4], [3, 9]]}]

    # in history, as it was sent, and in the exported notebook (a valid one)
    history = http.get(f"/v1/sessions/{session_id}/history").json()
    (stored,) = [e for e in history["executions"][-1]["events"] if e["type"] == "display"]
    assert stored["data"][CHART_MIME] == chart
    notebook = nbformat.reads(http.get(f"/v1/sessions/{session_id}/notebook").text, as_version=4)
    nbformat.validate(notebook)
    (output,) = notebook.cells[-1].outputs
    assert output.output_type == "display_data" and output.data[CHART_MIME] == chart


def test_a_bar_chart_and_a_figure_of_two_axes(http: httpx.Client, session_id: str) -> None:
    bar = shown_chart(
        run(
            http,
            session_id,
            "import matplotlib.pyplot as plt\nplt.bar(['north', 'south', 'east'], [3, 5, 2])\n"
            "plt.title('Sales')\nplt.show()",
        )
    )
    assert (bar["type"], bar["title"]) == ("bar", "Sales")
    assert [(e["label"], e["value"]) for e in bar["elements"]] == [("north", 3), ("south", 5), ("east", 2)]

    both = shown_chart(
        run(
            http,
            session_id,
            "fig, (left, right) = plt.subplots(1, 2)\n"
            "left.plot([0, 1], [1, 0]); left.set_title('down')\n"
            "right.scatter([1, 2], [3, 4]); right.set_title('dots')\n"
            "fig.suptitle('Two views')\nplt.show()",
        )
    )
    assert (both["type"], both["title"]) == ("superchart", "Two views")
    assert [(c["type"], c["title"]) for c in both["elements"]] == [("line", "down"), ("scatter", "dots")]
    assert both["elements"][1]["elements"][0]["points"] == [[1, 3], [2, 4]]


def test_a_dataframes_data(http: httpx.Client, session_id: str) -> None:
    result = run(
        http,
        session_id,
        "import pandas as pd, numpy as np\n"
        "df = pd.DataFrame({'city': ['Oslo', 'Lima'], 'temp': [4.5, np.nan],"
        " 'day': pd.to_datetime(['2024-01-01', '2024-01-02'])})\n"
        "display(df.head(1))\ndf",
    )
    shown, value = bundles(result)
    assert shown[DATA_MIME] == {"city": ["Oslo"], "temp": [4.5], "day": ["2024-01-01T00:00:00"]}
    assert value[DATA_MIME] == {
        "city": ["Oslo", "Lima"],
        "temp": [4.5, None],
        "day": ["2024-01-01T00:00:00", "2024-01-02T00:00:00"],
    }
    assert "text/html" in value and "text/plain" in value

    # past 10,000 cells: the table as usual, without its data
    (big,) = bundles(run(http, session_id, "pd.DataFrame({'a': range(5001), 'b': 0})"))
    assert DATA_MIME not in big and "text/html" in big


def test_a_blank_figure_has_no_chart(http: httpx.Client, session_id: str) -> None:
    result = run(
        http,
        session_id,
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(); ax.set_title('nothing yet')\nplt.show()\n"
        "display(plt.figure())\nplt.close('all')",
    )
    shown = bundles(result)
    assert len(shown) == 2 and all("text/plain" in b for b in shown)
    assert [CHART_MIME in b for b in shown] == [False, False]
    assert not [e for e in result["events"] if e["type"] in ("stream", "error")]  # nothing printed


@pytest.fixture
def sdk_session(gateway_url: str) -> Iterator[Session]:
    with Client(gateway_url) as client, client.session() as session:
        yield session


def test_the_sdk_reads_charts_and_data(sdk_session: Session) -> None:
    execution = sdk_session.run(
        "import matplotlib.pyplot as plt, pandas as pd\n"
        "plt.pie([1, 3], labels=['a', 'b']); plt.title('Shares'); plt.show()\n"
        "pd.DataFrame({'n': [1, 2]})"
    ).raise_for_error()
    assert [(c["type"], c["title"]) for c in execution.charts] == [("pie", "Shares")]
    assert [(e["label"], e["angle"]) for e in execution.charts[0]["elements"]] == [("a", 90), ("b", 270)]
    assert execution.data == [{"n": [1, 2]}]
    assert len(execution.images) == 1


IMPORTS = "import numpy as np, matplotlib.pyplot as plt"
SMOOTH_LINE = "x = np.linspace(0, 10, 9000)\nplt.plot(x, np.sin(x)); plt.show()"


def test_a_chart_counts_against_the_output_cap(gateway: RunningGateway, http: httpx.Client, session_id: str) -> None:
    """9,000 points: a small PNG and a large chart; under a cap between the two
    sizes the display is cut, so the chart is counted."""
    run(http, session_id, IMPORTS)  # a cell of its own: the plot's cell stays short
    whole = run(http, session_id, SMOOTH_LINE)
    shown = bundles(whole)
    assert len(shown) == 1, whole
    (full,) = shown
    assert len(full["image/png"]) < 60_000 and len(json.dumps(full[CHART_MIME])) > 200_000
    gw = start_gateway(gateway_settings(gateway_name=f"{gateway.settings.gateway_name}k", max_output_bytes=100_000))
    try:
        with httpx.Client(base_url=gw.url, timeout=120) as capped:
            sid = capped.post("/v1/sessions", json={}).json()["id"]
            run(capped, sid, IMPORTS)
            cut = run(capped, sid, SMOOTH_LINE)
            kinds = [e["type"] for e in cut["events"]]
            assert cut["status"] == "ok" and "display" not in kinds and kinds.count("truncated") == 1, cut
    finally:
        gw.stop()
