"""Reattach after restart: a real ``kernelgw serve`` stopped (SIGTERM) or killed
(SIGKILL) leaves its kernels running, and the next process of its name takes
them over with their state; sessions whose container is gone are ended with a
recorded reason; ``on_shutdown=stop`` leaves nothing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from kernelgw.runtime.manager import KERNEL_GONE_REASON
from tests.integration.conftest import IMAGE, RUNTIME, assert_nothing_left, remove_everything
from tests.security.conftest import gateway_containers, session_containers
from tests.support.processes import gateway_process
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

RUNTIME_DIR = Path("/tmp/kgwr")


@contextmanager
def serve(name: str, data_dir: Path, log: Path, **env: str) -> Iterator[tuple[subprocess.Popen[bytes], httpx.Client]]:
    """``kernelgw serve`` in its own process, with a client; killed at the end if still running."""
    with (
        gateway_process(name, data_dir, log, image=IMAGE, runtime=RUNTIME, runtime_dir=RUNTIME_DIR, **env) as (
            proc,
            url,
        ),
        httpx.Client(base_url=url, timeout=120) as http,
    ):
        yield proc, http


def _execute(http: httpx.Client, sid: str, code: str) -> dict[str, Any]:
    response = http.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _stdout(body: dict[str, Any]) -> str:
    return "".join(e["text"] for e in body["events"] if e["type"] == "stream" and e["name"] == "stdout")


def _sessions(http: httpx.Client) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in http.get("/v1/sessions").json()["sessions"]}


def _running(client: docker.DockerClient, sid: str) -> bool:
    return [c.status for c in session_containers(client, sid)] == ["running"]


def test_sessions_survive_sigterm_and_kill9_and_stop_ends_them(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    name = f"reat{os.getpid()}"
    data, log = tmp_path / "data", tmp_path / "gateway.log"
    try:
        with serve(name, data, log) as (proc, http):
            sids = [http.post("/v1/sessions", json={}).json()["id"] for _ in range(3)]
            for sid in sids:
                assert _execute(http, sid, "x = 42")["execution_count"] == 1
            owners = {sid: s["owner"] for sid, s in _sessions(http).items()}
            # each session's own uid, in its kernel's label
            uids = {sid: session_containers(docker_client, sid)[0].labels["kernelgw.uid"] for sid in sids}
            assert len(set(uids.values())) == len(sids), uids
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM), log.read_text()[-3000:]
        # on_shutdown=keep (the default): the kernels outlive the gateway
        assert all(_running(docker_client, sid) for sid in sids)

        with serve(name, data, log) as (proc, http):
            listed = _sessions(http)
            assert set(listed) == set(sids)
            assert {sid: s["owner"] for sid, s in listed.items()} == owners
            assert all(s["execution_count"] == 1 for s in listed.values())
            for sid in sids:
                # the gateway's helpers run as the uid the label gives back: an upload
                # into the kernel's own (0700) workspace works and is the kernel's
                assert http.put(f"/v1/sessions/{sid}/files/up.txt", content=b"u").status_code == 201
                body = _execute(http, sid, "import os\nprint(x, os.getuid(), os.stat('up.txt').st_uid)")
                assert _stdout(body) == f"42 {uids[sid]} {uids[sid]}\n" and body["execution_count"] == 2
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert all(_running(docker_client, sid) for sid in sids)
        # meanwhile an operator removes one kernel by hand
        gone = sids.pop()
        for container in session_containers(docker_client, gone):
            container.remove(force=True)

        with serve(name, data, log, KERNELGW_ON_SHUTDOWN="stop") as (proc, http):
            assert set(_sessions(http)) == set(sids)
            for sid in sids:
                body = _execute(http, sid, "print(x)")
                assert _stdout(body) == "42\n" and body["execution_count"] == 3
            history = http.get(f"/v1/sessions/{gone}/history").json()
            assert history["ended_at"] is not None and history["end_reason"] == KERNEL_GONE_REASON
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM), log.read_text()[-3000:]
        # on_shutdown=stop: nothing survives
        assert gateway_containers(docker_client, name) == []

        with serve(name, data, log) as (proc, http):
            assert _sessions(http) == {}
            for sid in sids:
                assert http.get(f"/v1/sessions/{sid}/history").json()["end_reason"] == "gateway shutdown"
    finally:
        remove_everything(docker_client, name)
        shutil.rmtree(RUNTIME_DIR / name, ignore_errors=True)
    assert_nothing_left(docker_client, name)


def _ws_url(http: httpx.Client, sid: str, last_seq: int | None = None) -> str:
    url = str(http.base_url).replace("http://", "ws://").rstrip("/") + f"/v1/sessions/{sid}/ws"
    return url if last_seq is None else f"{url}?last_seq={last_seq}"


def _ws_events(url: str, until: Any, send: dict[str, Any] | None = None, timeout: float = 60) -> list[dict[str, Any]]:
    """Events from the session's WebSocket until ``until(event)`` is true."""
    import json

    from websockets.sync.client import connect

    events: list[dict[str, Any]] = []
    with connect(url, open_timeout=30) as ws:
        if send is not None:
            ws.send(json.dumps(send))
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            except TimeoutError:
                raise AssertionError(f"no awaited event within {timeout}s; got {events}") from None
            events.append(event)
            if until(event):
                return events


