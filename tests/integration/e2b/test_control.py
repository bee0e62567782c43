"""E2B's control plane through E2B's SDKs from PyPI (``e2b`` and
``e2b-code-interpreter``, sync and async), unchanged, against a real gateway and
real kernel containers, configured by environment variables only: create,
info, list with metadata and pages, timeouts and a lease that runs out, kill,
``is_running``, pause (by hand and when the timeout runs out with autoPause),
resume and connect, fork, snapshots, a gateway restart, another key's sandbox,
a bad key, an unknown template, internet access refused."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import docker
import httpx
import pytest
from e2b import AsyncSandbox as AsyncBaseSandbox
from e2b import (
    AuthenticationException,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from e2b import Sandbox as BaseSandbox
from e2b_code_interpreter import AsyncSandbox, Sandbox

from tests.integration.conftest import (
    RunningGateway,
    assert_nothing_left,
    gateway_settings,
    make_key,
    remove_everything,
    start_gateway,
)
from tests.integration.e2b.conftest import E2BGateway
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def other_key(e2b_gateway: E2BGateway) -> str:
    """A second user key of the same gateway."""
    return make_key(e2b_gateway.gateway.settings.data_dir, "e2b-other")


def gone(sandbox: BaseSandbox) -> bool:
    try:
        sandbox.get_info()
    except SandboxNotFoundException:
        return True
    return False


def state(sandbox: BaseSandbox) -> SandboxState:
    return sandbox.get_info().state


def test_create_info_is_running_and_kill(e2b_env: E2BGateway) -> None:
    before = datetime.now(UTC)
    sandbox = BaseSandbox.create(metadata={"user": "alice"}, envs={"GREETING": "hi"}, timeout=120)
    after = datetime.now(UTC)
    assert sandbox.is_running()
    info = sandbox.get_info()
    assert (info.template_id, info.metadata, info.state) == ("base", {"user": "alice"}, SandboxState.RUNNING)
    assert before + timedelta(seconds=120) <= info.end_at <= after + timedelta(seconds=120)
    assert info.allow_internet_access is False
    assert sandbox.kill()
    assert not sandbox.is_running()
    assert gone(sandbox)
    assert not sandbox.kill()


def test_the_code_interpreter_sandbox_runs_its_envs(e2b_env: E2BGateway) -> None:
    sandbox = Sandbox.create(envs={"GREETING": "hi"})
    try:
        assert sandbox.get_info().template_id == "code-interpreter-v1"
        assert sandbox.run_code("import os; os.environ['GREETING']").text == "hi"
    finally:
        sandbox.kill()


def test_list_filters_by_metadata_and_pages(e2b_env: E2BGateway) -> None:
    tag = {"suite": "integration list", "odd": "a&b=c"}
    made = [BaseSandbox.create(metadata=tag, timeout=120) for _ in range(3)]
    other = BaseSandbox.create(metadata={"suite": "someone else"}, timeout=120)
    try:
        paginator = BaseSandbox.list(query=SandboxQuery(metadata=tag), limit=2)
        pages = []
        while paginator.has_next:
            pages.append(paginator.next_items())
        assert [len(page) for page in pages] == [2, 1]
        assert sorted(s.sandbox_id for page in pages for s in page) == sorted(s.sandbox_id for s in made)
        paused = BaseSandbox.list(query=SandboxQuery(metadata=tag, state=[SandboxState.PAUSED])).next_items()
        assert paused == []
    finally:
        for sandbox in [*made, other]:
            sandbox.kill()


def test_a_lease_that_runs_out_kills_the_sandbox(e2b_env: E2BGateway) -> None:
    sandbox = Sandbox.create(timeout=300)
    sandbox.run_code("x = 1")
    sandbox.set_timeout(2)  # shorter than it was
    wait_until(lambda: gone(sandbox), "the 2 s timeout to kill the sandbox")
    assert not sandbox.is_running()
    with pytest.raises(TimeoutException) as dead:  # what E2B's SDK raises for a sandbox that timed out
        sandbox.run_code("x")
    assert "was not found" in str(dead.value) and "set_timeout" in str(dead.value)
    with httpx.Client(base_url=e2b_env.url, headers={"X-API-KEY": e2b_env.key}) as http:
        answer = http.get(f"/sandboxes/{sandbox.sandbox_id}")
    assert answer.status_code == 404 and "killed when its timeout ran out" in answer.json()["message"]


def test_pause_then_connect_resumes_with_the_variables(sbx: Sandbox) -> None:
    sbx.run_code("x = 41")
    assert sbx.pause()
    assert state(sbx) == SandboxState.PAUSED
    assert not sbx.pause()  # already paused: the SDK says False
    assert sbx.get_info().end_at > datetime.now(UTC)
    again = Sandbox.connect(sbx.sandbox_id, timeout=120)  # from "another process": the same token comes back
    assert state(again) == SandboxState.RUNNING
    assert again.run_code("x + 1").text == "42"
    assert sbx.run_code("x + 2").text == "43"  # the first handle still reaches it


def test_a_timeout_with_autopause_pauses_and_connect_brings_it_back(e2b_env: E2BGateway) -> None:
    sandbox = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause"})
    try:
        info = sandbox.get_info()
        assert info.lifecycle is not None and info.lifecycle["on_timeout"] == "pause"
        sandbox.run_code("y = 'kept'")
        sandbox.set_timeout(1)
        wait_until(lambda: state(sandbox) == SandboxState.PAUSED, "the timeout to pause the sandbox")
        sandbox.connect(timeout=120)  # the handle's own connect
        assert state(sandbox) == SandboxState.RUNNING
        assert sandbox.run_code("y").text == "kept"
    finally:
        sandbox.kill()


def test_fork_gives_sandboxes_with_the_state_and_their_own_tokens(e2b_env: E2BGateway) -> None:
    async def scenario() -> None:
        source = await AsyncSandbox.create(timeout=300, metadata={"role": "source"})
        forks: list[AsyncSandbox] = []
        try:
            await source.run_code("x = 41")
            results = await source.fork(count=2, timeout=120)
            for result in results:
                assert not isinstance(result, Exception), result
                forks.append(result)
            for fork in forks:
                assert fork.sandbox_id != source.sandbox_id
                assert fork._envd_access_token != source._envd_access_token
                assert (await fork.get_info()).metadata == {"role": "source"}
                assert (await fork.run_code("x + 1")).text == "42"
            await forks[0].run_code("x = 0")
            assert (await source.run_code("x")).text == "41"  # the source goes on unchanged
        finally:
            for sandbox in [source, *forks]:
                await sandbox.kill()

    asyncio.run(scenario())


def test_a_snapshot_makes_sandboxes_with_its_state_and_outlives_its_source(e2b_env: E2BGateway) -> None:
    source = Sandbox.create(timeout=300)
    made: list[Sandbox] = []
    try:
        source.run_code("x = 41")
        source.run_code("open('kept.txt', 'w').write('on disk')")
        drawn = source.run_code("import random\nr = random.random()\nr").text  # a replay would draw again
        snapshot = source.create_snapshot(name="answer")
        assert snapshot.names == ["answer"]
        source.run_code("x = 0")  # after the snapshot: not in it
        assert [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=source.sandbox_id).next_items()] == [
            snapshot.snapshot_id
        ]
        # a snapshot is no sandbox
        assert all(s.sandbox_id != snapshot.snapshot_id for s in Sandbox.list().next_items())
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(snapshot.snapshot_id)
        source.kill()  # the snapshot outlives its sandbox
        for ref in (snapshot.snapshot_id, "answer"):
            sandbox = Sandbox.create(ref, timeout=120)
            made.append(sandbox)
            assert sandbox.run_code("x + 1").text == "42"
            assert sandbox.run_code("open('kept.txt').read()").text == "on disk"
            assert sandbox.run_code("r").text == drawn  # the state itself, not its cells run again
            assert sandbox.get_info().template_id == ref
        made[0].run_code("x = 7")
        assert made[1].run_code("x").text == "41"  # each starts from the snapshot, not from another
        assert Sandbox.delete_snapshot(snapshot.snapshot_id)
        assert Sandbox.list_snapshots().next_items() == []
        assert not Sandbox.delete_snapshot(snapshot.snapshot_id)
        with pytest.raises(SandboxException) as deleted:
            Sandbox.create(snapshot.snapshot_id)
        assert deleted.value.status_code == 404
    finally:
        for sandbox in [source, *made]:
            sandbox.kill()


def test_async_sandboxes_are_listed_and_killed(e2b_env: E2BGateway) -> None:
    async def scenario() -> None:
        sandbox = await AsyncBaseSandbox.create(metadata={"async": "yes"}, timeout=120)
        try:
            assert await sandbox.is_running()
            listed = await AsyncBaseSandbox.list(query=SandboxQuery(metadata={"async": "yes"})).next_items()
            assert [s.sandbox_id for s in listed] == [sandbox.sandbox_id]
            await sandbox.set_timeout(60)
        finally:
            assert await sandbox.kill()
        assert not await sandbox.is_running()

    asyncio.run(scenario())


def test_another_keys_sandbox_is_not_found(sbx: Sandbox, other_key: str) -> None:
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id, api_key=other_key)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id, api_key=other_key)
    assert not Sandbox.kill(sbx.sandbox_id, api_key=other_key)
    assert all(s.sandbox_id != sbx.sandbox_id for s in Sandbox.list(api_key=other_key).next_items())
    assert sbx.is_running()


def test_a_bad_key_an_unknown_template_and_internet_access_are_refused(e2b_env: E2BGateway) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="kgw_000000000000_" + "A" * 43)
    with pytest.raises(SandboxException) as missing:
        Sandbox.create("no-such-template")
    assert missing.value.status_code == 404 and "no-such-template" in str(missing.value)
    with pytest.raises(SandboxException) as online:
        Sandbox.create(allow_internet_access=True)
    assert online.value.status_code == 400 and "no network" in str(online.value)
    assert BaseSandbox.list(query=SandboxQuery(metadata={"never": "made"})).next_items() == []


def test_sandboxes_and_their_tokens_outlive_a_gateway_restart(
    docker_client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that keeps its kernels (on_shutdown=keep) and the next of its name:
    a running sandbox keeps its variables and lease, a paused one its snapshot,
    and connect gives both tokens again (they derive from the key, not from memory)."""
    name, data_dir = f"e2br{os.getpid()}", tmp_path / "data"
    key = make_key(data_dir, name)
    settings = gateway_settings(gateway_name=name, data_dir=data_dir, auth="required", on_shutdown="keep")

    def point_at(gw: RunningGateway) -> None:
        for variable, value in E2BGateway(gw, key).env().items():
            monkeypatch.setenv(variable, value)

    try:
        first = start_gateway(settings)
        try:
            point_at(first)
            running = Sandbox.create(timeout=600, metadata={"kept": "yes"})
            running.run_code("x = 41")
            end = running.get_info().end_at
            paused = Sandbox.create(timeout=600)
            paused.run_code("y = 'in the snapshot'")
            assert paused.pause()
        finally:
            first.stop()
        second = start_gateway(settings)
        try:
            point_at(second)
            again = Sandbox.connect(running.sandbox_id, timeout=60)  # shorter than its lease: kept
            assert again._envd_access_token == running._envd_access_token
            info = again.get_info()
            assert (info.metadata, info.end_at, info.state) == ({"kept": "yes"}, end, SandboxState.RUNNING)
            assert again.run_code("x + 1").text == "42"
            resumed = Sandbox.connect(paused.sandbox_id, timeout=60)
            assert resumed.run_code("y").text == "in the snapshot"
            for sandbox in (again, resumed):
                assert sandbox.kill()
        finally:
            second.stop()
    finally:
        remove_everything(docker_client, name)
    assert_nothing_left(docker_client, name)
