"""E2B's control plane on a real gateway (uvicorn on loopback, keys required, two
keys) over kernel subprocesses, driven by E2B's own async SDK where it has a call
and by plain HTTP for the wire details. Pause, resume and fork need the engine
(files move with tar): tests/integration/e2b/test_control.py has them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import AsyncSandbox, SandboxQuery, SandboxState
from e2b.exceptions import (
    AuthenticationException,
    InvalidArgumentException,
    RateLimitException,
    SandboxException,
    SandboxNotFoundException,
)
from e2b_code_interpreter import AsyncSandbox as AsyncCodeSandbox

from kernelgw.server.e2b.auth import ACCESS_NONCE_KEY
from kernelgw.server.e2b.models import ENVD_VERSION
from kernelgw.server.e2b.templates import TEMPLATE_KEY
from tests.support.local_backend import LocalBackend
from tests.support.waiting import until
from tests.unit.runtime.test_paused_restart import gate  # noqa: F401 (a fixture: pauses copy files with tarfile)
from tests.unit.server.jupyter.conftest import Gateway, gateway


@pytest.fixture
async def gw(local_backend: LocalBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    """The gateway, and the environment an E2B user sets (the key is alice's)."""
    async with gateway(tmp_path, local_backend, max_sessions_per_key=4) as g:
        for name, value in {
            "E2B_API_URL": f"{g.url}/e2b",
            "E2B_SANDBOX_URL": f"{g.url}/e2b",
            "E2B_API_KEY": g.alice,
            "E2B_HTTP_VERSION": "1.1",
        }.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("E2B_DOMAIN", raising=False)
        monkeypatch.delenv("E2B_DEBUG", raising=False)
        yield g


def e2b(gw: Gateway, key: str | None = None) -> httpx.AsyncClient:
    """Plain HTTP to the face, as the SDK sends it (``X-API-KEY``)."""
    headers = {"X-API-KEY": key} if key is not None else {}
    return httpx.AsyncClient(base_url=f"{gw.url}/e2b", headers=headers, timeout=60)


async def test_create_gives_a_running_sandbox_with_its_metadata_lease_and_token(gw: Gateway) -> None:
    before = datetime.now(UTC)
    sbx = await AsyncSandbox.create(metadata={"user": "alice", "run": "1"}, timeout=120)
    after = datetime.now(UTC)
    try:
        assert str(sbx._envd_version) == ENVD_VERSION
        assert sbx._envd_access_token and sbx.traffic_access_token == sbx._envd_access_token
        info = await sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.template_id == "base" and info.name == "base"
        assert info.metadata == {"user": "alice", "run": "1"}  # the face's own entries are not shown
        assert info.state == SandboxState.RUNNING
        assert before + timedelta(seconds=120) <= info.end_at <= after + timedelta(seconds=120)
        assert info.allow_internet_access is False
        assert info.network == {"deny_out": ["0.0.0.0/0"], "allow_public_traffic": False}
        assert info.lifecycle is not None and info.lifecycle["on_timeout"] == "kill"
        # the session under it: one kernelgw session of alice's, the token kept as its hash only
        async with gw.client(gw.alice, "Bearer") as v1:
            session = (await v1.get(f"/v1/sessions/{sbx.sandbox_id}")).json()
        # /v1 shows the client's labels, not the face's own entries (which the face
        # reads: the template above, the token's nonce for connect)
        assert session["metadata"] == {"user": "alice", "run": "1"}
        assert TEMPLATE_KEY not in str(session) and ACCESS_NONCE_KEY not in str(session)
        assert sbx._envd_access_token not in str(session)
    finally:
        assert await sbx.kill()
    with pytest.raises(SandboxNotFoundException):
        await sbx.get_info()
    assert not await sbx.kill()  # E2B's SDK: False when there was nothing to kill


async def test_the_code_interpreter_template_and_env_vars(gw: Gateway) -> None:
    async with e2b(gw, gw.alice) as http:
        resp = await http.post(
            "/v2/sandboxes", json={"templateID": "code-interpreter-v1", "envVars": {"GREETING": "hi"}}
        )
        assert resp.status_code == 201, resp.text
        body = resp.json()
        assert body["templateID"] == "code-interpreter-v1" and body["alias"] == "code-interpreter-v1"
        assert body["envdAccessToken"] and body["clientID"] and body["envdVersion"]
        bad = await http.post("/v2/sandboxes", json={"templateID": "base", "envVars": {"LD_PRELOAD": "/x.so"}})
        assert bad.status_code == 400 and "LD_PRELOAD" in bad.json()["message"], bad.text
        assert (await http.delete(f"/sandboxes/{body['sandboxID']}")).status_code == 204


async def test_a_create_that_repeats_its_idempotency_key_gets_the_same_sandbox(gw: Gateway) -> None:
    first = await AsyncSandbox.create(idempotency_key="job-42", timeout=120)
    try:
        again = await AsyncSandbox.create(idempotency_key="job-42", timeout=120)
        assert (again.sandbox_id, again._envd_access_token) == (first.sandbox_id, first._envd_access_token)
        other = await AsyncSandbox.create(idempotency_key="job-43", timeout=120)
        assert other.sandbox_id != first.sandbox_id
        await other.kill()
        by_bob = await AsyncSandbox.create(idempotency_key="job-42", timeout=120, api_key=gw.bob)
        assert by_bob.sandbox_id != first.sandbox_id  # a key's promise is its own
        await by_bob.kill()
        assert len(await AsyncSandbox.list().next_items()) == 1
    finally:
        await first.kill()
    after = await AsyncSandbox.create(idempotency_key="job-42", timeout=120)  # the first is gone: a new one
    assert after.sandbox_id != first.sandbox_id
    await after.kill()


async def test_the_older_create_takes_e2bs_default_timeout_of_15_s(gw: Gateway) -> None:
    async with e2b(gw, gw.alice) as http:
        before = datetime.now(UTC)
        resp = await http.post("/sandboxes", json={"templateID": "base"})
        after = datetime.now(UTC)
        assert resp.status_code == 201, resp.text
        sid = resp.json()["sandboxID"]
        ends = datetime.fromisoformat((await http.get(f"/sandboxes/{sid}")).json()["endAt"])
        assert before + timedelta(seconds=15) <= ends <= after + timedelta(seconds=15)
        await http.delete(f"/sandboxes/{sid}")


async def test_list_filters_by_metadata_and_state_and_pages(gw: Gateway) -> None:
    tag = {"suite": "list & page", "ünï": "a=b"}  # characters the query encoding must carry
    mine = [await AsyncSandbox.create(metadata=tag, timeout=120) for _ in range(3)]
    other = await AsyncSandbox.create(metadata={"suite": "other"}, timeout=120)
    try:
        paginator = AsyncSandbox.list(query=SandboxQuery(metadata=tag), limit=2)
        pages = []
        while paginator.has_next:
            pages.append(await paginator.next_items())
        assert [len(p) for p in pages] == [2, 1]
        found = [s.sandbox_id for p in pages for s in p]
        assert sorted(found) == sorted(s.sandbox_id for s in mine)
        starts = [s.started_at for p in pages for s in p]
        assert starts == sorted(starts, reverse=True)  # newest first
        assert all(s.metadata == tag for p in pages for s in p)

        running = await AsyncSandbox.list(query=SandboxQuery(metadata=tag, state=[SandboxState.RUNNING])).next_items()
        assert len(running) == 3
        paused = await AsyncSandbox.list(query=SandboxQuery(metadata=tag, state=[SandboxState.PAUSED])).next_items()
        assert paused == []
        by_template = await AsyncSandbox.list(query=SandboxQuery(template="base", metadata=tag)).next_items()
        assert len(by_template) == 3
        assert (
            await AsyncSandbox.list(query=SandboxQuery(template="code-interpreter-v1", metadata=tag)).next_items() == []
        )

        async with e2b(gw, gw.alice) as http:
            resp = await http.get("/v2/sandboxes", params={"state": "running", "order": "asc"})
            assert resp.headers["X-Total-Running"] == "4"
            ids = [s["sandboxID"] for s in resp.json()]
            assert ids == [s.sandbox_id for s in [*mine, other]]  # oldest first
            older = await http.get("/sandboxes", params={"metadata": "suite=other"})
            assert [s["sandboxID"] for s in older.json()] == [other.sandbox_id]
            for query, named in (
                ({"limit": 101}, "limit"),
                ({"state": "asleep"}, "asleep"),
                ({"nextToken": "x"}, "nextToken"),
            ):
                bad = await http.get("/v2/sandboxes", params=query)
                assert bad.status_code == 400 and named in bad.json()["message"], bad.text
    finally:
        for s in [*mine, other]:
            await s.kill()


async def test_another_keys_sandbox_is_not_found_and_not_listed(gw: Gateway) -> None:
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.get_info(sbx.sandbox_id, api_key=gw.bob)
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.connect(sbx.sandbox_id, api_key=gw.bob)
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.set_timeout(sbx.sandbox_id, 30, api_key=gw.bob)
        assert not await AsyncSandbox.kill(sbx.sandbox_id, api_key=gw.bob)
        assert await AsyncSandbox.list(api_key=gw.bob).next_items() == []
        assert (await sbx.get_info()).state == SandboxState.RUNNING  # bob changed nothing
    finally:
        await sbx.kill()


async def test_a_bad_key_is_an_authentication_error(gw: Gateway) -> None:
    with pytest.raises(AuthenticationException, match="E2B_API_KEY"):
        await AsyncSandbox.create(api_key="kgw_000000000000_" + "A" * 43)
    with pytest.raises(AuthenticationException):
        await AsyncSandbox.list(api_key="not-a-key").next_items()
    async with e2b(gw) as http:  # no key at all, and the older Bearer header
        assert (await http.get("/v2/sandboxes")).status_code == 401
        assert (await http.get("/v2/sandboxes", headers={"Authorization": f"Bearer {gw.alice}"})).status_code == 200


async def test_an_unknown_template_is_e2bs_404(gw: Gateway) -> None:
    with pytest.raises(SandboxException) as missing:
        await AsyncSandbox.create("nodejs-v2")
    assert missing.value.status_code == 404
    assert "nodejs-v2" in str(missing.value) and "code-interpreter-v1" in str(missing.value)


async def test_internet_access_and_public_ports_are_refused(gw: Gateway) -> None:
    with pytest.raises(SandboxException) as refused:
        await AsyncSandbox.create(allow_internet_access=True)
    assert refused.value.status_code == 400 and "no network" in str(refused.value)
    with pytest.raises(SandboxException) as ports:
        await AsyncSandbox.create(network={"https_ports": [3000], "allow_public_traffic": True})
    assert "httpsPorts" in str(ports.value) and "allowPublicTraffic" in str(ports.value)
    # what keeps it closed is fine
    sbx = await AsyncSandbox.create(allow_internet_access=False, network={"deny_out": ["0.0.0.0/0"]})
    try:
        await sbx.update_network({"deny_out": ["0.0.0.0/0"]})
        with pytest.raises(SandboxException, match="allowOut"):
            await sbx.update_network({"allow_out": ["example.com"]})
    finally:
        await sbx.kill()
    assert await AsyncSandbox.list().next_items() == []  # none was left half made


async def test_set_timeout_moves_the_end_both_ways(gw: Gateway) -> None:
    sbx = await AsyncSandbox.create(timeout=600)
    try:
        for seconds in (60, 3600):  # sooner, then later than before
            before = datetime.now(UTC)
            await sbx.set_timeout(seconds)
            after = datetime.now(UTC)
            end = (await sbx.get_info()).end_at
            assert before + timedelta(seconds=seconds) <= end <= after + timedelta(seconds=seconds)
        with pytest.raises(SandboxException) as too_long:
            await sbx.set_timeout(10 * 86400)
        assert too_long.value.status_code == 400 and "max_lease_s" in str(too_long.value)
    finally:
        await sbx.kill()


async def test_set_timeout_0_ends_the_sandbox_as_its_timeout_would(gw: Gateway) -> None:
    """E2B's meaning: the lease runs out now (a negative timeout is taken as 0)."""
    for timeout in (0, -5):
        sbx = await AsyncSandbox.create(timeout=600)
        await sbx.set_timeout(timeout)

        async def gone(sbx: AsyncSandbox = sbx) -> bool:
            try:
                await sbx.get_info()
            except SandboxNotFoundException:
                return True
            return False

        await until(gone, f"set_timeout({timeout}) to end the sandbox")
        async with e2b(gw, gw.alice) as http:
            resp = await http.get(f"/sandboxes/{sbx.sandbox_id}")
            assert resp.status_code == 404 and "killed when its timeout ran out" in resp.json()["message"]


async def test_connect_gives_the_same_token_and_only_extends_a_running_lease(gw: Gateway) -> None:
    sbx = await AsyncSandbox.create(timeout=600)
    try:
        end = (await sbx.get_info()).end_at
        again = await AsyncSandbox.connect(sbx.sandbox_id, timeout=60)  # shorter: kept
        assert again._envd_access_token == sbx._envd_access_token
        assert (await sbx.get_info()).end_at == end
        await AsyncSandbox.connect(sbx.sandbox_id, timeout=3600)  # longer: taken
        assert (await sbx.get_info()).end_at > end + timedelta(seconds=2000)
        async with e2b(gw, gw.alice) as http:  # a running sandbox: 200 (201 is for a resumed one)
            resp = await http.post(f"/v2/sandboxes/{sbx.sandbox_id}/connect", json={"timeout": 60})
            assert resp.status_code == 200 and resp.json()["envdAccessToken"] == sbx._envd_access_token
            resumed = await http.post(f"/sandboxes/{sbx.sandbox_id}/resume", json={})
            assert resumed.status_code == 409 and "already running" in resumed.json()["message"]
        with pytest.raises(InvalidArgumentException):
            await AsyncSandbox.connect(sbx.sandbox_id, on_resume="never")  # type: ignore[arg-type]
        with pytest.raises(SandboxException, match="not supported"):
            await AsyncSandbox.connect(sbx.sandbox_id, on_resume="reboot")
    finally:
        await sbx.kill()


async def test_a_session_of_another_face_is_listed_but_has_no_token_to_connect_with(gw: Gateway) -> None:
    async with gw.client(gw.alice, "Bearer") as v1:
        sid = (await v1.post("/v1/sessions", json={})).json()["id"]
        try:
            info = await AsyncSandbox.get_info(sid)
            assert info.template_id == "code-interpreter-v1" and info.metadata == {}
            with pytest.raises(SandboxException) as refused:
                await AsyncSandbox.connect(sid)
            assert refused.value.status_code == 409 and "not created through E2B" in str(refused.value)
        finally:
            await v1.delete(f"/v1/sessions/{sid}")


async def test_a_lease_that_runs_out_ends_the_sandbox_and_says_so(gw: Gateway) -> None:
    sbx = await AsyncSandbox.create(timeout=1)

    async def gone() -> bool:
        try:
            await sbx.get_info()
        except SandboxNotFoundException:
            return True
        return False

    await until(gone, "the sandbox's 1 s lease to end it")
    async with e2b(gw, gw.alice) as http:
        resp = await http.get(f"/sandboxes/{sbx.sandbox_id}")
        assert resp.status_code == 404
        assert "killed when its timeout ran out" in resp.json()["message"]
        killed = await http.post(f"/sandboxes/{sbx.sandbox_id}/timeout", json={"timeout": 60})
        assert killed.status_code == 404 and "timeout ran out" in killed.json()["message"]
    async with e2b(gw, gw.bob) as http:  # another key learns nothing of it
        resp = await http.get(f"/sandboxes/{sbx.sandbox_id}")
        assert resp.json()["message"] == f"Sandbox {sbx.sandbox_id} not found"


async def test_the_session_limit_is_a_rate_limit_the_sdk_does_not_retry(gw: Gateway) -> None:
    made = [await AsyncSandbox.create(timeout=120) for _ in range(4)]  # max_sessions_per_key=4
    try:
        with pytest.raises(RateLimitException, match="maximum of 4 sessions"):
            await AsyncSandbox.create(timeout=120)
    finally:
        for s in made:
            await s.kill()


async def test_metrics_are_one_reading_taken_now(gw: Gateway) -> None:
    """kernelgw keeps no history of a sandbox's use: one reading, now, if now is in
    the range asked for (the real container's numbers: tests/integration/e2b/test_metrics.py)."""
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        before = datetime.now(UTC) - timedelta(seconds=1)
        (metric,) = await sbx.get_metrics()
        assert before <= metric.timestamp <= datetime.now(UTC) + timedelta(seconds=1)
        assert metric.cpu_count == 1 and 0 <= metric.cpu_used_pct <= 100
        assert 0 < metric.mem_used and metric.mem_total > 0 and 0 <= metric.disk_used <= metric.disk_total
        assert len(await AsyncSandbox.get_metrics(sbx.sandbox_id)) == 1
        assert await sbx.get_metrics(end=datetime.now(UTC) - timedelta(hours=1)) == []  # no history kept
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.get_metrics(sbx.sandbox_id, api_key=gw.bob)
        async with e2b(gw, gw.alice) as http:
            many = await http.get("/sandboxes/metrics", params={"sandbox_ids": f"{sbx.sandbox_id},not-a-sandbox"})
            assert many.status_code == 200 and list(many.json()["sandboxes"]) == [sbx.sandbox_id], many.text
            assert set(many.json()["sandboxes"][sbx.sandbox_id]) >= {"cpuUsedPct", "memUsed", "diskTotal"}
            backwards = await http.get(f"/sandboxes/{sbx.sandbox_id}/metrics", params={"start": 10, "end": 5})
            assert backwards.status_code == 400 and "after end" in backwards.json()["message"]
    finally:
        await sbx.kill()


async def test_what_is_not_served_says_so(gw: Gateway) -> None:
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        async with e2b(gw, gw.alice) as http:
            for method, path, status in (
                ("GET", f"/sandboxes/{sbx.sandbox_id}/logs", 501),
                ("GET", "/v2/templates", 501),
                ("POST", "/volumes", 501),
                ("GET", "/no/such/route", 404),
            ):
                resp = await http.request(method, path)
                assert resp.status_code == status, (path, resp.text)
                assert set(resp.json()) >= {"code", "message"} and resp.json()["code"] == status
        async with e2b(gw) as http:  # without a key, nothing but the 401
            assert (await http.get("/v2/templates")).status_code == 401
    finally:
        await sbx.kill()


async def test_snapshot_requests_that_cannot_be_met_are_refused_before_any_work(gw: Gateway) -> None:
    """Taking a snapshot needs the engine (tests/integration/e2b/test_control.py); its refusals do not."""
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        with pytest.raises(SandboxException, match="filesystem-only") as files_only:
            await sbx.create_snapshot(mode="filesystem")
        assert files_only.value.status_code == 400
        with pytest.raises(SandboxException, match="names a template"):
            await sbx.create_snapshot(name="base")
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.create_snapshot(sbx.sandbox_id, api_key=gw.bob)
        assert await AsyncSandbox.list_snapshots().next_items() == []
        assert not await AsyncSandbox.delete_snapshot("nothing-here")
        async with e2b(gw, gw.alice) as http:
            refused = await http.delete("/templates/code-interpreter-v1")
            assert refused.status_code == 400 and "e2b_templates" in refused.json()["message"]
    finally:
        await sbx.kill()


async def test_bodies_past_the_unauthenticated_cap_need_a_key_or_a_sandbox_token(gw: Gateway) -> None:
    big: dict[str, Any] = {"templateID": "base", "metadata": {f"k{i}": "v" * 1000 for i in range(70)}}
    async with e2b(gw, gw.alice) as http:  # read (and refused for what it says), not for who sends it
        resp = await http.post("/v2/sandboxes", json=big)
        assert resp.status_code == 400 and "metadata" in resp.json()["message"], resp.text
    async with e2b(gw, "kgw_000000000000_" + "A" * 43) as http:
        resp = await http.post("/v2/sandboxes", json=big)
        assert resp.status_code == 401 and resp.json()["code"] == 401 and resp.headers["connection"] == "close"
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49999"}
        async with e2b(gw) as http:
            right = {**headers, "X-Access-Token": sbx._envd_access_token or ""}
            resp = await http.post("/no-such-route", headers=right, content=b"x" * 100_000)
            assert resp.status_code == 404  # past the cap: the token is the credential
            wrong = {**headers, "X-Access-Token": "not-the-token"}
            resp = await http.post("/no-such-route", headers=wrong, content=b"x" * 100_000)
            assert resp.status_code == 401
    finally:
        await sbx.kill()


@pytest.mark.usefixtures("gate")
async def test_code_sent_to_a_paused_sandbox_resumes_it_with_a_fresh_lease(gw: Gateway) -> None:
    """E2B's auto-resume: the timeout it was created with, at least five minutes,
    from the resume (a sandbox resumed by its traffic once ran with no lease)."""
    sbx = await AsyncCodeSandbox.create(timeout=60)
    try:
        assert (await sbx.run_code("x = 41")).error is None
        await sbx.pause()
        assert (await sbx.get_info()).state == SandboxState.PAUSED
        assert await sbx.is_running()  # a health check does not wake it
        assert (await sbx.get_info()).state == SandboxState.PAUSED
        before = datetime.now(UTC)
        assert (await sbx.run_code("x + 1")).text == "42"
        info = await sbx.get_info()
        assert info.state == SandboxState.RUNNING
        assert before + timedelta(seconds=299) <= info.end_at <= datetime.now(UTC) + timedelta(seconds=301), info
    finally:
        await sbx.kill()
