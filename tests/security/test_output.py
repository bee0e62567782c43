"""Threat: output built to exhaust the gateway or its clients: floods of text,
of messages, of image bytes, of exception text or metadata, and bytes that are
not UTF-8. Every execution must end, its answer must stay bounded by the
gateway's caps, other sessions must keep answering meanwhile, and the flooding
session must keep delivering output afterwards.

Covered elsewhere (tests/integration/test_execution.py): a cap of 100 kB met
by 20,000 short prints.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from tests.security.conftest import (
    Bystander,
    MiB,
    RunningGateway,
    done_event,
    run,
    stdout,
    ws_connect,
)
from tests.support.metrics import metric

pytestmark = pytest.mark.integration

SLACK = 2 * MiB
"""What a blocking answer may carry beyond the output cap: code, events' framing."""


def execute_raw(http: httpx.Client, sid: str, code: str, **extra: Any) -> tuple[dict[str, Any], int]:
    """A blocking execution: the JSON body and its size in bytes."""
    resp = http.post(f"/v1/sessions/{sid}/execute", json={"code": code, **extra})
    assert resp.status_code == 200, resp.text[:500]
    return resp.json(), len(resp.content)


def assert_bounded(gateway: RunningGateway, result: dict[str, Any], size: int) -> None:
    cap = gateway.settings.max_output_bytes
    kinds = sorted({e["type"] for e in result["events"]})
    assert size < cap + SLACK, f"an answer of {size} bytes ({kinds}) for an output cap of {cap}"
    biggest = max(result["events"], key=lambda e: len(json.dumps(e)))
    assert len(json.dumps(biggest)) < cap + 64 * 1024, f"a {biggest['type']} event of {len(json.dumps(biggest))} bytes"


def assert_output_still_flows(http: httpx.Client, sid: str) -> None:
    """The session's next cells deliver their output and their end normally."""
    for i in range(2):
        after = run(http, sid, f"print('after {i}')")
        assert stdout(after) == f"after {i}\n", after["events"]
        assert after["status"] == "ok" and done_event(after)["reason"] is None, done_event(after)


FLOODS = {
    # 100 MB in 1 MiB prints, flushed, paced so that the flood lasts two seconds at least
    "flushed-lines": "import time\nfor _ in range(100):\n    print('x' * (1 << 20), flush=True)\n    time.sleep(0.02)",
    # 100 MB in one write: ipykernel sends it as one message, over the gateway's message cap
    "single-write": "import sys, time\nsys.stdout.write('x' * (100 << 20))\nsys.stdout.flush()\ntime.sleep(2)",
}


@pytest.mark.parametrize("kind", list(FLOODS))
def test_stdout_flood_is_cut_bounded_and_stalls_nobody(
    http: httpx.Client, gateway: RunningGateway, session_id: str, bystander: Bystander, kind: str
) -> None:
    answer: list[tuple[dict[str, Any], int, float]] = []

    def flood() -> None:
        result, size = execute_raw(http, session_id, FLOODS[kind], timeout=60)
        answer.append((result, size, time.monotonic()))

    flooding = threading.Thread(target=flood)
    try:
        with ws_connect(gateway, session_id) as ws:
            flooding.start()
            # the flood is flowing: its first output reached a subscriber (a wait on that, not a sleep)
            while (event := json.loads(ws.recv(timeout=60)))["type"] not in ("stream", "truncated"):
                assert event["type"] != "done", f"the flood ended before any output: {event}"
        # meanwhile another session answers (how promptly is benchmarks/bench_isolation.py's
        # measure: bystanders' p95 and p99 during floods, not a wall-clock bound here)
        for _ in range(2):
            assert run(http, bystander.session_id, "1 + 1")["status"] == "ok"
        answered = time.monotonic()
    finally:
        if flooding.is_alive():
            flooding.join(timeout=120)
    result, size, flood_ended = answer[0]
    assert answered < flood_ended, "the flood was over before the other session was asked"
    kinds = [e["type"] for e in result["events"]]
    assert kinds.count("truncated") >= 1, kinds
    assert result["status"] == "ok", done_event(result)
    assert_bounded(gateway, result, size)
    assert_output_still_flows(http, session_id)


