"""Executing code: state, streams, rich outputs, errors, over REST and WebSocket."""

from __future__ import annotations

import base64
import json
import time

import httpx
import pytest
from websockets.sync.client import connect

from tests.integration.conftest import RunningGateway, run, stdout

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_state_survives_between_executions(http: httpx.Client, session_id: str) -> None:
    first = run(http, session_id, "import math\nx = 41")
    assert first["status"] == "ok"
    second = run(http, session_id, "x + 1")
    assert second["status"] == "ok"
    results = [e for e in second["events"] if e["type"] == "result"]
    assert results[0]["data"]["text/plain"] == "42"
    assert results[0]["execution_count"] == second["execution_count"] == first["execution_count"] + 1
    assert run(http, session_id, "print(math.pi)")["events"][2]["text"].startswith("3.14159")


def test_event_order_and_sequence(http: httpx.Client, session_id: str) -> None:
    result = run(http, session_id, "print('hi')\n7")
    types = [e["type"] for e in result["events"]]
    assert types == ["queued", "status", "stream", "result", "done"]
    seqs = [e["seq"] for e in result["events"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {e["execution_id"] for e in result["events"]} == {result["execution_id"]}
    assert result["events"][-1]["duration_ms"] > 0


def test_stdout_and_stderr_are_separate_streams_in_order(http: httpx.Client, session_id: str) -> None:
    code = (
        "import sys\n"
        "for i in range(3):\n"
        "    print(f'out{i}', flush=True)\n"
        "    print(f'err{i}', file=sys.stderr, flush=True)\n"
    )
    events = [e for e in run(http, session_id, code)["events"] if e["type"] == "stream"]
    out = "".join(e["text"] for e in events if e["name"] == "stdout")
    err = "".join(e["text"] for e in events if e["name"] == "stderr")
    assert out == "out0\nout1\nout2\n"
    assert err == "err0\nerr1\nerr2\n"


def test_matplotlib_plot_yields_a_valid_png(http: httpx.Client, session_id: str) -> None:
    code = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3], [1, 4, 9])\nplt.show()\n"
    result = run(http, session_id, code)
    assert result["status"] == "ok", result
    displays = [e for e in result["events"] if e["type"] == "display"]
    assert len(displays) == 1
    png = base64.b64decode(displays[0]["data"]["image/png"])
    assert png.startswith(PNG_MAGIC)
    assert len(png) > 1000
    assert "text/plain" in displays[0]["data"]


def test_dataframe_yields_html_and_text(http: httpx.Client, session_id: str) -> None:
    code = "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"
    result = run(http, session_id, code)
    data = next(e for e in result["events"] if e["type"] == "result")["data"]
    assert "<table" in data["text/html"]
    assert "a  b" in data["text/plain"].replace("   ", "  ")


def test_exception_yields_error_event_with_traceback(http: httpx.Client, session_id: str) -> None:
    result = run(http, session_id, "def f():\n    return 1 / 0\nf()")
    assert result["status"] == "error"
    error = next(e for e in result["events"] if e["type"] == "error")
    assert error["ename"] == "ZeroDivisionError"
    assert error["evalue"] == "division by zero"
    assert any("\x1b[" in line for line in error["traceback"])
    assert not any("\x1b[" in line for line in error["traceback_text"])
    assert any("return 1 / 0" in line for line in error["traceback_text"])
    done = result["events"][-1]
    assert done["type"] == "done" and done["status"] == "error"
    assert "ZeroDivisionError" in done["reason"]


def test_input_fails_fast_instead_of_hanging(http: httpx.Client, session_id: str) -> None:
    result = run(http, session_id, "input('name? ')", timeout=30)
    assert result["status"] == "error"
    error = next(e for e in result["events"] if e["type"] == "error")
    assert error["ename"] == "StdinNotImplementedError"
    # it did not wait for the timeout: that would have ended it as `timeout`, not this error


def test_display_update_and_clear_output(http: httpx.Client, session_id: str) -> None:
    code = (
        "from IPython.display import display, update_display, clear_output\n"
        "display('first', display_id='d1')\n"
        "update_display('second', display_id='d1')\n"
        "clear_output(wait=True)\n"
        "print('after')\n"
    )
    events = run(http, session_id, code)["events"]
    kinds = [e["type"] for e in events]
    assert kinds == ["queued", "status", "display", "update_display", "clear_output", "stream", "done"]
    assert events[2]["display_id"] == events[3]["display_id"] == "d1"
    assert events[3]["data"]["text/plain"] == "'second'"
    assert events[4]["wait"] is True


def test_ws_streams_output_before_the_cell_ends(gateway: RunningGateway, session_id: str) -> None:
    code = "import time\nfor i in range(3):\n    print(f'tick {i}', flush=True)\n    time.sleep(1)\n"
    with connect(f"{gateway.ws_url}/v1/sessions/{session_id}/ws") as ws:
        ws.send(json.dumps({"type": "execute", "code": code, "execution_id": "stream-1"}))
        arrivals: list[tuple[float, dict]] = []
        while True:
            event = json.loads(ws.recv(timeout=30))
            arrivals.append((time.monotonic(), event))
            if event["type"] == "done":
                break
    ticks = [(t, e) for t, e in arrivals if e["type"] == "stream"]
    done_at = arrivals[-1][0]
    assert [e["text"] for _, e in ticks] == ["tick 0\n", "tick 1\n", "tick 2\n"]
    # the first line arrived while the cell still had two seconds of sleeping to do
    assert done_at - ticks[0][0] > 1.5
    assert arrivals[-1][1]["status"] == "ok"
    assert all(e["execution_id"] == "stream-1" for _, e in arrivals)


def test_large_output_is_truncated_with_a_marker(gateway: RunningGateway) -> None:
    from tests.integration.conftest import gateway_settings, start_gateway

    gw = start_gateway(gateway_settings(gateway_name=f"{gateway.settings.gateway_name}c", max_output_bytes=100_000))
    try:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            result = run(http, sid, "for i in range(20000):\n    print('x' * 99)\nprint('still running')\n'end'")
            assert result["status"] == "ok"
            kinds = [e["type"] for e in result["events"]]
            assert kinds.count("truncated") == 1
            assert len(stdout(result)) <= 100_000
            assert "result" not in kinds  # dropped after the cap, like all output
            # one message over the cap: its head up to the cap, then the marker
            big = run(http, sid, "print('y' * 300_000)")
            assert stdout(big) == "y" * 100_000
            assert [e["type"] for e in big["events"]].count("truncated") == 1
            # the kernel is fine and later cells have their own budget
            assert stdout(run(http, sid, "print('next')")) == "next\n"
    finally:
        gw.stop()
