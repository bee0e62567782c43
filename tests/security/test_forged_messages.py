"""Threat: user code speaks for its kernel. It holds the kernel's HMAC key, so it
can send signed ``execute_reply`` and ``status`` messages for its own request or
for a cell that already ended. The cell's status, count, output and end must
stay the gateway's: what the code printed after a forged end is kept, the cell
is numbered by the gateway, the forgery is named in the done and the session
carries on; a message sent for an ended cell never lands in the next one.

Code that also reads its request's nonce can end its cell early as a REST
caller sees it; what it prints and raises after that is still kept: in the
cell's history (status ``error``), notebook and audit, and sent to subscribers
as ``late`` events."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.integration.conftest import RunningGateway
from tests.security.conftest import run, stdout, until_done, ws_connect
from tests.security.test_forgery import audit_rows, notebook_cells

pytestmark = pytest.mark.integration

SEND = """
k = get_ipython().kernel
p = k.get_parent()
def forge(channel, msg_type, content):
    if channel == "shell":
        k.session.send(k.shell_stream, msg_type, content, parent=p, ident=k._parent_ident["shell"])
    else:
        k.session.send(k.iopub_socket, msg_type, content, parent=p)
"""

FORGED_END = (
    SEND
    + """
forge("shell", "execute_reply", {"status": "ok", "execution_count": 999, "user_expressions": {}, "payload": []})
forge("iopub", "status", {"execution_state": "idle"})
import time; time.sleep(1)
print("real output after the forged end")
raise ValueError("the real error")
"""
)


def history_cell(http: httpx.Client, sid: str, execution_id: str) -> dict[str, object]:
    cells = http.get(f"/v1/sessions/{sid}/history").json()["executions"]
    (cell,) = [c for c in cells if c["execution_id"] == execution_id]
    return dict(cell)


def test_a_forged_reply_and_idle_do_not_end_the_cell(http: httpx.Client, session_id: str) -> None:
    assert run(http, session_id, "x = 1")["execution_count"] == 1
    result = run(http, session_id, FORGED_END)
    done = result["events"][-1]
    assert result["status"] == "error", done
    assert stdout(result) == "real output after the forged end\n"
    assert [e["evalue"] for e in result["events"] if e["type"] == "error"] == ["the real error"]
    assert result["execution_count"] == 2
    assert "forged" in done["reason"]
    cell = history_cell(http, session_id, result["execution_id"])
    assert cell["status"] == "error" and cell["execution_count"] == 2
    after = run(http, session_id, "print(x)")
    assert stdout(after) == "1\n" and after["execution_count"] == 3 and after["events"][-1]["reason"] is None


def test_a_forged_idle_alone_does_not_end_the_cell(http: httpx.Client, session_id: str) -> None:
    code = (
        SEND + 'forge("iopub", "status", {"execution_state": "idle"})\nimport time; time.sleep(1)\nprint("still here")'
    )
    result = run(http, session_id, code)
    assert result["status"] == "ok" and stdout(result) == "still here\n"
    assert "more than one status: idle" in result["events"][-1]["reason"]


def test_output_sent_for_an_ended_cell_does_not_land_in_the_next(http: httpx.Client, session_id: str) -> None:
    code = (
        SEND
        + """
import threading, time
def later():
    time.sleep(0.5)
    forge("iopub", "stream", {"name": "stdout", "text": "sneaked into the next cell"})
    forge("shell", "execute_reply", {"status": "ok", "execution_count": 999, "user_expressions": {}, "payload": []})
threading.Thread(target=later).start()
print("on time")
"""
    )
    first = run(http, session_id, code)
    assert stdout(first) == "on time\n" and first["status"] == "ok"
    second = run(http, session_id, "import time; time.sleep(1.5); print('next')")
    assert stdout(second) == "next\n" and second["status"] == "ok" and second["events"][-1]["reason"] is None
    assert stdout(run(http, session_id, "print('third')")) == "third\n"


FORGED_END_WITH_NONCE = (
    SEND
    + """
import os, time
nonce = {key: {"status": "ok", "data": {"text/plain": expr}, "metadata": {}}
         for key, expr in p["content"]["user_expressions"].items() if key == "kernelgw_end"}
assert nonce, "the request carries no end nonce"
forge("shell", "execute_reply", {"status": "ok", "execution_count": 999, "user_expressions": nonce, "payload": []})
forge("iopub", "status", {"execution_state": "idle"})
deadline = time.monotonic() + 120
while not os.path.exists("late-go") and time.monotonic() < deadline:
    time.sleep(0.02)  # until the test saw the forged end's done
