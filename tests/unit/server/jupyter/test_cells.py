"""One session, two faces: a Jupyter client's cells run through the session's
queue, so they are in its history, event stream and notebook, they take turns
with /v1 cells, and their end reaches the client only once it is stored."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from kernelgw.storage.store import Store
from tests.support.waiting import until
from tests.unit.server.jupyter.conftest import (
    RECEIVE_TIMEOUT_S,
    Gateway,
    collect,
    execute_request,
    of_type,
    receive_json,
    request,
)
from tests.unit.server.jupyter.test_channels import channels_url, run, stdout


async def history(gw: Gateway, kernel: str) -> list[dict[str, Any]]:
    async with gw.client(gw.alice, scheme="Bearer") as http:
        resp = await http.get(f"/v1/sessions/{kernel}/history")
        assert resp.status_code == 200, resp.text
        executions: list[dict[str, Any]] = resp.json()["executions"]
        return executions


async def test_a_jupyter_cell_is_in_the_history_and_the_v1_stream(gw: Gateway, kernel: str) -> None:
    async with (
        gw.client(gw.alice, scheme="Bearer") as http,
        connect(
            f"{gw.ws_url}/v1/sessions/{kernel}/ws", additional_headers={"Authorization": f"Bearer {gw.alice}"}
        ) as watcher,
        connect(channels_url(gw, kernel, gw.alice)) as ws,
    ):
        msgs = await run(ws, "x = 20\nprint('from jupyter'); x + 1")
        (reply,) = of_type(msgs, "execute_reply")
        assert reply["content"]["status"] == "ok"
        assert reply["content"]["user_expressions"] == {}, "the gateway's own expressions are not shown"
        msg_id = reply["parent_header"]["msg_id"]

        # the /v1 watcher saw it as a cell: queued, its output, done
        events: list[dict[str, Any]] = []
        while not (events and events[-1]["type"] == "done"):
            async with asyncio.timeout(RECEIVE_TIMEOUT_S):
                events.append(json.loads(await watcher.recv()))
        assert {e["execution_id"] for e in events if "execution_id" in e} == {msg_id}
        assert "".join(e["text"] for e in events if e["type"] == "stream") == "from jupyter\n"
        assert events[-1]["status"] == "ok" and events[-1]["execution_count"] == reply["content"]["execution_count"]

        # stored by the time the client got the reply and the idle
        (cell,) = await history(gw, kernel)
        assert cell["execution_id"] == msg_id and cell["code"].startswith("x = 20") and cell["status"] == "ok"

        # the same kernel from /v1: the variable and the execution count go on
        resp = await http.post(f"/v1/sessions/{kernel}/execute", json={"code": "x * 2"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["execution_count"] == reply["content"]["execution_count"] + 1
        notebook = (await http.get(f"/v1/sessions/{kernel}/notebook")).json()
        assert ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"] == [
            "x = 20\nprint('from jupyter'); x + 1",
            "x * 2",
        ]


async def test_the_reply_and_idle_wait_for_the_record(
    gw: Gateway, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Open WebUI and AutoGen stop at the idle: by then the cell must be stored
    (each commit is held back here, so an idle sent before it would be caught)."""
    commit = Store.execution_finished

    async def slow_commit(self: Store, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0.3)
        await commit(self, *args, **kwargs)

    monkeypatch.setattr(Store, "execution_finished", slow_commit)
    async with connect(channels_url(gw, kernel, gw.alice)) as ws:
        msg = execute_request("print('x')")
        await ws.send(json.dumps(msg))
        msgs = await collect(ws, msg["header"]["msg_id"])
        assert [m["msg_type"] for m in msgs][-2:] in (["execute_reply", "status"], ["status", "execute_reply"])
        assert [(c["code"], c["status"]) for c in await history(gw, kernel)] == [("print('x')", "ok")]
        for i in range(3):
            msg = execute_request(f"print({i})")
            await ws.send(json.dumps(msg))
            await collect(ws, msg["header"]["msg_id"], reply=False)
            stored = await history(gw, kernel)
            assert [(c["code"], c["status"]) for c in stored][1:] == [(f"print({n})", "ok") for n in range(i + 1)]


