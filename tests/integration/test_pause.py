"""Pause and resume: the container goes away while a session is paused, and the
session comes back with its variables and files; what cannot be pickled is
named, and a replay rebuilds it."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import httpx
import pytest

from kernelgw.runtime.backends.labels import LABEL_SESSION, LABEL_STORE
from tests.integration.conftest import (
    RunningGateway,
    assert_nothing_left,
    gateway_settings,
    run,
    start_gateway,
    stdout,
)

pytestmark = pytest.mark.integration


def containers_of(client: docker.DockerClient, sid: str) -> list[str]:
    """The session's kernel and store containers, running or not."""
    found = client.containers.list(all=True, filters={"label": f"{LABEL_SESSION}={sid}"})
    found += client.containers.list(all=True, filters={"label": f"{LABEL_STORE}={sid}"})
    return [str(c.name) for c in found]


def test_pause_frees_the_container_and_resume_gives_back_variables_and_files(
    docker_client: docker.DockerClient, gateway: RunningGateway, http: httpx.Client, session_id: str
) -> None:
    sid = session_id
    assert http.put(f"/v1/sessions/{sid}/files/in.csv", content=b"x\n1\n2\n3\n").status_code == 201
    cells = [
        "import pandas as pd\ndf = pd.read_csv('in.csv')",
        "def double(v):\n    return 2 * v",
        "df['y'] = double(df.x)",
        "log = open('/tmp/log.txt', 'w')",  # an open file cannot be pickled
        "gen = (i for i in range(3))",  # nor a generator
    ]
    for code in cells:
        assert run(http, sid, code)["status"] == "ok", code

    resp = http.post(f"/v1/sessions/{sid}/pause")
    assert resp.status_code == 200, resp.text
    paused = resp.json()
    assert paused["state"] == "paused" and paused["stored_bytes"] > 0
    namespace = paused["namespace"]
    assert {"df", "double"} <= set(namespace["names"]) and namespace["modules"].get("pd") == "pandas"
    assert set(namespace["failed"]) == {"log", "gen"}, namespace["failed"]
    # nothing of the session runs while it is paused; its state is on the gateway's disk
    assert containers_of(docker_client, sid) == []
    snapshot = Path(gateway.settings.data_dir) / "paused" / sid
    assert snapshot.is_dir() and any(snapshot.iterdir())
    assert http.get(f"/v1/sessions/{sid}").json()["state"] == "paused"
    # a second pause is refused; so is a resume of a session that is not paused
    assert http.post(f"/v1/sessions/{sid}/pause").status_code == 409

    resp = http.post(f"/v1/sessions/{sid}/resume")
    assert resp.status_code == 200, resp.text
    resumed = resp.json()
    assert resumed["state"] == "idle" and resumed["replay"] is None
    assert {"df", "double"} <= set(resumed["namespace"]["names"]) and resumed["namespace"]["failed"] == {}
    assert stdout(run(http, sid, "print(int(df.y.sum()), double(21), pd.__name__)")) == "12 42 pandas\n"
    assert stdout(run(http, sid, "print(open('in.csv').read().split())")) == "['x', '1', '2', '3']\n"
    assert stdout(run(http, sid, "print('gen' in dir(), 'log' in dir())")) == "False False\n"
    assert not snapshot.exists()
    assert len(containers_of(docker_client, sid)) >= 1
    assert http.post(f"/v1/sessions/{sid}/resume").status_code == 409


