"""A Jupyter client's comm messages reach the kernel in order with the cell it
sends after them (a slider dragged, then the cell that reads its value), however
the kernel's ROUTER takes them in.

ipykernel 7 reads its shell socket on a thread of its own as messages come, so
a race between two sockets is rare by chance; this test makes it certain. The
kernel's comm handler blocks that thread for a while (a bounded window, not a
measurement), and the client sends, meanwhile, a few updates and then a cell.
They wait in the kernel's ROUTER, which takes one message from each socket in
turn: had the updates gone out on the connection's own socket and the cell on
the session's, the cell would be taken after the first update and read its
value. On the one socket cells go out on (`IN_ORDER_WITH_CELLS`), ZMQ keeps
their order.

Real parts: a real gateway, a Docker kernel, a plain ``websockets`` client
speaking JSON frames as a widget front end does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.integration.conftest import RunningGateway
from tests.integration.test_jupyter_widgets import answered, execute, message, receive_until, run, stdout

pytestmark = pytest.mark.integration

ROUNDS = 3
UPDATES = 3
"""Comm messages a round sends before its cell: more than one, so some wait behind the first."""
BLOCK_S = 1.0
"""How long the kernel's shell thread stops reading: ample for a few messages over loopback.
Too short could only let the test pass without the fix, never fail with it."""
CLIENT = "order"
PROBE = """\
import time
from comm import create_comm

kernel = get_ipython().kernel
assert kernel.shell_channel_thread is not None, "needs ipykernel 7's shell channel thread"
probe_value = None

def _block(seconds):
    probe.send({"blocked": True})  # before the thread stops: the client sends then
    time.sleep(seconds)

def _on_probe(msg):
    global probe_value
    data = msg["content"]["data"]
    if "block" in data:
        kernel.shell_channel_thread.io_loop.add_callback(_block, data["block"])
    else:
        probe_value = data["value"]

probe = create_comm(target_name="kernelgw.order_probe", data={})
probe.on_msg(_on_probe)
"""


@pytest.fixture
def kernel(http: httpx.Client) -> Iterator[str]:
    resp = http.post("/api/kernels", json={"name": "python3"})
    assert resp.status_code == 201, resp.text
    kid = str(resp.json()["id"])
    yield kid
    http.delete(f"/api/kernels/{kid}")


def to_probe(ws: ClientConnection, comm_id: str, data: dict[str, Any]) -> None:
    ws.send(json.dumps(message("comm_msg", {"comm_id": comm_id, "data": data}, CLIENT)))


def blocked(comm_id: str) -> Callable[[list[dict[str, Any]]], bool]:
    """The kernel's shell thread has stopped reading (the probe said so just before)."""

    def check(messages: list[dict[str, Any]]) -> bool:
        return any(
            m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id and m["content"]["data"].get("blocked")
            for m in messages
        )

    return check


def test_a_cell_reads_the_last_value_its_client_sent_before_it(gateway: RunningGateway, kernel: str) -> None:
    url = f"{gateway.ws_url}/api/kernels/{kernel}/channels?session_id={CLIENT}"
    seen: list[str] = []
    sent: list[str] = []
    with connect(url, open_timeout=60) as ws:
        opened = [m for m in run(ws, PROBE, CLIENT) if m["msg_type"] == "comm_open"]
        (comm_id,) = [m["content"]["comm_id"] for m in opened if m["content"]["target_name"] == "kernelgw.order_probe"]
        for round_ in range(ROUNDS):
            to_probe(ws, comm_id, {"block": BLOCK_S})
            receive_until(ws, blocked(comm_id))
            values = [f"{round_}.{update}" for update in range(UPDATES)]
            for value in values:
                to_probe(ws, comm_id, {"value": value})
            read = execute(ws, "print(probe_value)", CLIENT)
            got = receive_until(ws, answered(read))
            (reply,) = [m for m in got if m["msg_type"] == "execute_reply"]
            assert reply["content"]["status"] == "ok", reply["content"]
            seen.append(stdout([m for m in got if m["parent_header"].get("msg_id") == read]))
            sent.append(f"{values[-1]}\n")
    assert seen == sent
