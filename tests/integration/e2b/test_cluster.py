"""E2B's SDK against two gateways of one cluster (PostgreSQL, a cluster secret,
``kernelgw serve`` twice on this machine): any gateway serves any sandbox, as
for /v1. The control plane names the sandbox in the path, sandbox traffic in
the ``E2b-Sandbox-Id`` header; both reach the gateway that runs it. Listings
show every gateway's sandboxes and snapshots; a sandbox made from a snapshot
is made where the snapshot is (named by its id or its name); an owner that is gone is a 503 to whoever holds
the sandbox's token, and tells nothing to whoever does not."""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import docker
import httpx
import pytest
from e2b import SandboxQuery
from e2b_code_interpreter import Sandbox

from tests.integration.conftest import assert_nothing_left, remove_everything
from tests.integration.e2b.conftest import E2B_ENV
from tests.integration.test_cluster import cluster_database, cluster_gateway, eventually, make_key

pytestmark = pytest.mark.integration


def test_any_gateway_of_a_cluster_serves_any_sandbox(
    docker_client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in E2B_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("E2B_HTTP_VERSION", "1.1")
    names = [f"e2bc{os.getpid()}-{i}" for i in range(2)]
    with ExitStack() as stack:
        database_url = stack.enter_context(cluster_database())
        key = make_key(database_url, tmp_path / "keys")
        a = cluster_gateway(names[0], 5, tmp_path, database_url)
        b = cluster_gateway(names[1], 6, tmp_path, database_url)
        for gw in (a, b):
            stack.callback(remove_everything, docker_client, gw.name)
            stack.callback(gw.stop)
            gw.start()

        def on(gw: object) -> dict[str, str]:
            url = f"{gw.url}/e2b"  # type: ignore[attr-defined]
            return {"api_key": key, "api_url": url, "sandbox_url": url}

        made = Sandbox.create(metadata={"who": "cluster-test"}, timeout=600, **on(a))
        assert made.run_code("x = 41").error is None
        # the same sandbox through B: connect (control plane, by path), then code (sandbox traffic, by header)
        there = Sandbox.connect(made.sandbox_id, **on(b))
        execution = there.run_code("x + 1")
        assert execution.error is None and execution.text == "42", execution
        # a context made through B lives in A's container, and A answers for it through either
        ctx = there.create_code_context()
        assert there.run_code("'x' in dir()", context=ctx).text == "False"
        assert [c.id for c in made.list_code_contexts()][1:] == [ctx.id]
        assert made.run_code("6 * 7", context=ctx).text == "42"
        assert Sandbox.get_info(made.sandbox_id, **on(b)).metadata == {"who": "cluster-test"}
        listed = Sandbox.list(query=SandboxQuery(metadata={"who": "cluster-test"}), **on(b)).next_items()
        assert [s.sandbox_id for s in listed] == [made.sandbox_id]

        # the token is the sandbox's, wherever it lands: a wrong one through B is refused by A
        raw = httpx.post(
            f"{b.url}/e2b/execute",
            json={"code": "x"},
            headers={"E2b-Sandbox-Id": made.sandbox_id, "X-Access-Token": "not-the-token"},
            timeout=60,
        )
        # (E2B's edge answers sandbox traffic for a sandbox it cannot find with 502)
        assert raw.status_code == 502 and raw.json()["error_code"] == "sandbox_not_found", raw.text

        # a snapshot taken through B is held by A; a sandbox made from it through B runs on A
        snapshot = there.create_snapshot()
        assert [s.snapshot_id for s in Sandbox.list_snapshots(**on(b)).next_items()] == [snapshot.snapshot_id]
        copy = Sandbox.create(snapshot.snapshot_id, timeout=600, **on(b))
        assert copy.run_code("x").text == "41"
        assert [s.sandbox_id for s in Sandbox.list(**on(a)).next_items()].count(copy.sandbox_id) == 1
        assert Sandbox.delete_snapshot(snapshot.snapshot_id, **on(b))
        assert Sandbox.list_snapshots(**on(a)).next_items() == []
        assert Sandbox.kill(copy.sandbox_id, **on(b))
        # by its name too: B finds A's snapshot called "forty-one" in the store, and sends the create and the delete there
        named = there.create_snapshot("forty-one")
        assert named.names == ["forty-one"]
        by_name = Sandbox.create("forty-one", timeout=600, **on(b))
        assert by_name.run_code("x").text == "41"
        assert [s.sandbox_id for s in Sandbox.list(**on(a)).next_items()].count(by_name.sandbox_id) == 1
        assert Sandbox.kill(by_name.sandbox_id, **on(b))
        assert Sandbox.delete_snapshot("forty-one", **on(b))
        assert Sandbox.list_snapshots(**on(a)).next_items() == []

        # A gone (SIGKILL): B says so to the token's holder, in E2B's shape, and nothing to others
        a.kill9()
        gone = eventually(
            lambda: (
                r
                if (
                    r := httpx.post(
                        f"{b.url}/e2b/execute",
                        json={"code": "x"},
                        headers={"E2b-Sandbox-Id": made.sandbox_id, "X-Access-Token": made._envd_access_token or ""},
                        timeout=30,
                    )
                ).status_code
                == 503
                else None
            ),
            30,
        )
        body = gone.json()
        assert body["code"] == 503 and names[0] in body["message"] and body["error_code"] == "owner_gone", body
        stranger = httpx.post(
            f"{b.url}/e2b/execute",
            json={"code": "x"},
            headers={"E2b-Sandbox-Id": made.sandbox_id, "X-Access-Token": "not-the-token"},
            timeout=30,
        )
        assert stranger.status_code != 503 and names[0] not in stranger.text, stranger.text
        # A back: it reattaches the sandbox, which B's SDK object reaches again
        a.start()
        assert there.run_code("x").text == "41"
        assert Sandbox.kill(made.sandbox_id, **on(b))
    for name in names:
        assert_nothing_left(docker_client, name)