def test_what_cannot_be_pickled_is_rebuilt_by_replay_and_the_next_request_resumes(
    http: httpx.Client, session_id: str
) -> None:
    sid = session_id
    run(http, sid, "squares = (i * i for i in range(100))\nnext(squares)\ntotal = sum(range(10))")
    run(http, sid, "total += 1")  # the saved value is the one to keep
    paused = http.post(f"/v1/sessions/{sid}/pause").json()
    assert "squares" in paused["namespace"]["failed"] and "generator" in paused["namespace"]["failed"]["squares"]
    resumed = http.post(f"/v1/sessions/{sid}/resume", json={"replay": True}).json()
    assert resumed["replay"]["trigger"] == "resume" and resumed["replay"]["complete"] is True
    # the generator is rebuilt by the replay (where the cells left it), total is the saved value
    assert stdout(run(http, sid, "print(total, next(squares))")) == "46 1\n"

    # the next execute resumes a paused session by itself
    assert http.post(f"/v1/sessions/{sid}/pause").status_code == 200
    result = run(http, sid, "print(total)")
    assert result["status"] == "ok" and stdout(result) == "46\n"
    # so does a file request
    assert http.post(f"/v1/sessions/{sid}/pause").status_code == 200
    assert http.get(f"/v1/sessions/{sid}/files").status_code == 200
    assert http.get(f"/v1/sessions/{sid}").json()["state"] == "idle"


def test_a_busy_session_is_not_paused_and_a_deleted_paused_one_leaves_nothing(
    docker_client: docker.DockerClient, gateway: RunningGateway, http: httpx.Client
) -> None:
    sid = http.post("/v1/sessions", json={}).json()["id"]
    with httpx.Client(base_url=gateway.url, timeout=60) as other:
        import threading

        cell = threading.Thread(target=run, args=(other, sid, "import time; time.sleep(3)"))
        cell.start()
        deadline = time.monotonic() + 30
        while http.get(f"/v1/sessions/{sid}").json()["state"] != "busy":  # the cell runs
            assert time.monotonic() < deadline, "the cell never started"
            time.sleep(0.05)
        busy = http.post(f"/v1/sessions/{sid}/pause")
        cell.join()
    assert busy.status_code == 409 and "idle" in busy.json()["error"]["message"], busy.text
    assert http.post(f"/v1/sessions/{sid}/pause").status_code == 200
    snapshot = Path(gateway.settings.data_dir) / "paused" / sid
    assert snapshot.is_dir()
    assert http.delete(f"/v1/sessions/{sid}").status_code == 204
    assert not snapshot.exists() and containers_of(docker_client, sid) == []


def test_idle_sessions_are_paused_instead_of_ended(docker_client: docker.DockerClient) -> None:
    settings = gateway_settings(
        gateway_name=f"{gateway_settings().gateway_name}ip", idle_action="pause", idle_timeout_s=1, reap_interval_s=0.5
    )
    gw = start_gateway(settings)
    try:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            run(http, sid, "kept = 'across the pause'")
            deadline = time.monotonic() + 30
            while http.get(f"/v1/sessions/{sid}").json()["state"] != "paused":
                assert time.monotonic() < deadline, "never paused"
                time.sleep(0.3)
            assert containers_of(docker_client, sid) == []
            assert stdout(run(http, sid, "print(kept)")) == "across the pause\n"
    finally:
        gw.stop()


def test_a_paused_session_survives_a_gateway_restart(docker_client: docker.DockerClient) -> None:
    name = f"{gateway_settings().gateway_name}pr"
    settings = gateway_settings(gateway_name=name, data_dir=f"/tmp/kgwt-data-{name}", on_shutdown="keep")
    stray = Path(settings.data_dir) / "paused" / "no-such-session"
    first = start_gateway(settings)
    try:
        with httpx.Client(base_url=first.url, timeout=120) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            run(http, sid, "kept = [1, 2, 3]\nopen('notes.txt', 'w').write('paused')")
            assert http.post(f"/v1/sessions/{sid}/pause").status_code == 200
    finally:
        first.stop()
    stray.mkdir(parents=True)  # a snapshot no session owns

    second = start_gateway(settings)
    try:
        with httpx.Client(base_url=second.url, timeout=120) as http:
            assert http.get(f"/v1/sessions/{sid}").json()["state"] == "paused"
            assert containers_of(docker_client, sid) == []
            assert not stray.exists()
            result = run(http, sid, "print(sum(kept), open('notes.txt').read())")
            assert stdout(result) == "6 paused\n", result["events"][-1]
    finally:
        second.stop()
    assert not (Path(settings.data_dir) / "paused" / sid).exists()

    # the cells from before the pause still count for a replay after yet another restart
    third = start_gateway(settings.model_copy(update={"on_shutdown": "stop"}))
    try:
        with httpx.Client(base_url=third.url, timeout=120) as http:
            report = http.post(f"/v1/sessions/{sid}/restart", json={"replay": True}).json()["replay"]
            assert report["complete"] is True and report["replayed"] == 2, report
            assert stdout(run(http, sid, "print(sum(kept))")) == "6\n"
    finally:
        third.stop()


