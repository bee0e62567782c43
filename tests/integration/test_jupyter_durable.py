"""Durable reconnect over the Jupyter channels, with real parts: a real
``kernelgw serve`` process stopped (SIGTERM, ``on_shutdown=keep``) and killed
(SIGKILL), a real kernel container that outlives it, the SQLite store, and a
plain ``websockets`` client speaking JSON frames with a fixed ``session_id``
(what JupyterLab and jupyter_server's gateway client do on reconnect).

After each restart the client finds its kernel and is sent, once, the cells
whose answer it never got: one that ended while it was away, and the one the
gateway's stop or death cut off, each with its output, ``execute_reply`` and
``status: idle`` under the request's own header. A cell it got live is not
sent again. The next gateway follows a cell a SIGTERM (keep) cut off to its
end, so that cell is sent as its record stands when the client returns: still
running (the interim end), followed to its end (its real status and later
output), or ended while no gateway was connected (its end not seen). The cells
wait for a file the test creates, so which of these happens is the test's
choice, not the restart's speed. Also: Jupyter kernels are culled by the
session idle policy once no channels WebSocket is open on them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from docker.models.containers import Container
from websockets.sync.client import ClientConnection, connect

from kernelgw.runtime.execution_queue import FOLLOW_MISSED
from kernelgw.runtime.session import DETACHED_DONE_REASON, DETACHED_QUEUED_REASON
from kernelgw.storage.retention import CUT_OFF_REASON
from tests.integration.conftest import (
    IMAGE,
    RUNTIME,
    assert_nothing_left,
    gateway_settings,
    remove_everything,
    start_gateway,
)
from tests.support.postgres import postgres_url
from tests.support.processes import gateway_process

pytestmark = pytest.mark.integration

RUNTIME_DIR = Path("/tmp/kgwj")
CLIENT = "jupyterlab-tab-1"
"""The client's ``session_id``: the same on every connection, as JupyterLab's."""
RECEIVE_S = 90.0
GATEWAY_ERROR = "KernelGatewayError"
GO_CUT, GO_FOLLOWED, GO_MISSED = "/tmp/kgw-go-cut", "/tmp/kgw-go-followed", "/tmp/kgw-go-missed"
"""Files in the kernel's container that a waiting cell goes on at (`waiting_cell`)."""
DONE_MISSED = "/tmp/kgw-done-missed"


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str | None:
    """The store of the restarted gateways: SQLite in its data directory, or PostgreSQL."""
    if request.param == "sqlite":
        return None
    return postgres_url()


@contextmanager
def serve(
    name: str, data_dir: Path, log: Path, database_url: str | None
) -> Iterator[tuple[subprocess.Popen[bytes], httpx.Client]]:
    with (
        gateway_process(
            name,
            data_dir,
            log,
            image=IMAGE,
            runtime=RUNTIME,
            runtime_dir=RUNTIME_DIR,
            database_url=database_url,
            KERNELGW_SHUTDOWN_GRACE_S="1",  # the running cell is cut off, not waited for
        ) as (proc, url),
        httpx.Client(base_url=url, timeout=120) as http,
    ):
        yield proc, http


def channels(http: httpx.Client, kid: str, client: str = CLIENT) -> ClientConnection:
    url = str(http.base_url).replace("http://", "ws://").rstrip("/")
    return connect(f"{url}/api/kernels/{kid}/channels?session_id={client}", open_timeout=60, max_size=None)


def execute(ws: ClientConnection, code: str, client: str = CLIENT) -> str:
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "session": client, "username": "t", "version": "5.3"}
    content = {"code": code, "silent": False, "store_history": True, "stop_on_error": False}
    ws.send(json.dumps({"channel": "shell", "header": header, "parent_header": {}, "metadata": {}, "content": content}))
    return msg_id


