"""Warm pool hand-over and Prometheus metrics, on a real engine."""

from __future__ import annotations

import time
from collections.abc import Iterator

import docker
import httpx
import pytest

from tests.integration.conftest import RunningGateway, conn_dir_of, gateway_settings, run, start_gateway, stdout
from tests.support.metrics import metric

pytestmark = pytest.mark.integration


def wait_for(predicate, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pooled(gateway: RunningGateway) -> Iterator[RunningGateway]:
    gw = start_gateway(gateway_settings(gateway_name=f"{gateway.settings.gateway_name}p", pool_size=2))
    yield gw
    gw.stop()


@pytest.fixture
def phttp(pooled: RunningGateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=pooled.url, timeout=120) as client:
        wait_for(lambda: metric(client, "kernelgw_pool_ready") >= 2)
        yield client


def container_of(client: docker.DockerClient, sid: str):  # type: ignore[no-untyped-def]
    (container,) = client.containers.list(filters={"label": f"kernelgw.session={sid}"})
    return container


def test_pooled_session_is_a_hit_and_indistinguishable_from_a_fresh_one(
    docker_client: docker.DockerClient, phttp: httpx.Client
) -> None:
    hits = metric(phttp, "kernelgw_pool_hits_total")
    first = phttp.post("/v1/sessions", json={}).json()["id"]
    assert metric(phttp, "kernelgw_pool_hits_total") == hits + 1
    run(phttp, first, "secret = 'from the first session'\nopen('leak.txt', 'w').write('x')\nimport json")
    first_container = container_of(docker_client, first)
    first_dir = conn_dir_of(first_container)
    phttp.delete(f"/v1/sessions/{first}")

    second = phttp.post("/v1/sessions", json={}).json()["id"]
    try:
        assert second != first
        out = stdout(run(phttp, second, ("import os\nprint('secret' in dir(), 'json' in dir(), os.listdir('.'))\n")))
        assert out == "False False []\n"
        second_container = container_of(docker_client, second)
        assert second_container.id != first_container.id
        assert conn_dir_of(second_container) != first_dir
        # limits are applied exactly as for a cold session
        host = second_container.attrs["HostConfig"]
        assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
        assert host["Memory"] == 512 * 1024 * 1024 and host["CapDrop"] == ["ALL"]
        # the HMAC key is the kernel's own
        key_a = first_container.attrs["Config"]["Labels"]["kernelgw.kernel"]
        key_b = second_container.attrs["Config"]["Labels"]["kernelgw.kernel"]
        assert key_a != key_b
    finally:
        phttp.delete(f"/v1/sessions/{second}")


def test_pooled_namespace_equals_a_cold_one_and_env_is_delivered(
    gateway: RunningGateway, http: httpx.Client, phttp: httpx.Client
) -> None:
    # the pooled kernel ran its warm-up cell: it must leave no trace that a cold
    # kernel does not have (names, In/Out, _, the execution count, history)
    probe = (
        "ip = get_ipython()\n"
        "print(sorted(k for k in dir() if not k.startswith('_')), len(In), len(Out), repr(_), "
        "ip.execution_count, len(list(ip.history_manager.get_range())))"
    )
    cold = http.post("/v1/sessions", json={}).json()["id"]
    warm = phttp.post("/v1/sessions", json={"env": {"REGION": "eu", "MODE": "test"}}).json()["id"]
    try:
        seen = stdout(run(phttp, warm, probe))
        assert seen == stdout(run(http, cold, probe)), seen
        # In holds '' and this cell, Out nothing, _ untouched, and IPython's counter
        # already points past this first cell
        assert seen.split("] ", 1)[1].split()[:4] == ["2", "0", "''", "2"], seen
        assert stdout(run(phttp, warm, "import os\nprint(os.environ['REGION'], os.environ['MODE'])")) == "eu test\n"
        # nothing gateway-internal went into the history of the session
        info = phttp.get(f"/v1/sessions/{warm}").json()
        assert info["execution_count"] == 2
    finally:
        http.delete(f"/v1/sessions/{cold}")
        phttp.delete(f"/v1/sessions/{warm}")


def test_pool_refills_and_concurrent_creates_never_share_a_kernel(phttp: httpx.Client) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(lambda _: phttp.post("/v1/sessions", json={}).json()["id"], range(4)))
    try:
        assert len(set(ids)) == 4
        outs = [stdout(run(phttp, sid, f"x = '{sid}'\nimport os\nprint(os.getpid(), x)")) for sid in ids]
        assert all(out.split()[1] == sid for out, sid in zip(outs, ids, strict=True))
        # two came from the pool, two started cold (misses), and the pool refills
        wait_for(lambda: metric(phttp, "kernelgw_pool_ready") >= 2)
        assert metric(phttp, "kernelgw_pool_misses_total") >= 2
    finally:
        for sid in ids:
            phttp.delete(f"/v1/sessions/{sid}")


def test_non_default_profile_starts_cold(phttp: httpx.Client) -> None:
    misses = metric(phttp, "kernelgw_pool_misses_total")
    sid = phttp.post("/v1/sessions", json={"memory_mb": 300}).json()["id"]
    try:
        assert run(phttp, sid, "1")["status"] == "ok"
        assert metric(phttp, "kernelgw_session_start_seconds_count", '{source="cold"}') >= 1
        assert metric(phttp, "kernelgw_pool_misses_total") == misses  # no pool for it: not a miss
    finally:
        phttp.delete(f"/v1/sessions/{sid}")


def test_metrics_reflect_real_events(phttp: httpx.Client) -> None:
    sid = phttp.post("/v1/sessions", json={}).json()["id"]
    try:
        before = {
            s: metric(phttp, "kernelgw_executions_total", f'{{status="{s}"}}', absent=0)
            for s in ("ok", "error", "timeout")
        }
        out_before = metric(phttp, "kernelgw_output_bytes_total")
        run(phttp, sid, "print('x' * 1000)")
        run(phttp, sid, "1/0")
        run(phttp, sid, "while True: pass", timeout=1)
        assert metric(phttp, "kernelgw_executions_total", '{status="ok"}') == before["ok"] + 1
        assert metric(phttp, "kernelgw_executions_total", '{status="error"}') == before["error"] + 1
        assert metric(phttp, "kernelgw_executions_total", '{status="timeout"}') == before["timeout"] + 1
        assert metric(phttp, "kernelgw_timeouts_total") >= 1
        assert metric(phttp, "kernelgw_output_bytes_total") >= out_before + 1001
        assert metric(phttp, "kernelgw_sessions_active") >= 1
        restarts = metric(phttp, "kernelgw_kernel_restarts_total", '{reason="requested"}', absent=0)
        phttp.post(f"/v1/sessions/{sid}/restart")
        assert metric(phttp, "kernelgw_kernel_restarts_total", '{reason="requested"}') == restarts + 1
    finally:
        phttp.delete(f"/v1/sessions/{sid}")


def test_oom_kill_is_counted(phttp: httpx.Client) -> None:
    sid = phttp.post("/v1/sessions", json={"memory_mb": 256}).json()["id"]
    try:
        before = metric(phttp, "kernelgw_oom_kills_total")
        result = run(phttp, sid, "x = []\nwhile True:\n    x.append(bytearray(50 * 1024 * 1024))")
        assert result["status"] == "dead"
        assert metric(phttp, "kernelgw_oom_kills_total") == before + 1, result["events"][-1]
    finally:
        phttp.delete(f"/v1/sessions/{sid}")