# ------------------------------------------------------------------ restarts

FILES_AND_PACKAGE = (
    "open('kept.txt', 'w').write('mine')\nopen('/opt/kernelgw/packages/keptpkg.py', 'w').write('VALUE = 7')"
)
AFTER_RESTART = (
    "import os, keptpkg\n"
    "print(globals().get('x'), globals().get('y'), open('kept.txt').read(), keptpkg.VALUE,"
    " os.path.exists('.kernelgw-namespace'))"
)


@pytest.mark.parametrize("face", ["v1", "jupyter", "v1 with replay"])
def test_a_restart_of_a_paused_session_keeps_its_files_and_packages_not_its_variables(
    docker_client: docker.DockerClient, gateway: RunningGateway, http: httpx.Client, face: str
) -> None:
    """A restart means fresh variables, not lost files: a paused session restarted
    (over /v1 or Jupyter's /api/kernels) gets a new kernel with its snapshot's files
    and packages, none of its variables (with replay: those its cells rebuild),
    and nothing of the pause is left: no snapshot, no bytes held, one kernel."""
    sid = http.post("/v1/sessions", json={}).json()["id"]
    snapshot = Path(gateway.settings.data_dir) / "paused" / sid
    try:
        held = paused_metric(http)
        assert run(http, sid, FILES_AND_PACKAGE, replay=False)["status"] == "ok"  # a replay does not write them
        assert run(http, sid, "x = 41\ny = open('kept.txt').read()")["status"] == "ok"
        assert http.post(f"/v1/sessions/{sid}/pause").status_code == 200
        assert snapshot.is_dir() and paused_metric(http) > held

        if face == "jupyter":
            resp = http.post(f"/api/kernels/{sid}/restart")
            assert resp.status_code == 200, resp.text
            assert resp.json()["execution_state"] == "idle", resp.json()
        else:
            resp = http.post(f"/v1/sessions/{sid}/restart", json={"replay": face == "v1 with replay"})
            assert resp.status_code == 200, resp.text
            assert resp.json()["state"] == "idle", resp.json()
        if face == "v1 with replay":
            # the lineage from before the pause, after the files (the cell reads one)
            report = resp.json()["replay"]
            assert report["trigger"] == "requested" and report["complete"] is True and report["replayed"] == 1, report
        assert http.get(f"/v1/sessions/{sid}").json()["state"] == "idle"
        # the snapshot went into the new kernel and is gone, its bytes given back
        assert not snapshot.exists()
        assert paused_metric(http) == held
        kernels = docker_client.containers.list(all=True, filters={"label": f"{LABEL_SESSION}={sid}"})
        assert [c.status for c in kernels] == ["running"]

        rebuilt = "41 mine" if face == "v1 with replay" else "None None"
        assert stdout(run(http, sid, AFTER_RESTART)) == f"{rebuilt} mine 7 False\n"
        assert http.post(f"/v1/sessions/{sid}/resume").status_code == 409  # not paused any more
    finally:
        http.delete(f"/v1/sessions/{sid}")
    assert not snapshot.exists() and containers_of(docker_client, sid) == []


