"""Recovery by replay through the REST API and the SDK, in-process on real kernel
subprocesses: ``POST /restart {"replay": true}``, ``"replay": false`` on
execute, ``auto_replay`` at creation, the history's ``replay_of``, and the
notebook export and ``from_session`` restore that leave replays out.
(tests/integration/test_replay.py repeats the essentials on Docker, with a
real out-of-memory kill.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from kernelgw.client import AsyncClient
from kernelgw.models import RestartedSession
from kernelgw.server.notebook import plan_from_executions
from tests.support.app import local_settings, serve
from tests.support.http import execute as run
from tests.support.local_backend import LocalBackend


@pytest.fixture
async def served(local_backend: LocalBackend, tmp_path: Path) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    async with serve(local_settings(tmp_path), local_backend) as both:
        yield both


@pytest.fixture
def http(served: tuple[FastAPI, httpx.AsyncClient]) -> httpx.AsyncClient:
    return served[1]


async def create(http: httpx.AsyncClient, **body: Any) -> str:
    resp = await http.post("/v1/sessions", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def result(answer: dict[str, Any]) -> str:
    return str(next(e for e in answer["events"] if e["type"] == "result")["data"]["text/plain"])


async def test_restart_without_a_body_is_unchanged_and_with_replay_reports_each_cell(http: httpx.AsyncClient) -> None:
    sid = await create(http)
    first = (await run(http, sid, "x = 41"))["execution_id"]
    await run(http, sid, "note = 'sent'", replay=False)
    await run(http, sid, "y = x + 1")
    plain = await http.post(f"/v1/sessions/{sid}/restart")
    assert plain.status_code == 200 and plain.json()["replay"] is None and plain.json()["state"] == "idle"
    assert result(await run(http, sid, "'x' in dir()")) == "False"
    # the plain restart started an empty lineage: only what runs from now on is replayed
    await run(http, sid, "x = 41")
    await run(http, sid, "y = x + 1")
    resp = await http.post(f"/v1/sessions/{sid}/restart", json={"replay": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"] == sid and body["state"] == "idle" and body["auto_replay"] is False
    report = body["replay"]
    # the check after the plain restart ran ok in the new kernel: it is replayed too
    assert report["trigger"] == "requested" and report["complete"] is True and report["replayed"] == 3
    assert [(c["index"], c["status"]) for c in report["cells"]] == [(0, "ok"), (1, "ok"), (2, "ok")]
    assert first not in {c["replay_of"] for c in report["cells"]}  # that one ran in an earlier kernel
    assert result(await run(http, sid, "(y, 'note' in dir())")) == "(42, False)"
    RestartedSession.model_validate(body)  # what the SDK reads


async def test_a_restart_body_is_checked(http: httpx.AsyncClient) -> None:
    sid = await create(http)
    resp = await http.post(f"/v1/sessions/{sid}/restart", json={"replay": True, "surprise": 1})
    assert resp.status_code == 422
    assert (await http.post(f"/v1/sessions/{sid}/restart", json={"replay": False})).json()["replay"] is None


async def test_history_marks_replays_and_the_notebook_and_a_restore_leave_them_out(http: httpx.AsyncClient) -> None:
    sid = await create(http)
    await run(http, sid, "counter = 1")
    await run(http, sid, "mail = 'sent'", replay=False)
    await run(http, sid, "counter += 10")
    report = (await http.post(f"/v1/sessions/{sid}/restart", json={"replay": True})).json()["replay"]
    assert report["complete"]
    await run(http, sid, "print(counter)")
    history = (await http.get(f"/v1/sessions/{sid}/history")).json()["executions"]
    assert [(e["code"], e["replay_of"] is not None, e["replayable"]) for e in history] == [
        ("counter = 1", False, True),
        ("mail = 'sent'", False, False),
        ("counter += 10", False, True),
        ("counter = 1", True, True),
        ("counter += 10", True, True),
        ("print(counter)", False, True),
    ]
    assert [h["replay_of"] for h in history[3:5]] == [history[0]["execution_id"], history[2]["execution_id"]]
    replay_cells = [e for h in history[3:5] for e in h["events"] if e["type"] == "replay"]
    assert [(e["phase"], e["index"]) for e in replay_cells] == [("cell", 0), ("cell", 1)]
    notebook = (await http.get(f"/v1/sessions/{sid}/notebook")).json()
    ids = [c["metadata"]["kernelgw"]["execution_id"] for c in notebook["cells"] if c["cell_type"] == "code"]
    assert ids == [history[i]["execution_id"] for i in (0, 1, 2, 5)]
    # a restore from this session runs each cell the user ran once
    restored = await http.post("/v1/sessions", json={"from_session": sid})
    assert restored.status_code == 201, restored.text
    assert [c["index"] for c in restored.json()["replay"]] == [0, 1, 2, 5]
    assert result(await run(http, restored.json()["id"], "counter")) == "11"


def test_a_restore_plan_skips_replayed_executions() -> None:
    def row(position: int, replay_of: str | None) -> Any:
        end = {"status": "ok", "execution_count": position + 1, "duration_ms": 1.0, "reason": None}  # `cell_end`
        return type("Row", (), {"position": position, "code": "x = 1", "replay_of": replay_of, **end})()

    assert [s.index for s in plan_from_executions([row(0, None), row(1, "e0"), row(2, None)])] == [0, 2]


async def test_auto_replay_is_a_session_setting(http: httpx.AsyncClient, local_backend: LocalBackend) -> None:
    sid = await create(http, auto_replay=True)
    assert (await http.get(f"/v1/sessions/{sid}")).json()["auto_replay"] is True
    await run(http, sid, "df = list(range(5))")
    died = await run(http, sid, "import os\nos._exit(9)")
    assert died["status"] == "dead" and died["events"][-1]["state_lost"] is True
    assert "auto_replay" in died["events"][-1]["reason"]
    # the replay runs before the next cell: it finds df again
    assert result(await run(http, sid, "sum(df)")) == "10"
    assert local_backend.started == 2


async def test_the_sdk_restarts_with_replay_and_marks_cells_not_to_replay(
    served: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    app, _ = served
    transport = httpx.ASGITransport(app=app)
    async with AsyncClient("http://localhost", transport=transport) as client:
        async with client.session(auto_replay=True) as session:
            assert (await session.info()).auto_replay is True
            await session.run("a = 1")
            await session.run("b = 2", replay=False)
            restarted = await session.restart(replay=True)
            assert restarted.replay is not None and restarted.replay.complete
            assert [c.status for c in restarted.replay.cells] == ["ok"]
            assert (await session.run("('a' in dir(), 'b' in dir())")).text == "(True, False)"
            plain = await session.restart()
            assert plain.replay is None and session.last_info is plain
