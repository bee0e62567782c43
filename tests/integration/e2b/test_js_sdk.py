"""E2B's JavaScript SDK (``@e2b/code-interpreter`` from npm), unchanged, in Node,
against a real gateway's /e2b face: only the environment variables a user sets.
It creates a sandbox, runs code with state and a stdout callback, meets an
error, writes and reads a file that the code sees too, lists, connects a
second object and kills the sandbox.

Needs Node and the library: ``scripts/ensure-node-clients.sh``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.e2b.conftest import E2BGateway

pytestmark = pytest.mark.integration

NODE_DIR = Path(os.environ.get("KERNELGW_NODE_DIR", "/var/cache/kernelgw/node"))
SCRIPT = Path(__file__).parents[1] / "node" / "e2b_sdk.js"


def test_the_javascript_sdk_runs_code_and_moves_files(e2b_env: E2BGateway) -> None:
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "@e2b" / "code-interpreter").is_dir():
        pytest.fail("No Node or @e2b/code-interpreter; run scripts/ensure-node-clients.sh", pytrace=False)
    env = {**os.environ, **e2b_env.env(), "NODE_PATH": str(NODE_DIR / "node_modules")}
    done = subprocess.run([node, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["text"] == "42" and seen["stdout"] == ["from python\n"], seen
    assert seen["error"] == "ZeroDivisionError"
    assert seen["read"] == "written by js" and seen["fromCode"] == "written by js"  # E2B's text of a str: unquoted
    assert seen["listed"] == [seen["id"]] and seen["running"] is True
    assert seen["connected"] == "40"
    assert seen["killed"] is True and seen["runningAfter"] is False