def test_a_websocket_client_resumes_across_restarts_by_its_last_seq(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    name = f"resume{os.getpid()}"
    data, log = tmp_path / "data", tmp_path / "gateway.log"
    try:
        with serve(name, data, log) as (proc, http):
            sid = http.post("/v1/sessions", json={}).json()["id"]
            seen = _ws_events(
                _ws_url(http, sid),
                lambda e: e["type"] == "done",
                {"type": "execute", "code": "x = 1\nprint('first')", "execution_id": "first"},
            )
            last_seq = seen[-1]["seq"]
            # the client is away while another cell runs, and the gateway restarts
            missed = _execute(http, sid, "print('while away')")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) in (0, -signal.SIGTERM), log.read_text()[-3000:]

        with serve(name, data, log) as (proc, http):
            # what it missed comes back from the store, in order, with no gap
            replayed = _ws_events(
                _ws_url(http, sid, last_seq),
                lambda e: e.get("execution_id") == missed["execution_id"] and e["type"] == "done",
            )
            assert [e["type"] for e in replayed if e["type"] == "gap"] == []
            assert [e["seq"] for e in replayed] == list(range(last_seq + 1, last_seq + 1 + len(replayed)))
            assert "while away\n" in [e.get("text") for e in replayed]
            last_seq = replayed[-1]["seq"]
            # a cell the client started is cut off by a kill -9 after its first output
            running = _ws_events(
                _ws_url(http, sid, last_seq),
                lambda e: e.get("text") == "started\n",
                {
                    "type": "execute",
                    "code": "import time\nprint('started', flush=True)\ntime.sleep(3)\nx = 2",
                    "execution_id": "cut",
                },
            )
            # its `running` row is committed within LINGER_S (20 ms) of its start: wait for it
            wait_until(
                lambda: any(
                    c["execution_id"] == "cut" and c["status"] == "running"
                    for c in http.get(f"/v1/sessions/{sid}/history").json()["executions"]
                ),
                "the cut-off cell's running row in the history",
            )
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        last_seq = running[-1]["seq"]

        with serve(name, data, log) as (proc, http):
            resumed = _ws_events(_ws_url(http, sid, last_seq), lambda e: e["type"] == "done")
            # numbers the dead process may have used are a gap, never reused; then the cell's end
            assert resumed[0]["type"] == "gap" and resumed[0]["first_missing"] == last_seq + 1
            done = resumed[-1]
            assert (
                done["execution_id"] == "cut" and done["status"] == "dead" and done["seq"] > resumed[0]["last_missing"]
            )
            # the kernel was kept, and it finished the cut-off cell by itself
            assert _stdout(_execute(http, sid, "print(x)")) == "2\n"
            history = http.get(f"/v1/sessions/{sid}/history").json()
            statuses = {c["execution_id"]: c["status"] for c in history["executions"]}
            assert statuses["cut"] == "dead" and statuses["first"] == "ok"
    finally:
        remove_everything(docker_client, name)
        shutil.rmtree(RUNTIME_DIR / name, ignore_errors=True)