def test_ten_thousand_display_messages(http: httpx.Client, session_id: str) -> None:
    code = "from IPython.display import display\nfor i in range(10000):\n    display({'text/plain': str(i)}, raw=True)"
    result = run(http, session_id, code, timeout=60)
    assert result["status"] == "ok", done_event(result)
    shown = [e["data"]["text/plain"] for e in result["events"] if e["type"] == "display"]
    kinds = {e["type"] for e in result["events"]}
    # all of them, in order, unless the cap cut them (then it says so)
    assert shown == [str(i) for i in range(len(shown))]
    assert len(shown) == 10000 or "truncated" in kinds
    assert_output_still_flows(http, session_id)


def test_a_display_flood_is_paced_while_another_session_runs_and_loses_nothing(
    http: httpx.Client, session_id: str, bystander: Bystander
) -> None:
    """The kernel waits for the gateway's reading (kernelgw_kernel.backpressure)
    and the gateway reads a flood at a bounded pace while another session has
    output (runtime/output_rate.py): every display arrives, in order."""
    n = 1000  # ten seconds' worth at the shared pace of 100 a second (one of them the burst); the kernel sends thousands a second
    paced_before = metric(http, "kernelgw_output_paced_seconds_total")
    stop = threading.Event()

    def keep_running() -> None:
        while not stop.is_set():
            assert run(http, bystander.session_id, "1 + 1")["status"] == "ok"
            time.sleep(0.05)

    other = threading.Thread(target=keep_running)
    other.start()
    try:
        code = f"from IPython.display import display\nfor i in range({n}):\n    display({{'text/plain': str(i)}}, raw=True)"
        result = run(http, session_id, code, timeout=60)
    finally:
        stop.set()
        other.join(timeout=60)
    assert result["status"] == "ok", done_event(result)
    shown = [e["data"]["text/plain"] for e in result["events"] if e["type"] == "display"]
    assert shown == [str(i) for i in range(n)]
    paced = metric(http, "kernelgw_output_paced_seconds_total") - paced_before
    print(f"{n} displays beside a running session: paced {paced:.2f}s")
    assert paced > 1.0
    assert_output_still_flows(http, session_id)


@pytest.mark.parametrize("megabytes", [5, 50])
def test_huge_png_is_replaced_and_bounded(
    http: httpx.Client, gateway: RunningGateway, session_id: str, megabytes: int
) -> None:
    # 5 MB: over the image cap; 50 MB (67 MB of base64): over the message cap too
    code = (
        "import base64, os\n"
        "from IPython.display import display\n"
        f"png = base64.b64encode(b'\\x89PNG\\r\\n\\x1a\\n' + os.urandom({megabytes} << 20)).decode()\n"
        "display({'image/png': png, 'text/plain': '<a big picture>'}, raw=True)\n"
        "del png\n"
        "print('done drawing')\n"
    )
    result, size = execute_raw(http, session_id, code, timeout=60)
    assert result["status"] == "ok", done_event(result)
    assert "truncated" in [e["type"] for e in result["events"]]
    image_cap = gateway.settings.max_image_bytes
    for event in result["events"]:
        for value in (event.get("data") or {}).values():
            assert len(str(value)) <= image_cap
    assert max(len(json.dumps(e)) for e in result["events"]) < image_cap + 64 * 1024
    assert_bounded(gateway, result, size)
    assert_output_still_flows(http, session_id)


def test_invalid_utf8_on_stdout_arrives_replaced(http: httpx.Client, session_id: str) -> None:
    code = (
        "import os, sys\n"
        "os.write(1, b'\\xff\\xfe\\xfd raw fd ok\\n')\n"
        "sys.__stdout__.buffer.write(b'\\xc3\\x28 half a character\\n')\n"
        "sys.__stdout__.flush()\n"
        "os.write(2, b'\\xed\\xa0\\x80 a surrogate on stderr\\n')\n"
        "import time; time.sleep(0.3)\n"
    )
    result = run(http, session_id, code)
    assert result["status"] == "ok", done_event(result)
    out = stdout(result)
    err = "".join(e["text"] for e in result["events"] if e["type"] == "stream" and e["name"] == "stderr")
    assert "\ufffd\ufffd\ufffd raw fd ok\n" in out, out
    assert "\ufffd( half a character\n" in out, out
    assert "a surrogate on stderr" in err and "\ufffd" in err, err
    # the events are valid JSON text all the way (no lone surrogates passed through)
    json.dumps(result, ensure_ascii=False).encode("utf-8")
    assert_output_still_flows(http, session_id)


