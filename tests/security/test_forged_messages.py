"""Threat: user code speaks for its kernel. It holds the kernel's HMAC key, so it
can send signed ``execute_reply`` and ``status`` messages for its own request or
for a cell that already ended. The cell's status, count, output and end must
stay the gateway's: what the code printed after a forged end is kept, the cell
is numbered by the gateway, the forgery is named in the done and the session
carries on; a message sent for an ended cell never lands in the next one."""

from __future__ import annotations

import httpx
import pytest

from tests.security.conftest import run, stdout

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
