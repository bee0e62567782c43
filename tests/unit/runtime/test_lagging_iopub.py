"""A cell ends at its reply and an idle after it; an idle that never comes is
given up on once iopub has been quiet for ``IOPUB_QUIET_S`` after the reply.
Iopub may lag well behind the reply (ipykernel's iopub thread in a loaded
container; the shim's fences hold a Deno cell's idle up to 2 s): such a cell
must keep its output, not be ended on the reply with the output still on its
way. A real kernel (local backend) delays or drops its own messages."""

from __future__ import annotations

from kernelgw.runtime import execution_queue
from kernelgw.storage import audit
from kernelgw.storage.store import Store
from tests.unit.runtime.conftest import SessionFactory, recording
from tests.unit.runtime.test_session import run, stdout

LAG_S = 2.5
"""Longer than the quiet second that once ended such a cell, well under ``IOPUB_QUIET_S``."""

# the cell's stream and idle go out LAG_S after it ends (DROP: the idle never does);
# its reply on the shell is not held
HOLD = """
import queue, threading, time
k = get_ipython().kernel
cell = k.get_parent()["header"]["msg_id"]
send = k.session.send
held = queue.Queue()
def later():
    while True:
        due, args, kwargs = held.get()
        time.sleep(max(0.0, due - time.monotonic()))
        send(*args, **kwargs)
threading.Thread(target=later, daemon=True).start()
def holding(stream, msg_or_type, content=None, parent=None, *args, **kwargs):
    header = parent.get("header", parent) if isinstance(parent, dict) else {}
    if msg_or_type in ("stream", "status") and header.get("msg_id") == cell:
        if DROP and msg_or_type == "status":
            return None
        held.put((time.monotonic() + LAG_S, (stream, msg_or_type, content, parent, *args), kwargs))
        return None
    return send(stream, msg_or_type, content, parent, *args, **kwargs)
k.session.send = holding
print("on its way")
"""


def holding(*, drop: bool) -> str:
    return f"DROP = {drop}\nLAG_S = {LAG_S}\n" + HOLD


async def test_output_that_lags_behind_the_reply_is_the_cells(new_session: SessionFactory, store: Store) -> None:
    assert LAG_S < execution_queue.IOPUB_QUIET_S
    session = await recording(new_session, store)
    events = await run(session, holding(drop=False))
    assert stdout(events) == "on its way\n", events
    assert events[-1]["status"] == "ok" and events[-1]["reason"] is None, events[-1]
    after = await run(session, "print('next')")
    assert stdout(after) == "next\n" and after[-1]["reason"] is None
    assert await audit.query(store, session_id=session.id, kind="kernel_anomaly") == []


async def test_an_idle_that_never_comes_ends_the_cell_on_its_reply_and_says_so(
    new_session: SessionFactory, store: Store
) -> None:
    session = await recording(new_session, store)
    events = await run(session, holding(drop=True))
    assert stdout(events) == "on its way\n", events
    done = events[-1]
    assert done["status"] == "ok" and "end-of-cell status message was lost" in (done["reason"] or ""), done
    # the session goes on
    after = await run(session, "print('next')")
    assert stdout(after) == "next\n" and after[-1]["reason"] is None