@pytest.mark.parametrize("megabytes", [3, 40])
def test_huge_exception_message_is_bounded_and_keeps_the_kernel(
    http: httpx.Client, gateway: RunningGateway, session_id: str, megabytes: int
) -> None:
    run(http, session_id, "kept = 'yes'")
    started = time.monotonic()
    result, size = execute_raw(http, session_id, f"raise ValueError('x' * ({megabytes} << 20))", timeout=5)
    elapsed = time.monotonic() - started
    done = done_event(result)
    # an exception is an ordinary error, however long its text
    assert done["status"] == "error" and done["state_lost"] is False, (done["status"], done["reason"][:300])
    print(f"answered in {elapsed:.2f} s")  # within its 5 s timeout: else it would be `timeout`
    assert_bounded(gateway, result, size)
    assert stdout(run(http, session_id, "print(kept)")) == "yes\n"
    assert_output_still_flows(http, session_id)


def test_huge_display_metadata_is_bounded(http: httpx.Client, gateway: RunningGateway, session_id: str) -> None:
    # the cap must count everything an event carries, not only its MIME data
    code = (
        "from IPython.display import display\n"
        "for i in range(3):\n"
        "    display({'text/plain': str(i)}, metadata={'padding': 'm' * (4 << 20)}, raw=True)\n"
    )
    result, size = execute_raw(http, session_id, code)
    assert result["status"] == "ok", done_event(result)
    assert_bounded(gateway, result, size)
    assert_output_still_flows(http, session_id)


# A lone surrogate (a code point UTF-8 cannot encode) in each kind of output:
# the kernel's packer used to fail on it, losing the cell's whole stdout (or its
# error, or raising into the cell for a display). Now it arrives as U+FFFD and
# the rest of the cell's output is intact, live, in the history and in the notebook.
SURROGATES = {
    "stdout": (
        "print('ok'); print('\\ud800'); print('after')",
        "ok",
        [("stream", "stdout", "ok\n\ufffd\nafter\n")],
    ),
    "stdout-escaped-byte": (
        "print('ok'); print('\\udcff'); print('after')",
        "ok",
        [("stream", "stdout", "ok\n\ufffd\nafter\n")],
    ),
    "stderr": (
        "import sys\nprint('out', flush=True)\nsys.stderr.write('e\\ud800\\n')",
        "ok",
        [("stream", "stdout", "out\n"), ("stream", "stderr", "e\ufffd\n")],
    ),
    "display": (
        "from IPython.display import display\ndisplay({'text/plain': 'd\\ud800'}, raw=True)\nprint('after')",
        "ok",
        [("display", "text/plain", "d\ufffd"), ("stream", "stdout", "after\n")],
    ),
    "exception": (
        "print('before')\nraise ValueError('bad \\ud800 value')",
        "error",
        [("stream", "stdout", "before\n"), ("error", "ValueError", "bad \ufffd value")],
    ),
}


