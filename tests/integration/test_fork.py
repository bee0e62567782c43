"""Fork: a new session from a live one, with a copy of its files and installed
packages and its state rebuilt by replay; then the two go their own way."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.conftest import run, stdout

pytestmark = pytest.mark.integration


def value(http: httpx.Client, sid: str, expression: str) -> str:
    return stdout(run(http, sid, f"print({expression})")).strip()


def test_a_fork_has_the_state_and_files_then_diverges_from_its_parent(http: httpx.Client) -> None:
    parent = http.post("/v1/sessions", json={"memory_mb": 512, "env": {"STAGE": "parent"}}).json()["id"]
    child = None
    try:
        csv = b"x\n" + b"".join(b"%d\n" % i for i in range(100))
        assert http.put(f"/v1/sessions/{parent}/files/data/in.csv", content=csv).status_code == 201
        cells = [
            "import pandas as pd\ndf = pd.read_csv('data/in.csv')",
            "open('/opt/kernelgw/packages/kgw_helper.py', 'w').write('def double(v):\\n    return 2 * v\\n')",
            "import kgw_helper\ndf['y'] = kgw_helper.double(df.x)",
            "open('made.txt', 'w').write('by the parent')",
        ]
        for code in cells:
            assert run(http, parent, code)["status"] == "ok", code
        assert run(http, parent, "raise ValueError('not part of the state')")["status"] == "error"

        resp = http.post("/v1/sessions", json={"from": parent})
        assert resp.status_code == 201, resp.text
        body = resp.json()
        child = body["id"]
        fork = body["fork"]
        assert child != parent and fork["source"] == parent
        assert fork["copied_bytes"] > len(csv) and fork["copy_ms"] >= 0
        replay = fork["replay"]
        assert replay["trigger"] == "fork" and replay["complete"] is True and replay["replayed"] == len(cells)
        assert [c["status"] for c in replay["cells"]] == ["ok"] * len(cells)
        # the parent's settings, unless the fork asked otherwise
        assert body["memory_mb"] == 512 and value(http, child, "__import__('os').environ['STAGE']") == "parent"

        # the same state and files
        assert value(http, child, "int(df.y.sum())") == str(2 * sum(range(100)))
        assert value(http, child, "open('made.txt').read()") == "by the parent"
        # then they diverge: neither sees the other's changes
        run(http, child, "df['y'] = 0\nopen('made.txt', 'w').write('by the child')\nopen('new.txt', 'w').write('c')")
        run(http, parent, "df['x'] = 1")
        assert value(http, parent, "int(df.y.sum()), open('made.txt').read()") == f"{2 * sum(range(100))} by the parent"
        assert value(http, parent, "__import__('os').path.exists('new.txt')") == "False"
        assert value(http, child, "int(df.x.sum()), int(df.y.sum())") == f"{sum(range(100))} 0"
        # each is its own kernel: deleting the parent leaves the child
        assert http.delete(f"/v1/sessions/{parent}").status_code == 204
        assert value(http, child, "open('data/in.csv').read().count(chr(10))") == "101"
        # history: the fork's replayed cells are marked, its notebook holds what was run in it
        history = http.get(f"/v1/sessions/{child}/history").json()["executions"]
        assert sum(1 for e in history if e["replay_of"] is not None) == len(cells)
    finally:
        http.delete(f"/v1/sessions/{parent}")
        if child is not None:
            http.delete(f"/v1/sessions/{child}")


def test_a_fork_may_ask_for_other_limits_and_refuses_what_it_cannot_fork(http: httpx.Client) -> None:
    parent = http.post("/v1/sessions", json={"memory_mb": 512}).json()["id"]
    try:
        run(http, parent, "x = 41")
        resp = http.post("/v1/sessions", json={"from": parent, "memory_mb": 768})
        assert resp.status_code == 201, resp.text
        assert resp.json()["memory_mb"] == 768
        assert value(http, resp.json()["id"], "x + 1") == "42"
        http.delete(f"/v1/sessions/{resp.json()['id']}")

        # one source at a time, and only a session that exists
        both = http.post("/v1/sessions", json={"from": parent, "from_session": parent})
        assert both.status_code == 422 and "at most one" in both.text
        missing = http.post("/v1/sessions", json={"from": "no-such-session"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"

        # a dead kernel has no state to copy: a clear 409, nothing created
        before = len(http.get("/v1/sessions").json()["sessions"])
        done = run(http, parent, "import os\nos._exit(3)")
        assert done["status"] == "dead"
        dead = http.post("/v1/sessions", json={"from": parent})
        assert dead.status_code == 409 and "restart it first" in dead.json()["error"]["message"], dead.text
        assert len(http.get("/v1/sessions").json()["sessions"]) == before
    finally:
        http.delete(f"/v1/sessions/{parent}")


def test_a_paused_session_is_forked_from_its_snapshot_and_stays_paused(http: httpx.Client) -> None:
    parent = http.post("/v1/sessions", json={"memory_mb": 512}).json()["id"]
    child = None
    try:
        assert http.put(f"/v1/sessions/{parent}/files/in.txt", content=b"uploaded").status_code == 201
        run(
            http,
            parent,
            "import json\nx = {'a': [1, 2]}\nopen('/opt/kernelgw/packages/kgw_mod.py', 'w').write('V = 5')",
        )
        run(http, parent, "gen = (i for i in range(3))")  # cannot be pickled
        assert http.post(f"/v1/sessions/{parent}/pause").status_code == 200

        resp = http.post("/v1/sessions", json={"from": parent})
        assert resp.status_code == 201, resp.text
        body = resp.json()
        child = body["id"]
        fork = body["fork"]
        assert fork["source"] == parent and fork["copied_bytes"] > 0
        # no replay: the variables come from the snapshot, and say what could not be saved
        assert fork["replay"]["cells"] == [] and fork["replay"]["trigger"] == "fork"
        assert "x" in fork["namespace"]["names"] and fork["namespace"]["modules"].get("json") == "json"
        assert body["memory_mb"] == 512
        assert value(http, child, "x['a'], open('in.txt').read(), __import__('kgw_mod').V") == "[1, 2] uploaded 5"
        assert value(http, child, "'gen' in dir()") == "False"
        assert value(http, child, "__import__('os').path.exists('.kernelgw-namespace')") == "False"

        # the source is still paused, with its snapshot, and resumes as it was
        assert http.get(f"/v1/sessions/{parent}").json()["state"] == "paused"
        run(http, child, "x['a'].append(3)")
        assert http.post(f"/v1/sessions/{parent}/resume").status_code == 200
        assert value(http, parent, "x['a']") == "[1, 2]"
    finally:
        http.delete(f"/v1/sessions/{parent}")
        if child is not None:
            http.delete(f"/v1/sessions/{child}")
