"""The REST API in-process on real kernel subprocesses: the session lifecycle,
blocking execute, interrupt, restart, death, workspace files and history, as a
client sees them, without an engine (tests/integration repeats the essentials
on Docker)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.app import local_settings, serve
from tests.support.http import execute as run
from tests.support.local_backend import LocalBackend


@pytest.fixture
async def http(local_backend: LocalBackend, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(local_settings(tmp_path), local_backend) as (_, client):
        yield client


@pytest.fixture
async def sid(http: httpx.AsyncClient) -> str:
    resp = await http.post("/v1/sessions", json={})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def stdout(result: dict[str, Any]) -> str:
    return "".join(e["text"] for e in result["events"] if e["type"] == "stream" and e["name"] == "stdout")


async def wait_for_state(http: httpx.AsyncClient, sid: str, state: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while (await http.get(f"/v1/sessions/{sid}")).json()["state"] != state:
        assert time.monotonic() < deadline, f"session {sid} never became {state}"
        await asyncio.sleep(0.02)


async def test_a_session_keeps_state_between_executions_and_is_gone_after_delete(
    http: httpx.AsyncClient, sid: str, local_backend: LocalBackend
) -> None:
    assert stdout(await run(http, sid, "x = 20")) == ""
    result = await run(http, sid, "print(x * 2)\nx + 1")
    assert result["status"] == "ok" and result["execution_count"] == 2
    assert stdout(result) == "40\n"
    assert next(e for e in result["events"] if e["type"] == "result")["data"]["text/plain"] == "21"
    info = (await http.get(f"/v1/sessions/{sid}")).json()
    assert info["state"] == "idle" and info["execution_count"] == 2 and info["queue_length"] == 0
    assert [s["id"] for s in (await http.get("/v1/sessions")).json()["sessions"]] == [sid]
    assert (await http.delete(f"/v1/sessions/{sid}")).status_code == 204
    assert (await http.get(f"/v1/sessions/{sid}")).status_code == 404
    assert local_backend.running() == []
    # the history outlives the session
    notebook = (await http.get(f"/v1/sessions/{sid}/notebook")).json()
    sources = ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "code"]
    assert sources == ["x = 20", "print(x * 2)\nx + 1"]


async def test_errors_are_reported_and_the_session_carries_on(http: httpx.AsyncClient, sid: str) -> None:
    result = await run(http, sid, "1/0")
    assert result["status"] == "error"
    error = next(e for e in result["events"] if e["type"] == "error")
    assert error["ename"] == "ZeroDivisionError"
    assert "ZeroDivisionError" in result["events"][-1]["reason"]
    assert stdout(await run(http, sid, "print('fine')")) == "fine\n"


async def test_interrupt_endpoint_stops_a_running_cell(http: httpx.AsyncClient, sid: str) -> None:
    await run(http, sid, "keep = 5")
    assert (await http.post(f"/v1/sessions/{sid}/interrupt")).json() == {"interrupted": False}
    running = asyncio.create_task(run(http, sid, "import time\ntime.sleep(60)"))
    await wait_for_state(http, sid, "busy")
    assert (await http.post(f"/v1/sessions/{sid}/interrupt")).json() == {"interrupted": True}
    assert (await running)["status"] == "interrupted"
    assert stdout(await run(http, sid, "print(keep)")) == "5\n"


async def test_timeout_then_restart_endpoint(http: httpx.AsyncClient, sid: str) -> None:
    await run(http, sid, "gone = 1")
    done = (await run(http, sid, "while True:\n    pass", timeout=0.5))["events"][-1]
    assert done["status"] == "timeout" and done["state_lost"] is False
    resp = await http.post(f"/v1/sessions/{sid}/restart")
    assert resp.status_code == 200 and resp.json()["execution_count"] == 0 and resp.json()["state"] == "idle"
    after = await run(http, sid, "'gone' in dir()")
    assert next(e for e in after["events"] if e["type"] == "result")["data"]["text/plain"] == "False"


async def test_a_dead_kernel_shows_in_the_session_until_restarted(http: httpx.AsyncClient, sid: str) -> None:
    done = (await run(http, sid, "import os\nos.kill(os.getpid(), 9)"))["events"][-1]
    assert done["status"] == "dead" and "signal 9" in done["reason"]
    info = (await http.get(f"/v1/sessions/{sid}")).json()
    assert info["state"] == "dead" and "signal 9" in info["dead_reason"]
    assert (await http.post(f"/v1/sessions/{sid}/restart")).json()["state"] == "idle"
    assert stdout(await run(http, sid, "print('back')")) == "back\n"


async def test_workspace_files_are_listed_downloaded_and_deleted_through_the_helpers(
    http: httpx.AsyncClient, sid: str
) -> None:
    """Uploads (PUT) are Docker-only: their quota is the workspace tmpfs's own usage."""
    await run(http, sid, "import os\nos.makedirs('data')\nopen('data/in.csv', 'w').write('a,b\\n1,2\\n')")
    result = await run(http, sid, "print(open('data/in.csv').read().splitlines()[1])\nopen('out.txt', 'w').write('ok')")
    assert stdout(result) == "1,2\n"
    assert [a["path"] for a in result["events"][-1]["artifacts"]] == ["out.txt"]
    listing = (await http.get(f"/v1/sessions/{sid}/files", params={"recursive": "true"})).json()
    assert {e["path"] for e in listing["entries"] if e["type"] == "file"} == {"data/in.csv", "out.txt"}
    download = await http.get(f"/v1/sessions/{sid}/files/out.txt")
    assert download.status_code == 200 and download.content == b"ok"
    assert (await http.delete(f"/v1/sessions/{sid}/files/out.txt")).status_code == 204
    assert (await http.get(f"/v1/sessions/{sid}/files/out.txt")).status_code == 404
    escape = await http.get(f"/v1/sessions/{sid}/files/..%2F..%2Fetc%2Fpasswd")
    assert escape.status_code in (400, 404)
