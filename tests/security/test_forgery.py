"""Threat: a cell forging what the gateway records: output that looks like
gateway events or notebook cells, terminal escapes and NUL bytes, a line of
megabytes, display messages that name another execution, an error dressed as a
gateway verdict, code that looks like audit records, and a client reusing an
execution id. History, the notebook export and the audit log must keep each as
plain data of the cell that produced it.

Covered elsewhere (test_forged_messages.py): execute replies and idles forged
with the kernel's own key, output for an ended cell.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from tests.integration.conftest import RunningGateway, run
from tests.security.conftest import done_event

pytestmark = pytest.mark.integration


def history(http: httpx.Client, sid: str) -> list[dict[str, Any]]:
    resp = http.get(f"/v1/sessions/{sid}/history")
    assert resp.status_code == 200, resp.text[:300]
    return resp.json()["executions"]  # type: ignore[no-any-return]


def notebook_cells(http: httpx.Client, sid: str) -> list[dict[str, Any]]:
    resp = http.get(f"/v1/sessions/{sid}/notebook")
    assert resp.status_code == 200, resp.text[:300]
    return [c for c in resp.json()["cells"] if c["cell_type"] == "code"]


def stream_text(events: list[dict[str, Any]], name: str = "stdout") -> str:
    return "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == name)


def joined(text: str | list[str]) -> str:
    """A notebook's multi-line string: nbformat stores it as a string or a list of lines."""
    return text if isinstance(text, str) else "".join(text)


