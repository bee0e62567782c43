"""ipywidgets over the Jupyter channels, end to end with real parts: the kernel
image's ipywidgets, a real gateway, and plain ``websockets`` clients speaking
JSON frames as a widget front end does (JupyterLab's widget manager sends and
reads exactly these comm messages).

A slider is displayed (its ``comm_open`` and its view reach the client), the
client moves it (a ``comm_msg`` update), the kernel reads the new value, and
a change made in the kernel reaches the client; a client of another kernel
sees none of it.

Needs an image with ipywidgets (images/python/requirements.txt):
``KERNELGW_IMAGE`` chooses it, as for the other integration tests."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.integration.conftest import RunningGateway

pytestmark = pytest.mark.integration

RECEIVE_S = 90.0


def message(msg_type: str, content: dict[str, Any], client: str) -> dict[str, Any]:
    header = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": client, "username": "t", "version": "5.3"}
    return {"channel": "shell", "header": header, "parent_header": {}, "metadata": {}, "content": content}


def execute(ws: ClientConnection, code: str, client: str) -> str:
    msg = message("execute_request", {"code": code, "silent": False, "store_history": True}, client)
    ws.send(json.dumps(msg))
    return str(msg["header"]["msg_id"])


def receive_until(ws: ClientConnection, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + RECEIVE_S
    while not done(got):
        try:
            frame = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            raise AssertionError(f"not all awaited messages within {RECEIVE_S}s; got {got}") from None
        got.append(json.loads(frame))
    return got


def answered(msg_id: str) -> Callable[[list[dict[str, Any]]], bool]:
    def check(messages: list[dict[str, Any]]) -> bool:
        mine = [m for m in messages if m["parent_header"].get("msg_id") == msg_id]
        kinds = [m["msg_type"] for m in mine]
        return "execute_reply" in kinds and any(
            m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
            for m in mine[kinds.index("execute_reply") :]
        )

    return check


def run(ws: ClientConnection, code: str, client: str) -> list[dict[str, Any]]:
    """Execute ``code``; every message received until its reply and idle."""
    msg_id = execute(ws, code, client)
    got = receive_until(ws, answered(msg_id))
    (reply,) = [m for m in got if m["msg_type"] == "execute_reply" and m["parent_header"]["msg_id"] == msg_id]
    assert reply["content"]["status"] == "ok", reply["content"]
    return got


def stdout(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


@pytest.fixture
def two_kernels(http: httpx.Client) -> Iterator[tuple[str, str]]:
    ids = []
    for _ in range(2):
        resp = http.post("/api/kernels", json={"name": "python3"})
        assert resp.status_code == 201, resp.text
        ids.append(resp.json()["id"])
    yield ids[0], ids[1]
    for kid in ids:
        http.delete(f"/api/kernels/{kid}")


def test_an_int_slider_round_trips_over_the_channels_and_stays_in_its_kernel(
    gateway: RunningGateway, two_kernels: tuple[str, str]
) -> None:
    mine, other = two_kernels
    url = gateway.ws_url + "/api/kernels/{}/channels?session_id={}"
    with connect(url.format(mine, "w"), open_timeout=60) as ws, connect(url.format(other, "x"), open_timeout=60) as ox:
        t0 = time.monotonic()
        got = run(ws, "import ipywidgets as w\nslider = w.IntSlider(value=1, max=10)\ndisplay(slider)", "w")
        print(f"import ipywidgets and display a slider: {time.monotonic() - t0:.2f}s")
        opens = [m for m in got if m["msg_type"] == "comm_open"]
        assert opens and all(m["channel"] == "iopub" and m["content"]["target_name"] == "jupyter.widget" for m in opens)
        (slider,) = [m for m in opens if m["content"]["data"]["state"]["_model_name"] == "IntSliderModel"]
        comm_id = slider["content"]["comm_id"]
        assert slider["content"]["data"]["state"]["value"] == 1
        (view,) = [m for m in got if m["msg_type"] == "display_data"]
        assert view["content"]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] == comm_id

        # the front end moves the slider: a comm_msg on shell, as JupyterLab's widget manager sends it
        update = {"method": "update", "state": {"value": 5}, "buffer_paths": []}
        ws.send(json.dumps(message("comm_msg", {"comm_id": comm_id, "data": update}, "w")))
        got = run(ws, "print(slider.value)", "w")
        assert stdout(got) == "5\n"

        # and the kernel moves it: the front end is told
        got = run(ws, "slider.value = 7", "w")
        updates = [m for m in got if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id]
        assert any(m["content"]["data"].get("state", {}).get("value") == 7 for m in updates), updates

        # the other kernel's client got none of it (everything it received since it connected)
        seen = run(ox, "print('other kernel')", "x")
        assert [m for m in seen if m["msg_type"].startswith("comm_")] == []
        assert comm_id not in json.dumps(seen)
        assert stdout(seen) == "other kernel\n"


def test_a_kernel_subshell_can_be_made_over_control(gateway: RunningGateway, two_kernels: tuple[str, str]) -> None:
    """JupyterLab asks the kernel for a subshell (protocol 5.5, ipykernel 7) when it
    offers them: the request is forwarded and answered, not dropped."""
    mine, _ = two_kernels
    with connect(gateway.ws_url + f"/api/kernels/{mine}/channels?session_id=sub", open_timeout=60) as ws:
        info = message("kernel_info_request", {}, "sub")
        ws.send(json.dumps(info))
        got = receive_until(ws, lambda m: any(x["msg_type"] == "kernel_info_reply" for x in m))
        (reply,) = [m for m in got if m["msg_type"] == "kernel_info_reply"]
        if "kernel subshells" not in reply["content"].get("supported_features", []):
            pytest.fail(f"the image's kernel offers no subshells: {reply['content']}", pytrace=False)
        request = {**message("create_subshell_request", {}, "sub"), "channel": "control"}
        ws.send(json.dumps(request))
        got = receive_until(ws, lambda m: any(x["msg_type"] == "create_subshell_reply" for x in m))
        (created,) = [m for m in got if m["msg_type"] == "create_subshell_reply"]
        assert created["channel"] == "control" and created["content"]["status"] == "ok", created
        assert created["parent_header"]["msg_id"] == request["header"]["msg_id"]
        assert isinstance(created["content"]["subshell_id"], str)