def test_a_paused_session_restarted_is_running_for_the_next_gateway(docker_client: docker.DockerClient) -> None:
    """The store knows a restarted paused session runs: the next gateway reattaches
    its new kernel rather than bringing back the old snapshot over it."""
    name = f"{gateway_settings().gateway_name}pk"
    settings = gateway_settings(gateway_name=name, data_dir=f"/tmp/kgwt-data-{name}", on_shutdown="keep")
    first = start_gateway(settings)
    try:
        with httpx.Client(base_url=first.url, timeout=120) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            run(http, sid, "old = 1\nopen('kept.txt', 'w').write('mine')")
            assert http.post(f"/v1/sessions/{sid}/pause").status_code == 200
            assert http.post(f"/v1/sessions/{sid}/restart").status_code == 200
            run(http, sid, "new = 2")
    finally:
        first.stop()

    second = start_gateway(settings.model_copy(update={"on_shutdown": "stop"}))
    try:
        with httpx.Client(base_url=second.url, timeout=120) as http:
            assert http.get(f"/v1/sessions/{sid}").json()["state"] == "idle"
            result = run(http, sid, "print(new, 'old' in dir(), open('kept.txt').read())")
            assert stdout(result) == "2 False mine\n", result["events"][-1]
            assert not (Path(settings.data_dir) / "paused" / sid).exists()
    finally:
        second.stop()
    assert_nothing_left(docker_client, name)


# ------------------------------------------------------------------ bounds


def snapshot_size(gw: RunningGateway, sid: str) -> int:
    directory = Path(gw.settings.data_dir) / "paused" / sid
    return sum(f.stat().st_size for f in directory.iterdir())


def paused_metric(http: httpx.Client) -> float:
    (line,) = [
        line for line in http.get("/metrics").text.splitlines() if line.startswith("kernelgw_paused_snapshot_bytes ")
    ]
    return float(line.split()[1])


@pytest.fixture(scope="module")
def small(docker_client: docker.DockerClient) -> Iterator[RunningGateway]:
    """A gateway with a 16 MiB workspace."""
    name = f"{gateway_settings().gateway_name}ps"
    gw = start_gateway(gateway_settings(gateway_name=name, data_dir=f"/tmp/kgwt-data-{name}", workspace_size_mb=16))
    yield gw
    gw.stop()
    assert_nothing_left(docker_client, name)
    paused = Path(gw.settings.data_dir) / "paused"
    assert not paused.exists() or not any(paused.iterdir())


def test_a_snapshot_past_the_tmpfs_sizes_is_refused_and_the_session_runs_on(small: RunningGateway) -> None:
    with httpx.Client(base_url=small.url, timeout=120) as http:
        sid = http.post("/v1/sessions", json={}).json()["id"]
        try:
            # 40,000 empty files take no tmpfs blocks but a 512-byte tar header each:
            # 20 MiB of stream, past the 17 MiB a 16 MiB workspace may give
            code = "import os\nos.mkdir('many')\nfor i in range(40000): open(f'many/{i}', 'w').close()\nkept = 7"
            assert run(http, sid, code)["status"] == "ok"
            resp = http.post(f"/v1/sessions/{sid}/pause")
            assert resp.status_code == 413, resp.text
            error = resp.json()["error"]
            assert error["code"] == "snapshot_too_large" and "workspace_size_mb" in error["message"], error
            assert "goes on running" in error["message"]
            # nothing kept of the attempt, the session as it was
            assert not (Path(small.settings.data_dir) / "paused" / sid).exists()
            assert paused_metric(http) == 0
            assert http.get(f"/v1/sessions/{sid}").json()["state"] == "idle"
            assert stdout(run(http, sid, "print(kept, len(os.listdir('many')))")) == "7 40000\n"
            # with room again it pauses
            assert run(http, sid, "import shutil; shutil.rmtree('many')")["status"] == "ok"
            assert http.post(f"/v1/sessions/{sid}/pause").status_code == 200
            assert stdout(run(http, sid, "print(kept)")) == "7\n"
        finally:
            http.delete(f"/v1/sessions/{sid}")


