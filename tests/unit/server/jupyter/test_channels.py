"""The channels WebSocket with plain `websockets` clients, both framings: what
jupyter_server's gateway client, Open WebUI and JupyterLab 4 do on it."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
import pytest
from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from kernelgw.runtime.kernel_link import KernelLink
from kernelgw.runtime.loop_share import LoopShare
from kernelgw.server.jupyter.channels import ChannelsConnection
from tests.support.local_backend import LocalBackend
from tests.unit.server.jupyter.conftest import (
    RECEIVE_TIMEOUT_S,
    Gateway,
    collect,
    execute_request,
    gateway,
    of_type,
    receive_json,
    request,
)

V1 = "v1.kernel.websocket.jupyter.org"


def channels_url(gw: Gateway, kid: str, key: str | None = None) -> str:
    return f"{gw.ws_url}/api/kernels/{kid}/channels?session_id=abc" + (f"&token={key}" if key else "")


async def run(ws: ClientConnection, code: str, **content: Any) -> list[dict[str, Any]]:
    msg = execute_request(code, **content)
    await ws.send(json.dumps(msg))
    return await collect(ws, msg["header"]["msg_id"])


def stdout(msgs: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in of_type(msgs, "stream") if m["content"]["name"] == "stdout")


async def test_kernel_info_and_execute_over_json_frames(gw: Gateway, kernel: str) -> None:
    async with connect(channels_url(gw, kernel, gw.alice)) as ws:
        assert ws.subprotocol is None
        info = request("kernel_info_request", {})
        await ws.send(json.dumps(info))
        msgs = await collect(ws, info["header"]["msg_id"])
        (reply,) = of_type(msgs, "kernel_info_reply")
        assert reply["channel"] == "shell"
        assert reply["content"]["language_info"]["name"] == "python"
        for field in ("msg_type", "msg_id", "channel", "header", "parent_header", "metadata", "content"):
            assert field in reply

        msgs = await run(ws, "print('hello'); 6 * 7")
        assert stdout(msgs) == "hello\n"
        (result,) = of_type(msgs, "execute_result")
        assert result["channel"] == "iopub" and result["content"]["data"]["text/plain"] == "42"
        (reply,) = of_type(msgs, "execute_reply")
        assert reply["content"]["status"] == "ok"

        msgs = await run(ws, "from IPython.display import display, HTML\ndisplay(HTML('<b>x</b>'))")
        (display,) = of_type(msgs, "display_data")
        assert display["content"]["data"]["text/html"] == "<b>x</b>"

        msgs = await run(ws, "1/0")
        (error,) = of_type(msgs, "error")
        assert error["content"]["ename"] == "ZeroDivisionError"
        assert of_type(msgs, "execute_reply")[0]["content"]["status"] == "error"


async def test_autogen_style_request_dates_without_timezone_and_empty_buffers(gw: Gateway, kernel: str) -> None:
    async with connect(channels_url(gw, kernel), additional_headers={"Authorization": f"token {gw.alice}"}) as ws:
        msg = execute_request("print(1)")
        msg["header"]["version"] = "5.0"
        msg["header"]["date"] = "2024-01-01T00:00:00.000000"
        msg["buffers"] = {}
        await ws.send(json.dumps(msg))
        assert stdout(await collect(ws, msg["header"]["msg_id"])) == "1\n"


async def test_enterprise_gateway_style_requests_with_an_empty_session_run(gw: Gateway, kernel: str) -> None:
    """Enterprise Gateway's GatewayClient sends ``"session": ""`` and ``"buffers": {}``;
    Jupyter Server takes that, and a header with only ``msg_type`` and no channel."""
    async with connect(channels_url(gw, kernel, gw.alice)) as ws:
        msg = execute_request("x = 41\nprint(x + 1)")
        msg["header"] = {
            "username": "",
            "version": "5.0",
            "session": "",
            "msg_id": "eg1",
            "msg_type": "execute_request",
        }
        msg["buffers"] = {}
        await ws.send(json.dumps(msg))
        assert stdout(await collect(ws, "eg1")) == "42\n"
        bare = {"header": {"msg_type": "execute_request"}, "parent_header": {}, "metadata": {}}
        bare["content"] = {"code": "print(x)"}
        await ws.send(json.dumps(bare))
        first = await receive_json(ws)  # its first message names the msg_id the gateway gave it
        while first["parent_header"].get("msg_id") in (None, "eg1"):
            first = await receive_json(ws)
        assert first["parent_header"]["msg_type"] == "execute_request" and first["parent_header"]["session"] == ""
        msgs = [first, *await collect(ws, first["parent_header"]["msg_id"])]
        assert stdout(msgs) == "41\n"
        assert of_type(msgs, "execute_reply")[0]["content"]["status"] == "ok"


async def test_v1_binary_subprotocol_round_trip(gw: Gateway, kernel: str) -> None:
    async with connect(channels_url(gw, kernel, gw.alice), subprotocols=[V1]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == V1
        msg = execute_request("print('via v1')")
        frame = serialize_msg_to_ws_v1(
            [json.dumps(msg[k]).encode() for k in ("header", "parent_header", "metadata", "content")], "shell"
        )
        await ws.send(frame)
        got: list[tuple[str, dict[str, Any]]] = []
        while True:
            async with asyncio.timeout(RECEIVE_TIMEOUT_S):
                data = await ws.recv()
            assert isinstance(data, bytes)
            channel, parts = deserialize_msg_from_ws_v1(data)
            header, parent, _meta, content = (json.loads(p) for p in parts[:4])
            if parent.get("msg_id") != msg["header"]["msg_id"]:
                continue
            got.append((channel, {"header": header, "content": content}))
            if header["msg_type"] == "status" and content["execution_state"] == "idle":
                if any(m["header"]["msg_type"] == "execute_reply" for _, m in got):
                    break
        streams = [m["content"]["text"] for c, m in got if m["header"]["msg_type"] == "stream"]
        assert streams == ["via v1\n"]
        assert ("shell", "execute_reply") in {(c, m["header"]["msg_type"]) for c, m in got}


async def test_two_clients_share_iopub_and_replies_go_to_the_sender(gw: Gateway, kernel: str) -> None:
    async with (
        connect(channels_url(gw, kernel, gw.alice)) as one,
        connect(channels_url(gw, kernel, gw.alice)) as two,
    ):
        async with gw.client(gw.alice) as http:
            assert (await http.get(f"/api/kernels/{kernel}")).json()["connections"] == 2
        # both have joined iopub once they have answered a request each
        for ws in (one, two):
            info = request("kernel_info_request", {})
            await ws.send(json.dumps(info))
            await collect(ws, info["header"]["msg_id"])
        msg = execute_request("print('to both')")
        await one.send(json.dumps(msg))
        mine = await collect(one, msg["header"]["msg_id"])
        theirs = await collect(two, msg["header"]["msg_id"], reply=False)
        assert stdout(mine) == stdout(theirs) == "to both\n"
        assert of_type(mine, "execute_reply") and not of_type(theirs, "execute_reply")


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        json.dumps([1, 2]),
        json.dumps({"channel": "shell", "content": {}}),  # no header
        json.dumps({**execute_request("1"), "channel": "nowhere"}),
        json.dumps({**execute_request("1"), "channel": "iopub"}),
        json.dumps(request("shutdown_request", {"restart": False}, channel="control")),
        json.dumps({**execute_request("1"), "header": {"msg_id": "m1", "session": ""}}),  # no msg_type
        json.dumps({**execute_request("1"), "header": {**execute_request("1")["header"], "session": 7}}),
        # valid JSON holding a lone surrogate: no UTF-8 encoder takes it (it once made
        # the history store refuse everyone's work)
        json.dumps(execute_request("print(1)  # \ud800")),
    ],
)
async def test_a_malformed_message_harms_no_one(gw: Gateway, kernel: str, bad: str) -> None:
    async with (
        connect(channels_url(gw, kernel, gw.alice)) as sender,
        connect(channels_url(gw, kernel, gw.alice)) as other,
    ):
        await sender.send(bad)
        await sender.send(b"\x00\x01garbage")
        for ws in (sender, other):
            assert stdout(await run(ws, "print('still here')")) == "still here\n"


async def test_huge_output_is_capped_with_a_stream_note(local_backend: LocalBackend, tmp_path: Any) -> None:
    async with gateway(tmp_path, local_backend, max_output_bytes=10_000) as gw:
        async with gw.client(gw.alice) as http:
            kid = (await http.post("/api/kernels", json={})).json()["id"]
            try:
                async with connect(channels_url(gw, kid, gw.alice)) as ws:
                    msgs = await run(ws, "for i in range(200):\n    print('x' * 1000, flush=True)")
                    text = "".join(m["content"]["text"] for m in of_type(msgs, "stream"))
                    assert len(text) < 13_000
                    assert "output exceeded 10000 bytes" in text
                    # the next cell has its own budget
                    assert stdout(await run(ws, "print('after')")) == "after\n"
            finally:
                await http.delete(f"/api/kernels/{kid}")


async def test_refusals_close_the_socket_with_codes(gw: Gateway, kernel: str) -> None:
    for url, code in (
        (channels_url(gw, kernel), 4401),
        (channels_url(gw, kernel, "kgw_000000000000_" + "A" * 43), 4401),
        (channels_url(gw, kernel, gw.bob), 4404),
        (channels_url(gw, "01234567-89ab-cdef-0123-456789abcdef", gw.alice), 4404),
    ):
        async with connect(url) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            assert closed.value.rcvd is not None and closed.value.rcvd.code == code, url


async def test_a_v1_session_opened_as_a_kernel_and_delete_closes_the_socket(gw: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {gw.alice}"}) as http:
        sid = (await http.post("/v1/sessions", json={})).json()["id"]
        async with connect(channels_url(gw, sid, gw.alice)) as ws:
            assert stdout(await run(ws, "x = 5; print(x)")) == "5\n"
            # the /v1 face sees the same kernel
            resp = await http.post(f"/v1/sessions/{sid}/execute", json={"code": "print(x * 2)"}, timeout=60)
            assert "".join(e["text"] for e in resp.json()["events"] if e["type"] == "stream") == "10\n"
            assert (await http.delete(f"/v1/sessions/{sid}")).status_code == 204
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await receive_json(ws)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001


async def test_restart_reconnects_the_channels(gw: Gateway, kernel: str) -> None:
    async with connect(channels_url(gw, kernel, gw.alice)) as ws:
        assert stdout(await run(ws, "y = 1; print('before')")) == "before\n"
        async with gw.client(gw.alice) as http:
            assert (await http.post(f"/api/kernels/{kernel}/restart", json={})).status_code == 200
        msgs = await run(ws, "print('y' in dir())")
        assert stdout(msgs) == "False\n"


async def test_input_is_answered_on_stdin(gw: Gateway, kernel: str) -> None:
    async with connect(channels_url(gw, kernel, gw.alice)) as ws:
        msg = execute_request("name = input('who? ')\nprint('hi', name)", allow_stdin=True)
        await ws.send(json.dumps(msg))
        while True:
            got = await receive_json(ws)
            if got["msg_type"] == "input_request":
                break
        assert got["channel"] == "stdin" and got["content"]["prompt"] == "who? "
        answer = request("input_reply", {"value": "ada"}, channel="stdin")
        answer["parent_header"] = got["header"]
        await ws.send(json.dumps(answer))
        assert "hi ada\n" in stdout(await collect(ws, msg["header"]["msg_id"]))


async def test_code_policy_refuses_a_cell_like_v1(local_backend: LocalBackend, tmp_path: Any) -> None:
    async with gateway(tmp_path, local_backend, policy_deny_imports=["socket"]) as gw:
        async with gw.client(gw.alice) as http:
            kid = (await http.post("/api/kernels", json={})).json()["id"]
            try:
                async with connect(channels_url(gw, kid, gw.alice)) as ws:
                    msgs = await run(ws, "import socket")
                    (reply,) = of_type(msgs, "execute_reply")
                    assert reply["content"]["status"] == "error"
                    assert of_type(msgs, "error")[0]["content"]["ename"] == "PolicyViolation"
                    assert stdout(await run(ws, "print('fine')")) == "fine\n"
            finally:
                await http.delete(f"/api/kernels/{kid}")


async def test_output_forwarded_to_a_client_is_charged_to_its_sessions_share_of_the_loop(
    gw: Gateway, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Jupyter client's flood costs the loop twice (the session reads it, the
    connection forwards it): both are charged to one bucket, the session's."""
    charged: dict[str, list[LoopShare]] = {"link": [], "connection": []}
    original = LoopShare.spent

    def spent(self: LoopShare, cost: float, now: float) -> float:
        caller = sys._getframe(1).f_code
        if caller is ChannelsConnection._read.__code__:
            charged["connection"].append(self)
        elif caller is KernelLink._read_iopub.__code__:
            charged["link"].append(self)
        return original(self, cost, now)

    monkeypatch.setattr(LoopShare, "spent", spent)
    async with connect(channels_url(gw, kernel, gw.alice)) as ws:
        msgs = await run(ws, "for i in range(300):\n    print(i, flush=True)")
    assert stdout(msgs) == "".join(f"{i}\n" for i in range(300))
    assert charged["connection"], "the connection forwarded output without charging any share"
    assert charged["link"]
    assert {id(s) for s in charged["connection"]} == {id(s) for s in charged["link"]}