def _outputs(events: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(kind, name, text) of each output event, streams merged by name."""
    out: list[tuple[str, str, str]] = []
    for e in events:
        if e["type"] == "stream":
            if out and out[-1][:2] == ("stream", e["name"]):
                out[-1] = ("stream", e["name"], out[-1][2] + e["text"])
            else:
                out.append(("stream", e["name"], e["text"]))
        elif e["type"] == "display":
            out.append(("display", "text/plain", e["data"]["text/plain"]))
        elif e["type"] == "error":
            out.append(("error", e["ename"], e["evalue"]))
    return out


def _notebook_outputs(cell: dict[str, Any]) -> list[tuple[str, str, str]]:
    out = []
    for o in cell["outputs"]:
        if o["output_type"] == "stream":
            out.append(("stream", o["name"], "".join(o["text"]) if isinstance(o["text"], list) else o["text"]))
        elif o["output_type"] == "display_data":
            text = o["data"]["text/plain"]
            out.append(("display", "text/plain", "".join(text) if isinstance(text, list) else text))
        elif o["output_type"] == "error":
            out.append(("error", o["ename"], o["evalue"]))
    return out


@pytest.mark.parametrize("kind", list(SURROGATES))
def test_a_lone_surrogate_arrives_replaced_and_loses_nothing(http: httpx.Client, session_id: str, kind: str) -> None:
    code, status, expected = SURROGATES[kind]
    resp = http.post(f"/v1/sessions/{session_id}/execute", json={"code": code})
    assert resp.status_code == 200, resp.text[:500]
    resp.content.decode("utf-8")  # strict: valid UTF-8 all the way
    result = resp.json()
    done = done_event(result)
    assert done["status"] == status and done["state_lost"] is False, done
    assert _outputs(result["events"]) == expected
    if status == "error":
        (error,) = [e for e in result["events"] if e["type"] == "error"]
        assert done["reason"] == "ValueError: bad \ufffd value"
        assert error["traceback_text"][-1].endswith("ValueError: bad \ufffd value"), error["traceback_text"][-1]
    else:
        assert done["reason"] is None, done

    history = http.get(f"/v1/sessions/{session_id}/history")
    assert history.status_code == 200, history.text[:500]
    (stored,) = [x for x in history.json()["executions"] if x["execution_id"] == result["execution_id"]]
    assert stored["status"] == status and _outputs(stored["events"]) == expected

    notebook = http.get(f"/v1/sessions/{session_id}/notebook")
    assert notebook.status_code == 200, notebook.text[:500]
    notebook.content.decode("utf-8")
    (cell,) = [c for c in notebook.json()["cells"] if c["cell_type"] == "code"]
    assert _notebook_outputs(cell) == expected
    assert_output_still_flows(http, session_id)


def test_surrogates_a_kernel_sends_escaped_are_replaced(http: httpx.Client, session_id: str) -> None:
    # The kernel is not trusted: code that swaps its packer for one writing
    # \uXXXX escapes carries lone surrogates to the gateway intact, also in the
    # reply (the done's reason) and in an artifact's name (a file named b'\xff').
    swap = (
        "import json\nfrom jupyter_client.session import json_default\n"
        "get_ipython().kernel.session.pack = lambda o: json.dumps(o, default=json_default).encode('ascii')\n"
    )
    assert run(http, session_id, swap)["status"] == "ok"
    code = (
        "from IPython.display import display\n"
        "print('ok'); print('\\ud800'); print('after')\n"
        "display({'text/plain': 'd\\ud800'}, metadata={'k\\udfff': ['v\\ud800']}, raw=True)\n"
        "open(b'\\xff.txt', 'w').write('x')\n"
        "raise ValueError('bad \\ud800 value')"
    )
    resp = http.post(f"/v1/sessions/{session_id}/execute", json={"code": code, "timeout": 30})
    assert resp.status_code == 200, resp.text[:500]
    resp.content.decode("utf-8")
    result = resp.json()
    done = done_event(result)
    assert done["status"] == "error" and done["reason"] == "ValueError: bad \ufffd value", done
    assert _outputs(result["events"]) == [
        ("stream", "stdout", "ok\n\ufffd\nafter\n"),
        ("display", "text/plain", "d\ufffd"),
        ("error", "ValueError", "bad \ufffd value"),
    ]
    (display,) = [e for e in result["events"] if e["type"] == "display"]
    assert display["metadata"] == {"k\ufffd": ["v\ufffd"]}
    assert [a["path"] for a in done["artifacts"]] == ["\ufffd.txt"]
    history = http.get(f"/v1/sessions/{session_id}/history")
    assert history.status_code == 200
    (stored,) = [x for x in history.json()["executions"] if x["execution_id"] == result["execution_id"]]
    assert stored["reason"] == "ValueError: bad \ufffd value" and _outputs(stored["events"]) == _outputs(
        result["events"]
    )
    assert http.get(f"/v1/sessions/{session_id}/notebook").status_code == 200
    assert_output_still_flows(http, session_id)