def test_variables_that_do_not_fit_the_workspace_are_refused_not_lost(small: RunningGateway) -> None:
    """The pickled variables pass through the workspace: 20 MiB of them in a
    16 MiB workspace answered 200 with ``failed: {"*": "No space left on
    device"}``, and the resume brought back none of them, ``kept`` included."""
    with httpx.Client(base_url=small.url, timeout=120) as http:
        sid = http.post("/v1/sessions", json={}).json()["id"]
        try:
            assert run(http, sid, "import os\nbig = os.urandom(20 << 20)\nkept = 7")["status"] == "ok"
            resp = http.post(f"/v1/sessions/{sid}/pause")
            assert resp.status_code == 413, resp.text
            error = resp.json()["error"]
            assert error["code"] == "snapshot_too_large", error
            assert "No space left on device" in error["message"] and "goes on running" in error["message"], error
            assert not (Path(small.settings.data_dir) / "paused" / sid).exists()
            assert http.get(f"/v1/sessions/{sid}").json()["state"] == "idle"
            assert stdout(run(http, sid, "print(len(big) >> 20, kept, os.listdir('.'))")) == "20 7 []\n"
            # without the big one it pauses, and comes back with the rest
            assert run(http, sid, "del big")["status"] == "ok"
            assert http.post(f"/v1/sessions/{sid}/pause").status_code == 200
            assert stdout(run(http, sid, "print(kept)")) == "7\n"
        finally:
            http.delete(f"/v1/sessions/{sid}")


def test_a_pause_past_the_gateway_budget_is_a_507_and_the_session_runs_on(docker_client: docker.DockerClient) -> None:
    name = f"{gateway_settings().gateway_name}pb"
    small = start_gateway(gateway_settings(gateway_name=name, data_dir=f"/tmp/kgwt-data-{name}", paused_budget_mb=4))
    with httpx.Client(base_url=small.url, timeout=120) as http:
        first = http.post("/v1/sessions", json={}).json()["id"]
        second = http.post("/v1/sessions", json={}).json()["id"]
        try:
            run(http, first, "a = 1")
            assert http.post(f"/v1/sessions/{first}/pause").status_code == 200
            held = snapshot_size(small, first)
            assert paused_metric(http) == held > 0
            # 5 MiB of data that does not compress: fits the workspace, not the budget
            assert (
                run(http, second, "open('data.bin', 'wb').write(__import__('os').urandom(5 << 20))\nb = 2")["status"]
                == "ok"
            )
            resp = http.post(f"/v1/sessions/{second}/pause")
            assert resp.status_code == 507, resp.text
            error = resp.json()["error"]
            assert error["code"] == "paused_budget_exceeded" and "paused_budget_mb" in error["message"], error
            assert not (Path(small.settings.data_dir) / "paused" / second).exists()
            assert paused_metric(http) == held  # the refused pause gave back what it took
            assert http.get(f"/v1/sessions/{second}").json()["state"] == "idle"
            assert stdout(run(http, second, "print(b, __import__('os').path.getsize('data.bin'))")) == f"2 {5 << 20}\n"
            # a resume gives the bytes back
            assert http.post(f"/v1/sessions/{first}/resume").status_code == 200
            assert paused_metric(http) == 0
        finally:
            http.delete(f"/v1/sessions/{first}")
            http.delete(f"/v1/sessions/{second}")
            small.stop()
    assert_nothing_left(docker_client, name)


