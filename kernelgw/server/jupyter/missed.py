"""What a returning Jupyter client missed, from the session's stored cells.

Jupyter clients send no last-seen sequence when they reconnect; they send the
same ``session_id`` (JupyterLab, jupyter_server's gateway client). So the
policy is per cell, not per sequence: each cell a client sends is stored with
that ``session_id``, its request's header, and whether its answer (reply and
final idle) went to an open connection of the client (`runtime.recorder.ClientOrigin`).
A client that connects with a ``session_id`` is sent, for each of its cells
that ended without the answer reaching it, what the cell produced (rebuilt
from the stored events, with the request's header as parent), its
``execute_reply`` and a ``status: idle``, oldest first; the cells are then
marked answered, so they are sent once.

That covers a gateway restart (SIGTERM with ``on_shutdown=keep``, or a crash):
the cells that ended while the client was away, and the cell the gateway's
stop cut off (stored as ``dead`` with its output up to the last checkpoint).
After a stop that kept the kernel, the next gateway follows that cell to its
end (`kernelgw.runtime.execution_queue.ExecutionQueue.follow`), so what the
client is sent is its record as it is when the client returns: still ``dead``
with the interim reason while the cell runs (the kernel's own messages for it
then come live on the client's sockets), its real status with its later output
(stored as ``late``) once it ended followed, or ``dead`` with the reason that
its end was not seen when it ended while no gateway was connected.
Within one gateway process a client that comes back in time gets its cells
from memory instead (`cells.rejoin`), including those still running.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kernelgw.errors import KernelGWError
from kernelgw.runtime.session import KernelSession
from kernelgw.server.jupyter import caps
from kernelgw.server.jupyter.cells import CellOwner, Message, to_messages
from kernelgw.storage import Store
from kernelgw.storage.records import ExecutionRecord

log = logging.getLogger(__name__)

GATEWAY_ERROR = "KernelGatewayError"


def stored_messages(record: ExecutionRecord) -> list[Message]:
    """A stored cell as its client would have seen it: busy, its output (its
    ``late`` output too, unwrapped, where it was stored), its ``execute_reply``
    (the record's status), idle (parents: the request's header)."""
    parent = record.client_header or {}
    out: list[Message] = [("iopub", caps.gateway_message("status", parent, {"execution_state": "busy"}))]
    error: dict[str, Any] | None = None
    try:
        events = json.loads(record.events_json)
    except ValueError:
        events = []
    for event in events if isinstance(events, list) else ():
        if isinstance(event, dict) and event.get("type") == "late":
            # output after the cell's recorded end is the cell's, in the order stored:
            # a followed cell's output after its interim end, an error after a forged one
            event = event.get("event")
        if not isinstance(event, dict) or event.get("type") == "status":
            continue  # busy and idle are this replay's own
        try:
            messages = to_messages(event, parent)
        except (KeyError, TypeError):
            continue
        if event.get("type") == "error":
            error = {"ename": event["ename"], "evalue": event["evalue"], "traceback": event["traceback"]}
        out.extend(messages)
    count = record.execution_count
    reply: dict[str, Any]
    if record.status == "ok":
        reply = {"status": "ok", "execution_count": count, "user_expressions": {}, "payload": []}
    else:
        if error is None or record.status not in ("error", "interrupted"):
            reason = record.reason or f"the cell ended {record.status}"
            note = {"ename": GATEWAY_ERROR, "evalue": reason, "traceback": [f"{GATEWAY_ERROR}: {reason}"]}
            out.append(("iopub", caps.gateway_message("error", parent, note)))
            error = error or note
        reply = {"status": "error", "execution_count": count, **error}
    out.append(("shell", caps.gateway_message("execute_reply", parent, reply)))
    out.append(("iopub", caps.gateway_message("status", parent, {"execution_state": "idle"})))
    return out


async def replay_stored(store: Store, session: KernelSession, client_session: str, owner: CellOwner) -> int:
    """Send ``owner`` the answers its client's stored cells never delivered; the
    number of cells sent. A store that cannot answer is logged, not fatal."""
    try:
        records = await store.unanswered_client_cells(session.id, client_session)
    except KernelGWError as exc:
        log.warning("session %s: the cells a returning client missed could not be read: %s", session.id, exc.message)
        return 0
    except Exception:  # the database's own errors: the client connects all the same
        log.exception("session %s: the cells a returning client missed could not be read", session.id)
        return 0
    sent = [r for r in records if r.client_header is not None]
    for record in sent:
        for channel, msg in stored_messages(record):
            owner.send_kernel(channel, msg)
    store.client_answered(session.id, [r.execution_id for r in sent])
    return len(sent)
