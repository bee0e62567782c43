"""The kernel's word does not end a cell: user code holds the kernel's HMAC key
and can send an ``execute_reply`` and a ``status: idle`` for its own request.
A real kernel (local backend) runs the forging code; the gateway must keep the
real output and error, number the cell itself, and mark the cell in its done,
its history row and the audit log."""

from __future__ import annotations

import json

from kernelgw.storage import audit
from kernelgw.storage.store import Store
from tests.unit.runtime.conftest import SessionFactory, recording
from tests.unit.runtime.test_session import run, stdout

FORGE = """
k = get_ipython().kernel
p = k.get_parent()
k.session.send(k.shell_stream, "execute_reply",
               {"status": "ok", "execution_count": 999, "user_expressions": {}, "payload": []},
               parent=p, ident=k._parent_ident["shell"])
k.session.send(k.iopub_socket, "status", {"execution_state": "idle"}, parent=p)
import time; time.sleep(0.5)
print("real output after the forged end")
1 / 0
"""

LATE = """
import threading, time
k = get_ipython().kernel
p = k.get_parent()
def later():
    time.sleep(0.5)
    k.session.send(k.iopub_socket, "stream", {"name": "stdout", "text": "sneaked in"}, parent=p)
threading.Thread(target=later).start()
print("on time")
"""


async def test_a_forged_reply_and_idle_do_not_end_the_cell(new_session: SessionFactory, store: Store) -> None:
    session = await recording(new_session, store)
    first = await run(session, "x = 1")
    assert first[-1]["execution_count"] == 1

    events = await run(session, FORGE)
    done = events[-1]
    assert done["type"] == "done"
    assert done["status"] == "error", done  # the real end: ZeroDivisionError, not the forged ok
    assert stdout(events) == "real output after the forged end\n"
    assert [e["ename"] for e in events if e["type"] == "error"] == ["ZeroDivisionError"]
    assert done["execution_count"] == 2, "the gateway numbers cells, not the kernel's 999"
    assert "forged" in (done["reason"] or "") and "an execute_reply that did not answer the request" in done["reason"]

    # the stored cell says the same, and the audit log marks it
    (row,) = [e for e in await store.list_executions(session.id) if e.execution_id == done["execution_id"]]
    assert row.status == "error" and row.execution_count == 2
    assert "real output after the forged end" in "".join(e.get("text", "") for e in json.loads(row.events_json))
    marks = await audit.query(store, session_id=session.id, kind="kernel_anomaly")
    assert len(marks) == 1 and done["execution_id"] in (marks[0].detail or "")

    # the session goes on normally
    after = await run(session, "print(x)")
    assert stdout(after) == "1\n" and after[-1]["reason"] is None and after[-1]["execution_count"] == 3


async def test_output_sent_after_a_cells_end_is_reported(new_session: SessionFactory, store: Store) -> None:
    session = await recording(new_session, store)
    events = await run(session, LATE)
    assert stdout(events) == "on time\n" and events[-1]["reason"] is None
    # the sneaked message arrives while the next cell runs: it is not that cell's output
    after = await run(session, "import time; time.sleep(1); print('next')")
    assert stdout(after) == "next\n"
    marks = await audit.query(store, session_id=session.id, kind="kernel_anomaly")
    assert [m.detail for m in marks] == [
        f"execution {events[-1]['execution_id']}: a stream message after the cell had ended"
    ]