def receive_until(ws: ClientConnection, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + RECEIVE_S
    while not done(got):
        try:
            frame = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            raise AssertionError(f"not all awaited messages within {RECEIVE_S}s; got {got}") from None
        assert isinstance(frame, str), "a client without the v1 subprotocol gets JSON text frames"
        got.append(json.loads(frame))
    return got


def of(messages: list[dict[str, Any]], msg_id: str) -> list[dict[str, Any]]:
    return [m for m in messages if m["parent_header"].get("msg_id") == msg_id]


def answered(msg_id: str) -> Callable[[list[dict[str, Any]]], bool]:
    """Its reply and the idle after it are in."""

    def check(messages: list[dict[str, Any]]) -> bool:
        mine = of(messages, msg_id)
        kinds = [m["msg_type"] for m in mine]
        return "execute_reply" in kinds and any(
            m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"
            for m in mine[kinds.index("execute_reply") :]
        )

    return check


def summary(messages: list[dict[str, Any]], msg_id: str, replayed: bool = False) -> list[Any]:
    """What the client sees of one cell: types, stdout, the reply's status, in
    order; ``replayed``: only what the gateway sent (not a kept kernel's own
    messages, live, of a cell it still runs)."""
    out: list[Any] = []
    for m in of(messages, msg_id):
        if replayed and m["header"]["session"] != "kernelgw":
            continue
        kind, content = m["msg_type"], m["content"]
        if kind == "stream":
            out.append(("stream", content["text"]))
        elif kind == "status":
            out.append(content["execution_state"])
        elif kind == "execute_reply":
            out.append(("reply", content["status"]))
        elif kind == "error":
            out.append(("error", content["ename"], content["evalue"]))
        else:
            out.append(kind)
    return out


def wait_stored(http: httpx.Client, kid: str, msg_id: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Until the history holds the execution ``msg_id`` in a state ``check`` accepts; its row."""
    deadline = time.monotonic() + RECEIVE_S
    while time.monotonic() < deadline:
        history = http.get(f"/v1/sessions/{kid}/history").json()
        row = next((e for e in history["executions"] if e["execution_id"] == msg_id), None)
        if row is not None and check(row):
            return row
        time.sleep(0.3)
    raise AssertionError(f"execution {msg_id} never reached the awaited state")


def stdout_of(row: dict[str, Any]) -> str:
    return "".join(e["text"] for e in row["events"] if e["type"] == "stream")


def late_stdout_of(row: dict[str, Any]) -> str:
    """What the record holds of the kernel's stdout after the cell's (interim) end."""
    late = [e["event"] for e in row["events"] if e["type"] == "late"]
    return "".join(e["text"] for e in late if e["type"] == "stream")


def waiting_cell(go: str, done: str | None = None) -> str:
    """A cell that prints ``before the stop``, waits until the file ``go`` exists in
    its container, prints ``after the stop`` and, given ``done``, creates that file
    as its last act: it ends when the test says, not after a sleep that races the
    gateway's restart (a 6 s one did: ended before or after the next gateway took
    it over, before or after the client returned, as the machine's load had it)."""
    code = f"import os, time\nprint('before the stop', flush=True)\nwhile not os.path.exists({go!r}):\n    time.sleep(0.05)\n"
    code += "print('after the stop')"
    if done is not None:
        code += f"\nopen({done!r}, 'w').close()"
    return code


def kernel_container(docker_client: docker.DockerClient, name: str) -> Container:
    (kernel,) = docker_client.containers.list(filters={"label": [f"kernelgw.gateway={name}", "kernelgw.kernel"]})
    return kernel


def touch(kernel: Container, path: str) -> None:
    assert kernel.exec_run(["touch", path]).exit_code == 0


def until_exists(kernel: Container, path: str) -> None:
    deadline = time.monotonic() + RECEIVE_S
    while kernel.exec_run(["test", "-e", path]).exit_code != 0:
        assert time.monotonic() < deadline, f"{path} never appeared in the kernel's container"
        time.sleep(0.1)


def until_following(http: httpx.Client, kid: str) -> None:
    """Until the restarted gateway follows the cell the stopped one left running:
    it marks the session busy in the same step as it routes the cell's messages
    to the cell's record (`ExecutionQueue._follow`), so from then on the cell's
    end is seen. Only for a session that runs nothing else."""
    deadline = time.monotonic() + RECEIVE_S
    while http.get(f"/v1/sessions/{kid}").json()["state"] != "busy":
        assert time.monotonic() < deadline, "the restarted gateway never followed the cell"
        time.sleep(0.05)


def sigterm(proc: subprocess.Popen[bytes], log: Path) -> float:
    """SIGTERM to the gateway (on_shutdown=keep: its kernels run on); the seconds to its exit."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM), log.read_text()[-3000:]
    return time.monotonic() - t0


def test_a_channels_client_gets_what_it_missed_across_sigterm_and_kill9(
    docker_client: docker.DockerClient, tmp_path: Path, database_url: str | None
) -> None:
    name = f"jdur{os.getpid()}{'p' if database_url else 's'}"
    data, log = tmp_path / "data", tmp_path / "gateway.log"
    try:
        with serve(name, data, log, database_url) as (proc, http):
            resp = http.post("/api/kernels", json={"name": "python3"})
            assert resp.status_code == 201, resp.text
            kid = resp.json()["id"]
            with channels(http, kid) as ws:
                live = execute(ws, "x = 41; print('answered live')")
                got = receive_until(ws, answered(live))
                assert ("stream", "answered live\n") in summary(got, live)
                # then two cells, and the client goes away at once
                away = execute(ws, "import time; time.sleep(1); print('ended while away')")
                cut = execute(ws, waiting_cell(GO_CUT))  # runs until the client is back
                never = execute(ws, "print('never runs')")  # still queued behind it at the stop
            wait_stored(http, kid, away, lambda e: e["status"] == "ok")
            wait_stored(http, kid, cut, lambda e: "before the stop" in stdout_of(e))
            print(f"SIGTERM to exit: {sigterm(proc, log):.2f}s")
        kernel = kernel_container(docker_client, name)

        with serve(name, data, log, database_url) as (proc, http):
            t0 = time.monotonic()
            until_following(http, kid)
            with channels(http, kid) as ws:
                probe = execute(ws, "print(x + 1)")  # queued behind the followed cell
                got = receive_until(ws, answered(never))  # the replay: never is the last cell sent
                # the cell still runs: its record, sent, is the interim end; now let it end
                touch(kernel, GO_CUT)
                got += receive_until(ws, answered(probe))
                print(f"reconnect to the probe's answer after the restart: {time.monotonic() - t0:.2f}s")
                assert summary(got, live) == [], "a cell answered live is not sent again"
                assert summary(got, away) == [
                    "busy",
                    ("stream", "ended while away\n"),
                    ("reply", "ok"),
                    "idle",
                ]
                gateway_stop = ("error", GATEWAY_ERROR, DETACHED_DONE_REASON)
                interim = ["busy", ("stream", "before the stop\n"), gateway_stop, ("reply", "error"), "idle"]
                assert summary(got, cut, replayed=True) == interim
                # then the kernel's own messages of the cell, live (its reply went to the stopped gateway)
                assert summary(got, cut)[len(interim) :] == [("stream", "after the stop\n"), "idle"]
                not_run = ("error", GATEWAY_ERROR, DETACHED_QUEUED_REASON)
                assert summary(got, never, replayed=True) == ["busy", not_run, ("reply", "error"), "idle"]
                replayed = of(got, away)[0]["parent_header"]
                assert replayed["msg_id"] == away and replayed["session"] == CLIENT
                assert ("stream", "42\n") in summary(got, probe), "the kernel was kept, with its variables"
                # the new gateway followed the cut cell to its end: its record says how it ended
                row = wait_stored(http, kid, cut, lambda e: e["status"] != "dead")
                assert (row["status"], late_stdout_of(row)) == ("ok", "after the stop\n"), row
                # a cell running when the gateway is killed, the client connected
                dying = execute(ws, "print('before the kill', flush=True); time.sleep(6); print('after')")
                receive_until(ws, lambda m: ("stream", "before the kill\n") in summary(m, dying))
                wait_stored(http, kid, dying, lambda e: "before the kill" in stdout_of(e))
                proc.send_signal(signal.SIGKILL)
                proc.wait()

        with serve(name, data, log, database_url) as (proc, http):
            with channels(http, kid) as ws:
                probe = execute(ws, "print(x)")
                got = receive_until(ws, answered(probe))
                cut_off = ("error", GATEWAY_ERROR, CUT_OFF_REASON)
                assert summary(got, dying, replayed=True) == [
                    "busy",
                    ("stream", "before the kill\n"),
                    cut_off,
                    ("reply", "error"),
                    "idle",
                ]
                assert [summary(got, c, replayed=True) for c in (live, away, cut, never)] == [[], [], [], []]
                assert ("stream", "41\n") in summary(got, probe)
            # a second return is sent nothing again: each cell once
            with channels(http, kid) as ws:
                probe2 = execute(ws, "print('again')")
                got = receive_until(ws, answered(probe2))
                assert [summary(got, c, replayed=True) for c in (live, away, cut, dying)] == [[], [], [], []]
            # another client of the same kernel is sent nothing of this one's
            with channels(http, kid, client="someone-else") as ws:
                probe3 = execute(ws, "print('hi')", client="someone-else")
                got = receive_until(ws, answered(probe3))
                assert {m["parent_header"].get("msg_id") for m in got} <= {probe3, None}
            assert http.delete(f"/api/kernels/{kid}").status_code == 204
    finally:
        remove_everything(docker_client, name)
        shutil.rmtree(RUNTIME_DIR / name, ignore_errors=True)
    assert_nothing_left(docker_client, name)


def test_a_cell_cut_off_by_sigterm_that_ends_while_its_client_is_away_is_sent_as_it_ended(
    docker_client: docker.DockerClient, tmp_path: Path, database_url: str | None
) -> None:
    """The two ends the first test's client does not see, each at a moment the
    test sets: a cell the new gateway followed to its end before the client came
    back is sent with its real status and the output it printed after the stop;
    one that ended between the two gateways is sent ``dead``, saying its end was
    not seen. (With a 6 s sleep instead of a file, which end the first test got
    depended on the restart's speed: once, on a loaded machine, the followed
    cell had ended ok before the client was back, and the client was sent ``ok``
    without its later output, which the replay dropped.)"""
    name = f"jfol{os.getpid()}{'p' if database_url else 's'}"
    data, log = tmp_path / "data", tmp_path / "gateway.log"
    before = ("stream", "before the stop\n")
    try:
        with serve(name, data, log, database_url) as (proc, http):
            resp = http.post("/api/kernels", json={"name": "python3"})
            assert resp.status_code == 201, resp.text
            kid = resp.json()["id"]
            with channels(http, kid) as ws:
                followed = execute(ws, waiting_cell(GO_FOLLOWED))
            wait_stored(http, kid, followed, lambda e: "before the stop" in stdout_of(e))
            sigterm(proc, log)
        kernel = kernel_container(docker_client, name)

        # the cell ends once the next gateway follows it, the client still away
        with serve(name, data, log, database_url) as (proc, http):
            until_following(http, kid)
            touch(kernel, GO_FOLLOWED)
            wait_stored(http, kid, followed, lambda e: e["status"] == "ok")
            with channels(http, kid) as ws:
                probe = execute(ws, "print('back')")
                got = receive_until(ws, answered(probe))
                after = ("stream", "after the stop\n")
                assert summary(got, followed, replayed=True) == ["busy", before, after, ("reply", "ok"), "idle"]
                assert summary(got, followed) == summary(got, followed, replayed=True), "it ended before"
                # the next cell ends while no gateway is connected
                missed = execute(ws, waiting_cell(GO_MISSED, done=DONE_MISSED))
            wait_stored(http, kid, missed, lambda e: "before the stop" in stdout_of(e))
            sigterm(proc, log)
        touch(kernel, GO_MISSED)
        # its last statement ran: the kernel sends its idle within milliseconds,
        # the next gateway connects seconds later
        until_exists(kernel, DONE_MISSED)

        with serve(name, data, log, database_url) as (proc, http):
            wait_stored(http, kid, missed, lambda e: e["reason"] == FOLLOW_MISSED)
            with channels(http, kid) as ws:
                probe = execute(ws, "print('back again')")
                got = receive_until(ws, answered(probe))
                unseen = ("error", GATEWAY_ERROR, FOLLOW_MISSED)
                assert summary(got, missed, replayed=True) == ["busy", before, unseen, ("reply", "error"), "idle"]
                assert summary(got, followed) == [], "each cell is sent once"
                assert ("stream", "back again\n") in summary(got, probe)
            assert http.delete(f"/api/kernels/{kid}").status_code == 204
    finally:
        remove_everything(docker_client, name)
        shutil.rmtree(RUNTIME_DIR / name, ignore_errors=True)
    assert_nothing_left(docker_client, name)


def test_jupyter_kernels_are_culled_by_the_idle_policy_once_no_channels_are_open(
    docker_client: docker.DockerClient,
) -> None:
    gw = start_gateway(gateway_settings(gateway_name=f"jcull{os.getpid()}", idle_timeout_s=2, reap_interval_s=0.5))
    try:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            kid = http.post("/api/kernels", json={}).json()["id"]
            ws_url = gw.ws_url + f"/api/kernels/{kid}/channels?session_id=c"
            with connect(ws_url, open_timeout=60) as ws:
                msg_id = execute(ws, "print(1)", client="c")
                receive_until(ws, answered(msg_id))
                # a control kernel, idle from now on with no channels open: once the
                # reaper culled it, it would have culled the first one too (idle for
                # longer), were it not for its open WebSocket (a wait on that, not a sleep)
                control = http.post("/api/kernels", json={}).json()["id"]
                deadline = time.monotonic() + 60
                while http.get(f"/api/kernels/{control}").status_code == 200:
                    assert time.monotonic() < deadline, "the control kernel was never culled"
                    time.sleep(0.2)
                assert http.get(f"/v1/sessions/{control}/history").json()["end_reason"] == "reaped"
                assert http.get(f"/api/kernels/{kid}").status_code == 200, "an open WebSocket keeps its kernel"
            deadline = time.monotonic() + 60
            while http.get(f"/api/kernels/{kid}").status_code == 200:
                assert time.monotonic() < deadline, "the kernel was never culled"
                time.sleep(0.5)
            assert http.get(f"/api/kernels/{kid}").status_code == 404
            assert http.get(f"/v1/sessions/{kid}/history").json()["end_reason"] == "reaped"
    finally:
        gw.stop()


def test_a_kernel_culled_with_idle_action_pause_is_resumed_by_its_channels_client(
    docker_client: docker.DockerClient,
) -> None:
    gw = start_gateway(
        gateway_settings(
            gateway_name=f"jpause{os.getpid()}", idle_timeout_s=2, reap_interval_s=0.5, idle_action="pause"
        )
    )
    try:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            kid = http.post("/api/kernels", json={}).json()["id"]
            ws_url = gw.ws_url + f"/api/kernels/{kid}/channels?session_id=p"
            with connect(ws_url, open_timeout=60) as ws:
                msg_id = execute(ws, "kept = 'across the pause'", client="p")
                receive_until(ws, answered(msg_id))
            deadline = time.monotonic() + 60
            while http.get(f"/v1/sessions/{kid}").json()["state"] != "paused":
                assert time.monotonic() < deadline, "the kernel was never culled"
                time.sleep(0.5)
            assert http.get(f"/api/kernels/{kid}").status_code == 200, "a paused kernel is still listed"
            t0 = time.monotonic()
            with connect(ws_url, open_timeout=60) as ws:
                msg_id = execute(ws, "print(kept)", client="p")
                got = receive_until(ws, answered(msg_id))
            print(f"resume through the channels, to the cell's answer: {time.monotonic() - t0:.2f}s")
            assert ("stream", "across the pause\n") in summary(got, msg_id)
            assert http.get(f"/v1/sessions/{kid}").json()["state"] in ("idle", "busy")
            http.delete(f"/api/kernels/{kid}")
    finally:
        gw.stop()