def test_a_resume_that_does_not_fit_is_a_413_and_the_session_stays_paused_and_resumable(
    small: RunningGateway,
) -> None:
    with httpx.Client(base_url=small.url, timeout=120) as http:
        sid = http.post("/v1/sessions", json={}).json()["id"]
        try:
            run(http, sid, "kept = 'still here'\nopen('notes.txt', 'w').write('mine')")
            assert http.post(f"/v1/sessions/{sid}/pause").status_code == 200
            # a snapshot that no longer fits, as an older gateway wrote them (a sparse
            # file stored whole): 20 MiB of data for a 16 MiB workspace
            part = Path(small.settings.data_dir) / "paused" / sid / "workspace.tar"
            original = part.read_bytes()
            big = tarfile.TarInfo("big.bin")
            big.size = 20 << 20
            with tarfile.open(part, "a") as tar:
                tar.addfile(big, io.BytesIO(bytes(big.size)))
            resp = http.post(f"/v1/sessions/{sid}/resume")
            assert resp.status_code == 413, resp.text
            error = resp.json()["error"]
            assert "does not fit" in error["message"] and "workspace_size_mb" in error["message"], error
            assert http.get(f"/v1/sessions/{sid}").json()["state"] == "paused"
            assert part.exists() and containers_of(docker.from_env(), sid) == []
            # the snapshot was kept: with one that fits the same session resumes
            part.write_bytes(original)
            resp = http.post(f"/v1/sessions/{sid}/resume")
            assert resp.status_code == 200, resp.text
            assert stdout(run(http, sid, "print(kept, open('notes.txt').read())")) == "still here mine\n"
        finally:
            http.delete(f"/v1/sessions/{sid}")


def test_a_session_paused_past_its_ttl_is_ended_with_the_reason(docker_client: docker.DockerClient) -> None:
    name = f"{gateway_settings().gateway_name}pt"
    settings = gateway_settings(
        gateway_name=name, data_dir=f"/tmp/kgwt-data-{name}", paused_ttl_s=1, reap_interval_s=0.2
    )
    gw = start_gateway(settings)
    try:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            run(http, sid, "x = 1")
            assert http.post(f"/v1/sessions/{sid}/pause").status_code == 200
            snapshot = Path(settings.data_dir) / "paused" / sid
            assert snapshot.is_dir()
            deadline = time.monotonic() + 30
            while http.get(f"/v1/sessions/{sid}").status_code != 404:
                assert time.monotonic() < deadline, "the paused session never expired"
                time.sleep(0.1)
            assert not snapshot.exists()
            assert paused_metric(http) == 0
            history = http.get(f"/v1/sessions/{sid}/history")
            while history.json().get("end_reason") is None:  # the end is written behind the answer
                assert time.monotonic() < deadline, history.text
                time.sleep(0.05)
                history = http.get(f"/v1/sessions/{sid}/history")
            assert "paused_ttl_s" in history.json()["end_reason"], history.json()["end_reason"]
    finally:
        gw.stop()
    assert_nothing_left(docker_client, name)


def test_an_idle_session_whose_pause_finds_no_room_is_ended_with_the_reason(
    docker_client: docker.DockerClient,
) -> None:
    name = f"{gateway_settings().gateway_name}pi"
    settings = gateway_settings(
        gateway_name=name,
        data_dir=f"/tmp/kgwt-data-{name}",
        idle_action="pause",
        idle_timeout_s=1,
        reap_interval_s=0.3,
        paused_budget_mb=1,
    )
    gw = start_gateway(settings)
    try:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            sid = http.post("/v1/sessions", json={}).json()["id"]
            run(http, sid, "open('data.bin', 'wb').write(__import__('os').urandom(2 << 20))")
            # tried once, in vain, it is not tried again every round: it ends as idle_action=end would
            deadline = time.monotonic() + 30
            while http.get(f"/v1/sessions/{sid}").status_code != 404:
                assert time.monotonic() < deadline, "the idle session was neither paused nor ended"
                time.sleep(0.1)
            history = http.get(f"/v1/sessions/{sid}/history")
            while history.json().get("end_reason") is None:  # the end is written behind the answer
                assert time.monotonic() < deadline, history.text
                time.sleep(0.05)
                history = http.get(f"/v1/sessions/{sid}/history")
            reason = history.json()["end_reason"]
            assert "could not be paused" in reason and "paused_budget_mb" in reason, reason
            assert not (Path(settings.data_dir) / "paused" / sid).exists()
    finally:
        gw.stop()
    assert_nothing_left(docker_client, name)