async def test_a_v1_cell_waits_its_turn_without_its_timeout_running(gw: Gateway, kernel: str) -> None:
    """Before, a /v1 cell sent while a Jupyter cell ran timed out behind it."""
    async with connect(channels_url(gw, kernel, gw.alice)) as ws, gw.client(gw.alice, scheme="Bearer") as http:
        slow = execute_request("import time; time.sleep(3); print('slow done')")
        await ws.send(json.dumps(slow))
        while (await receive_json(ws))["msg_type"] != "execute_input":
            pass  # the kernel runs it
        resp = await http.post(f"/v1/sessions/{kernel}/execute", json={"code": "1 + 1", "timeout": 2})
        assert resp.status_code == 200, resp.text
        assert resp.json()["status"] == "ok", resp.json()
        assert stdout(await collect(ws, slow["header"]["msg_id"])) == "slow done\n"
        assert [c["status"] for c in await history(gw, kernel)] == ["ok", "ok"]


async def queued_behind(http: httpx.AsyncClient, kernel: str, n: int) -> None:
    """Until the session's queue holds ``n`` cells behind the running one."""

    async def queued() -> bool:
        return bool((await http.get(f"/v1/sessions/{kernel}")).json()["queue_length"] >= n)

    await until(queued, f"{n} cells queued")


async def test_stop_on_error_aborts_the_clients_queued_cells(gw: Gateway, kernel: str, tmp_path: Path) -> None:
    go = tmp_path / "go"  # the first cell fails only once the others are queued (not after a fixed sleep)
    async with connect(channels_url(gw, kernel, gw.alice)) as ws, gw.client(gw.alice, scheme="Bearer") as http:
        first = execute_request(f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)\n1 / 0")
        second = execute_request("print('second')")
        third = execute_request("print('third')", stop_on_error=False)
        for msg in (first, second, third):
            await ws.send(json.dumps(msg))
        await queued_behind(http, kernel, 2)
        go.touch()
        msgs = await collect(ws, first["header"]["msg_id"])
        assert of_type(msgs, "execute_reply")[0]["content"]["status"] == "error"
        msgs = await collect(ws, second["header"]["msg_id"])
        assert of_type(msgs, "execute_reply")[0]["content"]["status"] == "aborted"
        assert stdout(msgs) == ""
        msgs = await collect(ws, third["header"]["msg_id"])
        assert of_type(msgs, "execute_reply")[0]["content"]["status"] == "aborted"
        # what comes after the failure runs again
        assert stdout(await run(ws, "print('after')")) == "after\n"
        assert stdout(await run(ws, "1/0", stop_on_error=False)) == ""
        assert stdout(await run(ws, "print('runs')")) == "runs\n"
    statuses = [(c["code"], c["status"], c["reason"] or "") for c in await history(gw, kernel)]
    assert statuses[1][1] == "error" and statuses[1][2].startswith("aborted"), statuses


async def test_interrupt_over_rest_ends_a_jupyter_cell_as_interrupted(gw: Gateway, kernel: str) -> None:
    async with connect(channels_url(gw, kernel, gw.alice)) as ws, gw.client(gw.alice) as http:
        msg = execute_request("import time\nprint('running', flush=True)\nfor _ in range(600): time.sleep(0.1)")
        await ws.send(json.dumps(msg))
        # the cell's own output, not execute_input: a SIGINT before the cell's code
        # runs (a loaded machine) is not a KeyboardInterrupt in it
        while (await receive_json(ws))["msg_type"] != "stream":
            pass
        assert (await http.post(f"/api/kernels/{kernel}/interrupt")).status_code == 204
        msgs = await collect(ws, msg["header"]["msg_id"])
        assert of_type(msgs, "error")[0]["content"]["ename"] == "KeyboardInterrupt"
    (cell,) = await history(gw, kernel)
    assert cell["status"] == "interrupted"


def finished(msgs: list[dict[str, Any]]) -> bool:
    idle = [m for m in of_type(msgs, "status") if m["content"]["execution_state"] == "idle"]
    return bool(idle and of_type(msgs, "execute_reply"))


async def collect_all(ws: Any, *msg_ids: str) -> dict[str, list[dict[str, Any]]]:
    """Messages by parent until each of ``msg_ids`` has had its reply and its idle."""
    got: dict[str, list[dict[str, Any]]] = {m: [] for m in msg_ids}
    while not all(finished(msgs) for msgs in got.values()):
        msg = await receive_json(ws)
        parent = msg["parent_header"].get("msg_id")
        if parent in got:
            got[parent].append(msg)
    return got