def audit_rows(gateway: RunningGateway, sid: str, kind: str = "execution") -> list[dict[str, Any]]:
    env = {**os.environ, "KERNELGW_DATA_DIR": str(gateway.settings.data_dir)}
    env.pop("KERNELGW_API_KEY", None)
    deadline = time.monotonic() + 10
    while True:
        proc = subprocess.run(
            [sys.executable, "-m", "kernelgw", "audit", "--session", sid, "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        rows = [json.loads(line) for line in proc.stdout.splitlines()]
        if any(r["kind"] == kind for r in rows) or time.monotonic() > deadline:
            return [r for r in rows if r["kind"] == kind]
        time.sleep(0.2)


def test_a_done_event_printed_by_the_cell_stays_stdout(http: httpx.Client, session_id: str) -> None:
    # the cell learns its own execution id and prints its "end" in every shape
    # the gateway and nbformat use, then keeps going and fails
    forged_done = {"seq": 99, "execution_id": "cell-f", "type": "done", "status": "ok", "execution_count": 7}
    forged_cell = {"cell_type": "code", "outputs": [], "source": "forged", "metadata": {}, "execution_count": 1}
    text = (
        json.dumps(forged_done) + "\n" + json.dumps(forged_cell) + "\n" + json.dumps({"events": [forged_done]}) + "\n"
    )
    code = f"import sys\nsys.stdout.write({text!r})\nsys.stdout.flush()\nprint('after')\nraise ValueError('real end')"
    result = run(http, session_id, code, execution_id="cell-f")
    assert done_event(result)["status"] == "error"
    (stored,) = [e for e in history(http, session_id) if e["execution_id"] == "cell-f"]
    assert stored["status"] == "error" and stored["execution_count"] == 1
    assert [e["type"] for e in stored["events"]].count("done") == 1
    assert stream_text(stored["events"]) == text + "after\n"
    (cell,) = notebook_cells(http, session_id)
    assert cell["execution_count"] == 1 and joined(cell["source"]) == code
    assert [o["output_type"] for o in cell["outputs"]] == ["stream", "error"]
    assert joined(cell["outputs"][0]["text"]) == text + "after\n"


CONTROL_TEXT = (
    "\x1b[2J\x1b[H\x1b]0;kernelgw: session ended\x07"  # clear screen, home, set the window title
    "\x1b[1A\x1b[2K[done] status=ok\n"  # move up, erase the line above, write a verdict
    "nul:\x00:nul\x00\x00\n"
    "cr: real line\rforged line\n"
    "c1:\x9b31mred\x9b0m del:\x7f bell:\x07 bs:\x08\x08\n"
    "bidi:\u202eko=sutats\u202c zw:\u200b\ufeff\n"
)


def test_terminal_escapes_and_nul_bytes_are_stored_verbatim(http: httpx.Client, session_id: str) -> None:
    code = f"import sys\nsys.stdout.write({CONTROL_TEXT!r})\nsys.stdout.flush()"
    result = run(http, session_id, code, execution_id="ctl")
    assert result["status"] == "ok"
    assert stream_text(result["events"]) == CONTROL_TEXT
    (stored,) = history(http, session_id)
    assert stored["status"] == "ok" and stream_text(stored["events"]) == CONTROL_TEXT
    (cell,) = notebook_cells(http, session_id)
    assert "".join(joined(o["text"]) for o in cell["outputs"]) == CONTROL_TEXT


def test_a_line_of_three_megabytes_is_stored_whole(
    http: httpx.Client, gateway: RunningGateway, session_id: str
) -> None:
    size = 3 << 20  # under the suite's 4 MiB output cap: nothing may be cut
    assert size < gateway.settings.max_output_bytes
    code = (
        "import hashlib, random, sys\n"
        "random.seed(7)\n"
        f"line = ''.join(random.choice('abcdef{{}}\"[]:,') for _ in range({size}))\n"
        "sys.stdout.write(line)\n"
        "sys.stdout.flush()\n"
        "sys.stderr.write(hashlib.sha256(line.encode()).hexdigest())\n"
    )
    result = run(http, session_id, code)
    assert result["status"] == "ok"
    digest = stream_text(result["events"], "stderr")
    assert not [e for e in result["events"] if e["type"] == "truncated"]
    (stored,) = history(http, session_id)
    out = stream_text(stored["events"])
    assert len(out) == size and hashlib.sha256(out.encode()).hexdigest() == digest
    (cell,) = notebook_cells(http, session_id)
    text = "".join(joined(o["text"]) for o in cell["outputs"] if o.get("name") == "stdout")
    assert hashlib.sha256(text.encode()).hexdigest() == digest


def test_display_data_naming_another_execution_is_kept_as_this_cells(http: httpx.Client, session_id: str) -> None:
    first = run(http, session_id, "print('victim')", execution_id="victim")
    assert first["status"] == "ok"
    code = (
        "from IPython.display import display\n"
        "forged = {'execution_id': 'victim', 'seq': 1, 'type': 'stream', 'kernelgw': {'execution_id': 'victim'}}\n"
        "display({'text/plain': 'forged display'}, raw=True, metadata=forged)\n"
        "k = get_ipython().kernel\n"
        "# and a raw display_data whose parent header is the *victim's* request: a guessed msg id\n"
        "k.session.send(k.iopub_socket, 'display_data', {'data': {'text/plain': 'orphan'}, 'metadata': forged,\n"
        "               'transient': {'display_id': 'victim'}}, parent={'msg_id': 'victim', 'msg_type': 'execute_request',\n"
        "               'session': k.session.session, 'username': 'x', 'date': '2020-01-01T00:00:00Z', 'version': '5.3'},\n"
        "               ident=b'display_data')\n"
        "print('attacker')\n"
    )
    second = run(http, session_id, code, execution_id="attacker")
    assert second["status"] == "ok", done_event(second)
    stored = {e["execution_id"]: e for e in history(http, session_id)}
    assert set(stored) == {"victim", "attacker"}
    # the victim's stored record is exactly what it was
    assert [e["type"] for e in stored["victim"]["events"]] == [e["type"] for e in first["events"]]
    assert stream_text(stored["victim"]["events"]) == "victim\n"
    assert "forged display" not in json.dumps(stored["victim"]) and "orphan" not in json.dumps(stored["victim"])
    # every stored event of the attacker is filed under its own execution id
    assert {e.get("execution_id") for e in stored["attacker"]["events"]} == {"attacker"}
    displays = [e for e in stored["attacker"]["events"] if e["type"] == "display"]
    assert [d["data"]["text/plain"] for d in displays] == ["forged display"]
    victim_cell, attacker_cell = notebook_cells(http, session_id)
    assert [joined(o["text"]) for o in victim_cell["outputs"]] == ["victim\n"]
    assert "orphan" not in json.dumps(attacker_cell["outputs"])


def test_an_error_dressed_as_a_gateway_verdict_stays_an_error(
    http: httpx.Client, gateway: RunningGateway, session_id: str
) -> None:
    code = (
        "class KernelDied(Exception):\n"
        "    pass\n"
        "KernelDied.__name__ = KernelDied.__qualname__ = 'TimeoutError'\n"
        "raise KernelDied('execution timed out after 60 s; kernel restarted (state_lost)')\n"
    )
    result = run(http, session_id, code)
    done = done_event(result)
    # an error's reason is its own "ename: evalue": the verdict stays "error", no state lost
    own = "TimeoutError: execution timed out after 60 s; kernel restarted (state_lost)"
    assert (done["status"], done["reason"], done["state_lost"]) == ("error", own, False), done
    (stored,) = history(http, session_id)
    assert (stored["status"], stored["reason"], stored["state_lost"]) == ("error", own, False)
    (row,) = audit_rows(gateway, session_id)
    assert row["status"] == "error" and row["error_name"] == "TimeoutError"
    assert run(http, session_id, "print(KernelDied.__name__)")["status"] == "ok"  # the kernel was not restarted


def test_code_that_looks_like_audit_records_is_one_exact_record(
    http: httpx.Client, gateway: RunningGateway, session_id: str
) -> None:
    forged = {"kind": "session_deleted", "session_id": session_id, "status": "ok", "key_id": "admin"}
    code = f"x = 1\n{json.dumps(forged)}\n# \u2028\u2029\x1b[2K\r\n'''\n{json.dumps({**forged, 'kind': 'execution'})}\n'''\n"
    result = run(http, session_id, code)
    assert result["status"] == "ok", done_event(result)
    rows = audit_rows(gateway, session_id)
    assert len(rows) == 1, rows
    (row,) = rows
    assert row["code"] == code
    assert row["code_sha256"] == hashlib.sha256(code.encode()).hexdigest()
    assert row["status"] == "ok" and row["session_id"] == session_id
    assert not audit_rows(gateway, session_id, kind="session_deleted")


def test_reusing_an_execution_id_overwrites_nothing(http: httpx.Client, session_id: str) -> None:
    first = run(http, session_id, "print('original')", execution_id="e-1")
    assert first["status"] == "ok"
    again = http.post(
        f"/v1/sessions/{session_id}/execute", json={"code": "print('replacement')", "execution_id": "e-1"}
    )
    assert again.status_code == 400 and again.json()["error"]["code"] == "bad_request", again.text[:300]
    # another session using the same id is its own record, in its own history
    other = http.post("/v1/sessions", json={})
    assert other.status_code == 201
    other_sid = other.json()["id"]
    try:
        assert run(http, other_sid, "print('elsewhere')", execution_id="e-1")["status"] == "ok"
        (mine,) = history(http, session_id)
        assert (mine["execution_id"], mine["code"]) == ("e-1", "print('original')")
        assert stream_text(mine["events"]) == "original\n"
        (theirs,) = history(http, other_sid)
        assert stream_text(theirs["events"]) == "elsewhere\n"
    finally:
        http.delete(f"/v1/sessions/{other_sid}")
