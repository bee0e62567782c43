"""A misconfigured cluster says so: two ``kernelgw serve`` processes on one real
PostgreSQL, the second started without ``KERNELGW_CLUSTER_SECRET``.

Behind a round-robin balancer, half of the requests for the first gateway's
sessions reach the second, which cannot forward them; it used to answer the
404 of a session that does not exist. It now warns at start and answers 503
``cluster_misconfigured`` naming the owner and the missing setting.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import docker
import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.integration.conftest import assert_nothing_left, remove_everything
from tests.integration.test_cluster import cluster_database, cluster_gateway, make_key

pytestmark = pytest.mark.integration


def test_a_gateway_without_the_secret_warns_and_names_the_owner(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    names = [f"m{os.getpid()}-0", f"m{os.getpid()}-1"]
    with ExitStack() as stack:
        database_url = stack.enter_context(cluster_database())
        key = make_key(database_url, tmp_path / "keys")
        other_key = make_key(database_url, tmp_path / "keys", "someone-else")
        owner, lone = (cluster_gateway(name, i, tmp_path, database_url) for i, name in enumerate(names))
        lone.env.pop("KERNELGW_CLUSTER_SECRET")
        for gw in (owner, lone):
            stack.callback(assert_nothing_left, docker_client, gw.name)
            stack.callback(remove_everything, docker_client, gw.name)
            stack.callback(gw.stop)
        owner.start()
        lone.start()  # after the owner registered: it finds a live peer in the store

        # --- the warning, at start, names the live peer and the setting
        warnings = [line for line in lone.tail().splitlines() if "no cluster secret" in line]
        assert warnings, lone.tail()
        assert owner.name in warnings[0] and "KERNELGW_CLUSTER_SECRET" in warnings[0], warnings

        auth = {"Authorization": f"Bearer {key}"}
        created = httpx.post(f"{owner.url}/v1/sessions", json={}, headers=auth, timeout=120)
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        stack.callback(lambda: httpx.delete(f"{owner.url}/v1/sessions/{sid}", headers=auth, timeout=60))

        # --- a request for the owner's session at the lone gateway: a clear 503, both faces
        for method, path in (
            ("GET", f"/v1/sessions/{sid}"),
            ("POST", f"/v1/sessions/{sid}/execute"),
        ):
            answer = httpx.request(method, lone.url + path, json={"code": "1"}, headers=auth, timeout=60)
            assert answer.status_code == 503, answer.text
            error = answer.json()["error"]
            assert error["code"] == "cluster_misconfigured", error
            assert owner.name in error["message"] and "KERNELGW_CLUSTER_SECRET" in error["message"], error
        jupyter = httpx.get(f"{lone.url}/api/kernels/{sid}", headers=auth, timeout=60)
        assert jupyter.status_code == 503 and owner.name in jupyter.json()["message"], jupyter.text
        with connect(
            f"ws://127.0.0.1:{lone.port}/v1/sessions/{sid}/ws", additional_headers=auth, open_timeout=30
        ) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013, closed.value
        assert owner.name in closed.value.rcvd.reason

        # --- the same session for another key, or a session nobody runs: the usual 404
        theirs = httpx.get(f"{lone.url}/v1/sessions/{sid}", headers={"Authorization": f"Bearer {other_key}"})
        assert theirs.status_code == 404, theirs.text
        assert httpx.get(f"{lone.url}/v1/sessions/{'0' * 12}", headers=auth).status_code == 404
        # without a key: the 401 of any bad credential, nothing about the cluster
        assert httpx.get(f"{lone.url}/v1/sessions/{sid}").status_code == 401
        # the owner serves it as before
        assert httpx.get(f"{owner.url}/v1/sessions/{sid}", headers=auth, timeout=60).status_code == 200