print("printed after the forged end")
raise ValueError("raised after the forged end")
"""
)


def late_until_error(ws: Any, execution_id: str) -> list[dict[str, Any]]:
    """The ``late`` events of ``execution_id`` until its late error."""
    late = []
    while True:
        event = json.loads(ws.recv(timeout=120))
        if event["type"] == "late" and event["execution_id"] == execution_id:
            late.append(event)
            if event["event"]["type"] == "error":
                return late


def test_output_after_an_end_forged_with_the_nonce_is_kept_and_marked_late(
    gateway: RunningGateway, http: httpx.Client, session_id: str
) -> None:
    eid = f"forged-{uuid.uuid4().hex[:8]}"
    with ws_connect(gateway, session_id, max_size=None) as ws:
        ws.send(json.dumps({"type": "execute", "code": FORGED_END_WITH_NONCE, "execution_id": eid}))
        events = until_done(ws, eid)
        done = events[-1]
        # the forgery ended the cell early, as a REST caller sees it: nothing after it came yet
        assert done["status"] == "ok" and not [e for e in events if e["type"] in ("stream", "error")], events
        resp = http.put(f"/v1/sessions/{session_id}/files/late-go", content=b"go")
        assert resp.status_code == 201, resp.text
        late = late_until_error(ws, eid)
    inner = [e["event"] for e in late]
    assert all(e["seq"] > done["seq"] for e in late)
    assert [e["text"] for e in inner if e["type"] == "stream"] == ["printed after the forged end\n"]
    assert [(e["ename"], e["evalue"]) for e in inner if e["type"] == "error"] == [
        ("ValueError", "raised after the forged end")
    ]
    assert all(e["execution_id"] == eid for e in inner)

    cell = history_cell(http, session_id, eid)
    assert cell["status"] == "error", cell
    assert "after this execution had ended" in str(cell["reason"])
    stored = cell["events"]
    assert isinstance(stored, list)
    assert [e["type"] for e in stored][-len(late) - 1 :] == ["done", *["late"] * len(late)]
    assert stored[-len(late) :] == late  # the very events sent: stored before they were announced

    (nb_cell,) = [c for c in notebook_cells(http, session_id) if c["metadata"]["kernelgw"]["execution_id"] == eid]
    assert nb_cell["metadata"]["kernelgw"]["status"] == "error"
    text = "".join(
        "".join(o["text"]) if isinstance(o["text"], list) else o["text"]
        for o in nb_cell["outputs"]
        if o["output_type"] == "stream"
    )
    assert "printed after the forged end\n" in text
    assert [o["evalue"] for o in nb_cell["outputs"] if o["output_type"] == "error"] == ["raised after the forged end"]

    rows = audit_rows(gateway, session_id, "execution_late_output")  # one per batch stored
    assert {r["execution_id"] for r in rows} == {eid}
    assert [(r["status"], r["error_name"]) for r in rows][-1] == ("error", "ValueError"), rows

    after = run(http, session_id, "print('next')")
    assert stdout(after) == "next\n" and after["status"] == "ok"
    assert not [e for e in after["events"] if e["type"] == "error"]


FORGED_END_THEN_RAISE = (
    SEND
    + """
nonce = {key: {"status": "ok", "data": {"text/plain": expr}, "metadata": {}}
         for key, expr in p["content"]["user_expressions"].items() if key == "kernelgw_end"}
forge("shell", "execute_reply", {"status": "ok", "execution_count": 999, "user_expressions": nonce, "payload": []})
forge("iopub", "status", {"execution_state": "idle"})
print("printed right after the forged end")
raise ValueError("raised right after the forged end")
"""
)


def events_of(cell: dict[str, Any]) -> list[dict[str, Any]]:
    events = cell["events"]
    assert isinstance(events, list)
    return events


def outputs_of(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """A stored cell's output events, late ones unwrapped."""
    return [
        e["event"] if e["type"] == "late" else e for e in events_of(cell) if e["type"] in ("stream", "error", "late")
    ]


def test_an_error_right_after_an_end_forged_with_the_nonce_is_recorded_whatever_the_timing(
    http: httpx.Client, session_id: str
) -> None:
    """Whether the output comes before the gateway decided the end (then the error
    follows the forged reply) or after it (late), the record is the same."""
    result = run(http, session_id, FORGED_END_THEN_RAISE)
    eid = result["execution_id"]
    deadline = time.monotonic() + 60
    while True:  # late output is stored after the REST answer: wait for it
        cell = history_cell(http, session_id, eid)
        if any(e["type"] == "error" for e in outputs_of(cell)) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    outputs = outputs_of(cell)
    print(f"answered {result['status']}; stored as {[e['type'] for e in events_of(cell)]}; {result['events'][-1]}")
    assert [e["text"] for e in outputs if e["type"] == "stream"] == ["printed right after the forged end\n"], cell
    assert [e["evalue"] for e in outputs if e["type"] == "error"] == ["raised right after the forged end"]
    assert cell["status"] == "error", cell
    after = run(http, session_id, "print('next')")
    assert stdout(after) == "next\n" and after["status"] == "ok"
