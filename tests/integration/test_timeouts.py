"""Execution timeouts, interrupts and restarts."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.integration.conftest import RunningGateway, run, stdout
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def receive_until(ws: ClientConnection, match: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict[str, Any]:
    """The first event from ``ws`` that matches (earlier ones are dropped)."""
    while True:
        event: dict[str, Any] = json.loads(ws.recv(timeout=timeout))
        if match(event):
            return event


def test_timeout_interrupts_and_keeps_earlier_variables(http: httpx.Client, session_id: str) -> None:
    run(http, session_id, "kept = 'still here'")
    result = run(http, session_id, "while True:\n    pass", timeout=2)
    done = result["events"][-1]
    assert done["status"] == "timeout"
    assert done["state_lost"] is False
    assert "interrupted" in done["reason"]
    errors = [e for e in result["events"] if e["type"] == "error"]
    assert errors and errors[0]["ename"] == "KeyboardInterrupt"
    assert stdout(run(http, session_id, "print(kept)")) == "still here\n"


def test_cell_swallowing_interrupt_is_restarted_and_reported_as_state_lost(http: httpx.Client, session_id: str) -> None:
    run(http, session_id, "lost = 1")
    code = "while True:\n    try:\n        while True:\n            pass\n    except KeyboardInterrupt:\n        pass\n"
    result = run(http, session_id, code, timeout=2)
    done = result["events"][-1]
    assert done["status"] == "timeout"
    assert done["state_lost"] is True
    assert "restarted" in done["reason"] and "lost" in done["reason"]
    info = http.get(f"/v1/sessions/{session_id}").json()
    assert info["state"] == "idle"
    after = run(http, session_id, "'lost' in dir()")
    assert next(e for e in after["events"] if e["type"] == "result")["data"]["text/plain"] == "False"


def test_interrupt_endpoint_stops_a_running_cell(gateway: RunningGateway, http: httpx.Client, session_id: str) -> None:
    run(http, session_id, "keep = 5")
    with connect(f"{gateway.ws_url}/v1/sessions/{session_id}/ws", open_timeout=30) as ws:
        code = "import time\nprint('sleeping', flush=True)\ntime.sleep(60)"
        ws.send(json.dumps({"type": "execute", "code": code, "execution_id": "sleeper"}))
        # the cell's own output: it is inside the sleep, past the kernel's bookkeeping
        receive_until(ws, lambda e: e["type"] == "stream" and e["execution_id"] == "sleeper")
        assert http.post(f"/v1/sessions/{session_id}/interrupt").json() == {"interrupted": True}
        done = receive_until(ws, lambda e: e["type"] == "done" and e["execution_id"] == "sleeper")
    assert done["status"] == "interrupted"
    assert stdout(run(http, session_id, "print(keep)")) == "5\n"
    # nothing is running now
    assert http.post(f"/v1/sessions/{session_id}/interrupt").json() == {"interrupted": False}


def test_restart_endpoint_gives_a_fresh_kernel(http: httpx.Client, session_id: str) -> None:
    run(http, session_id, "gone = 1")
    resp = http.post(f"/v1/sessions/{session_id}/restart")
    assert resp.status_code == 200
    assert resp.json()["execution_count"] == 0
    after = run(http, session_id, "'gone' in dir()")
    assert next(e for e in after["events"] if e["type"] == "result")["data"]["text/plain"] == "False"


def test_queue_runs_cells_one_at_a_time_in_order(http: httpx.Client, session_id: str) -> None:
    run(http, session_id, "order = []")
    results: dict[int, dict] = {}

    def submit(i: int) -> None:
        results[i] = run(http, session_id, f"import time\ntime.sleep(0.2)\norder.append({i})")

    def accepted() -> int:
        """Cells of this test the gateway has taken: queued or running, or answered."""
        return int(http.get(f"/v1/sessions/{session_id}").json()["queue_length"]) + len(results)

    threads = []
    for i in range(4):
        t = threading.Thread(target=submit, args=(i,))
        t.start()
        threads.append(t)
        wait_until(lambda i=i: accepted() >= i + 1, f"cell {i} to be queued")  # submission order is 0, 1, 2, 3
    for t in threads:
        t.join(timeout=60)
    assert all(r["status"] == "ok" for r in results.values())
    counts = [results[i]["execution_count"] for i in range(4)]
    assert counts == sorted(counts)
    final = run(http, session_id, "order")
    assert next(e for e in final["events"] if e["type"] == "result")["data"]["text/plain"] == "[0, 1, 2, 3]"


def test_kernel_crash_mid_cell_delivers_partial_output_then_dead(http: httpx.Client, session_id: str) -> None:
    code = "import os, time\nprint('before the crash', flush=True)\ntime.sleep(0.5)\nos.kill(os.getpid(), 9)\nprint('never')"
    result = run(http, session_id, code)
    assert stdout(result) == "before the crash\n"
    done = result["events"][-1]
    assert done["status"] == "dead"
    assert "signal 9" in done["reason"] and done["state_lost"] is True
    info = http.get(f"/v1/sessions/{session_id}").json()
    assert info["state"] == "dead" and "signal 9" in info["dead_reason"]
    assert http.post(f"/v1/sessions/{session_id}/restart").json()["state"] == "idle"
    assert stdout(run(http, session_id, "print('back')")) == "back\n"


def test_kernel_exit_is_reported_with_its_code(http: httpx.Client, session_id: str) -> None:
    done = run(http, session_id, "import os\nos._exit(3)")["events"][-1]
    assert done["status"] == "dead"
    assert "exited with code 3" in done["reason"]


def test_restart_while_a_cell_runs_ends_it_as_dead_with_state_lost(http: httpx.Client, session_id: str) -> None:
    results: list[dict] = []
    worker = threading.Thread(target=lambda: results.append(run(http, session_id, "import time\ntime.sleep(60)")))
    worker.start()
    wait_until(lambda: http.get(f"/v1/sessions/{session_id}").json()["state"] == "busy", "the cell to run")
    assert http.post(f"/v1/sessions/{session_id}/restart").status_code == 200
    worker.join(timeout=30)
    done = results[0]["events"][-1]
    assert done["status"] == "dead" and done["state_lost"] is True
    assert "restarted" in done["reason"]
    assert stdout(run(http, session_id, "print('fresh')")) == "fresh\n"