async def test_a_client_that_reconnects_gets_what_its_cells_sent_meanwhile(gw: Gateway, kernel: str) -> None:
    """JupyterLab reconnects with the same session_id: its cells' output while it was
    away, rebuilt from the session's events, then the rest live, then the reply."""
    url = channels_url(gw, kernel, gw.alice)  # session_id=abc
    ended = execute_request("import time\nprint('a'); time.sleep(1); print('b'); 6 * 7")
    running = execute_request("print('c'); time.sleep(1); print('d'); time.sleep(2); print('e')")
    watcher = await connect(
        f"{gw.ws_url}/v1/sessions/{kernel}/ws", additional_headers={"Authorization": f"Bearer {gw.alice}"}
    )
    async with connect(url) as ws:
        await ws.send(json.dumps(ended))
        await ws.send(json.dumps(running))
        printed = ""
        while printed != "a\n":  # print's two writes may come as two messages
            if (m := await receive_json(ws))["msg_type"] == "stream":
                printed += m["content"]["text"]
    async with connect(url.replace("session_id=abc", "session_id=other")) as stranger:
        # another client of the same kernel is not sent them (its own iopub aside);
        # meanwhile the first cell ends and the second prints 'c' and 'd', as the
        # /v1 watcher sees (a wait on that, not a sleep)
        seen = ""
        async with watcher, asyncio.timeout(RECEIVE_TIMEOUT_S):
            while "d\n" not in seen:
                event = json.loads(await watcher.recv())
                if event["type"] == "stream" and event.get("execution_id") == running["header"]["msg_id"]:
                    seen += event["text"]
        probe = request("kernel_info_request", {})
        await stranger.send(json.dumps(probe))
        got = await collect(stranger, probe["header"]["msg_id"])
        assert of_type(got, "kernel_info_reply")
        assert not of_type(got, "execute_reply")
    async with connect(url) as ws:
        got = await collect_all(ws, ended["header"]["msg_id"], running["header"]["msg_id"])
    msgs = got[ended["header"]["msg_id"]]
    assert stdout(msgs) == "b\n"
    assert of_type(msgs, "execute_result")[0]["content"]["data"]["text/plain"] == "42"
    assert of_type(msgs, "execute_reply")[0]["content"]["status"] == "ok"
    msgs = got[running["header"]["msg_id"]]
    assert stdout(msgs) == "c\nd\ne\n"
    assert of_type(msgs, "execute_reply")[0]["content"]["status"] == "ok"


async def test_a_client_that_comes_back_mid_output_gets_each_line_once(gw: Gateway, kernel: str) -> None:
    """The connection's own iopub socket joins before the session's events are
    replayed to it: a line the kernel printed in between is in both, and is
    sent once. Lines every 2 ms, so some always fall in that window."""
    url = channels_url(gw, kernel, gw.alice)
    code = "import sys, time\nfor i in range(1500):\n    print(i, flush=True)\n    time.sleep(0.002)"
    cell = execute_request(code)
    async with connect(url) as ws:
        await ws.send(json.dumps(cell))
        while (await receive_json(ws))["msg_type"] != "stream":
            pass
    await asyncio.sleep(0.5)  # away while it prints
    async with connect(url) as ws:
        got = await collect_all(ws, cell["header"]["msg_id"])
    msgs = got[cell["header"]["msg_id"]]
    # how the cell ended first: a cell cut short is not a line lost (seen once,
    # in a loaded CI run: lines up to 1181 and then the end, its status unknown)
    reply = of_type(msgs, "execute_reply")[0]["content"]
    others = [(m["msg_type"], m["content"]) for m in msgs if m["msg_type"] not in ("stream", "status")]
    errors = [m["content"]["text"] for m in of_type(msgs, "stream") if m["content"]["name"] == "stderr"]
    assert reply["status"] == "ok", (reply, others, errors)
    numbers = [int(x) for x in stdout(msgs).split()]
    assert len(numbers) == len(set(numbers)), "a line was sent twice"
    assert numbers == sorted(numbers) and numbers[-1] == 1499, (numbers[-3:], others, errors)


async def test_a_forged_idle_does_not_end_a_jupyter_cell(gw: Gateway, kernel: str) -> None:
    """Clients that stop at the idle (Open WebUI, AutoGen) get all the real output first."""
    from tests.unit.runtime.test_untrusted_kernel import FORGE

    async with connect(channels_url(gw, kernel, gw.alice)) as ws:
        msg = execute_request(FORGE)
        await ws.send(json.dumps(msg))
        msgs = await collect(ws, msg["header"]["msg_id"], reply=False)  # up to the first idle
        assert stdout(msgs) == "real output after the forged end\n"
        assert [m["content"]["ename"] for m in of_type(msgs, "error")] == ["ZeroDivisionError"]
        msgs += await collect(ws, msg["header"]["msg_id"]) if not of_type(msgs, "execute_reply") else []
        (reply,) = [m for m in of_type(msgs, "execute_reply") if m["content"]["status"] == "error"]
        assert reply["content"]["ename"] == "ZeroDivisionError"
