"""Recovery by replay on the real engine: an out-of-memory kill under
``auto_replay`` restores ``df``, a restart that replays restores variables and
stops at the first failing cell, a cell sent with ``replay: false`` is not run
again, history marks replays and the notebook export leaves them out, and a
session reattached by a restarted gateway replays the cells the previous
process ran."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from websockets.sync.client import connect

from tests.integration.conftest import RunningGateway, run, stdout
from tests.integration.test_reattach import RUNTIME_DIR, serve
from tests.security.conftest import gateway_containers

pytestmark = pytest.mark.integration

MEMORY_BOMB = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 * 1024))"


@pytest.fixture
def small_session(http: httpx.Client) -> Iterator[str]:
    """A session of 384 MiB that replays by itself after its kernel dies."""
    resp = http.post("/v1/sessions", json={"memory_mb": 384, "auto_replay": True})
    assert resp.status_code == 201, resp.text
    assert resp.json()["auto_replay"] is True
    sid = str(resp.json()["id"])
    yield sid
    http.delete(f"/v1/sessions/{sid}")


def replay_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "replay"]


def test_an_out_of_memory_cell_followed_by_automatic_replay_restores_df(
    gateway: RunningGateway, http: httpx.Client, small_session: str
) -> None:
    sid = small_session
    load = run(http, sid, "import pandas as pd\ndf = pd.DataFrame({'x': range(1000)})")
    derive = run(http, sid, "df['y'] = df.x * 2")
    assert load["status"] == derive["status"] == "ok"
    with connect(
        f"{gateway.ws_url}/v1/sessions/{sid}/ws?last_seq={http.get(f'/v1/sessions/{sid}').json()['last_seq']}"
    ) as ws:
        bomb = run(http, sid, MEMORY_BOMB, timeout=60)
        # the cell that killed the kernel says so, and what happens next
        done = bomb["events"][-1]
        assert bomb["status"] == "dead" and done["state_lost"] is True
        assert "out-of-memory" in done["reason"] and "auto_replay runs the 2 cells" in done["reason"]
        # the next cell runs after the replay, in the rebuilt state
        assert stdout(run(http, sid, "print(int(df.y.sum()), len(df))")) == "999000 1000\n"
        watched: list[dict[str, Any]] = []
        while not any(e["type"] == "replay" and e["phase"] == "finished" for e in watched):
            watched.append(json.loads(ws.recv(timeout=60)))
    started, *cells, finished = replay_events(watched)
    assert (started["phase"], started["trigger"], started["cells"]) == ("started", "kernel_died", 2)
    assert [c["replay_of"] for c in cells] == [load["execution_id"], derive["execution_id"]]
    assert finished["replayed"] == 2
    info = http.get(f"/v1/sessions/{sid}").json()
    assert info["state"] == "idle" and info["dead_reason"] is None
    # history: the real cells, the replays marked; the notebook is what the user ran
    history = http.get(f"/v1/sessions/{sid}/history").json()["executions"]
    replayed = [e for e in history if e["replay_of"] is not None]
    assert [e["replay_of"] for e in replayed] == [load["execution_id"], derive["execution_id"]]
    assert all(e["status"] == "ok" for e in replayed)
    notebook = http.get(f"/v1/sessions/{sid}/notebook").json()
    exported = [c["metadata"]["kernelgw"]["execution_id"] for c in notebook["cells"] if c["cell_type"] == "code"]
    assert exported == [e["execution_id"] for e in history if e["replay_of"] is None]
    assert bomb["execution_id"] in exported


def test_a_restart_with_replay_restores_variables_skips_no_replay_cells_and_stops_at_the_first_failure(
    http: httpx.Client, session_id: str
) -> None:
    sid = session_id
    run(http, sid, "import pandas as pd\ndf = pd.DataFrame({'x': [1, 2, 3]})")
    sent = run(http, sid, "import time\nsent_at = time.time()", replay=False)
    run(http, sid, "total = int(df.x.sum())")
    uses_unreplayed = run(http, sid, "delay = time.time() - sent_at")  # needs the cell that is not replayed
    run(http, sid, "after = 'never'")
    resp = http.post(f"/v1/sessions/{sid}/restart", json={"replay": True})
    assert resp.status_code == 200, resp.text
    report = resp.json()["replay"]
    assert report["trigger"] == "requested" and report["complete"] is False and report["replayed"] == 2
    assert [c["status"] for c in report["cells"]] == ["ok", "ok", "error", "skipped"]
    failed = report["cells"][2]
    assert failed["replay_of"] == uses_unreplayed["execution_id"]
    assert (failed["ename"], failed["evalue"]) == ("NameError", "name 'time' is not defined")
    assert sent["execution_id"] not in {c["replay_of"] for c in report["cells"]}
    state = run(http, sid, "print(total, 'sent_at' in dir(), 'delay' in dir(), 'after' in dir())")
    assert stdout(state) == "6 False False False\n"
    history = http.get(f"/v1/sessions/{sid}/history").json()["executions"]
    assert [e["replayable"] for e in history[:5]] == [True, False, True, True, True]
    assert {e["replay_of"] for e in history if e["replay_of"]} == {c["replay_of"] for c in report["cells"][:3]}


def test_a_session_reattached_by_a_restarted_gateway_replays_its_lineage(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """The lineage and auto_replay are stored: after a SIGTERM the next gateway
    of the name replays the cells the previous process ran."""
    name = f"replay{os.getpid()}"
    data, log = tmp_path / "data", tmp_path / "gateway.log"
    try:
        with serve(name, data, log) as (proc, http):
            sid = http.post("/v1/sessions", json={"auto_replay": True}).json()["id"]
            kept = run(http, sid, "x = 41")["execution_id"]
            run(http, sid, "y = x + 1")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM), log.read_text()[-3000:]
        with serve(name, data, log, KERNELGW_ON_SHUTDOWN="stop") as (proc, http):
            assert http.get(f"/v1/sessions/{sid}").json()["auto_replay"] is True
            resp = http.post(f"/v1/sessions/{sid}/restart", json={"replay": True})
            assert resp.status_code == 200, resp.text
            report = resp.json()["replay"]
            assert report["complete"] and report["cells"][0]["replay_of"] == kept and len(report["cells"]) == 2
            assert stdout(run(http, sid, "print(y)")) == "42\n"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM), log.read_text()[-3000:]
    finally:
        for container in gateway_containers(docker_client, name):  # never leave them, even on failure
            container.remove(force=True)
        shutil.rmtree(RUNTIME_DIR / name, ignore_errors=True)
    assert gateway_containers(docker_client, name) == []
