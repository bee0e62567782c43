"""What `kernelgw serve` imports before it listens.

Imports were most of a restart's time to its first answer (issue 12: under 2 s
with 20 sessions; ~1 s of ~1.6 s). Modules that only some routes, commands or
configurations need are imported where they are used; these tests run the real
`kernelgw serve` (settings, CLI checks, create_app, uvicorn's config) in a fresh
interpreter, stopped where uvicorn would start the lifespan, and fail when one
of them is imported eagerly again. No timing: the list of modules is the guard.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Not needed before a restarted gateway answers; each costs a start 5-100 ms of CPU
# (or more): where each is imported instead.
LAZY = {
    "packaging": "the package routes and a non-empty package_allowlist (kernelgw.allowlist)",
    "websockets.asyncio.client": "a WebSocket forwarded to another gateway (kernelgw.server.forward)",
    "nbformat": "notebook export/import (warmed in a thread NBFORMAT_WARM_UP_DELAY_S after start)",
    "jsonschema": "nbformat's validation",
    "httpx": "a cluster's peers (kernelgw.cluster.node), the client SDK",
    "kernelgw.cluster.node": "cluster_secret set",
    "kernelgw.client": "the client commands (run, export, mcp)",
    "kernelgw.integrations": "the MCP and LangChain integrations",
    "kernelgw.image": "image builds, other kernels' images",
    "rich": "image builds' progress",
    "alembic": "a store whose schema is behind (kernelgw.storage.migrate)",
    "asyncpg": "a PostgreSQL store",
    "psycopg": "a PostgreSQL store",
}

# Runs `kernelgw serve` as the console script does, with the server's `run`
# replaced by a dump of sys.modules: everything before it ran for real.
PROBE = r"""
import json, sys
from kernelgw.server import serving

def dump(self):
    print(json.dumps(sorted(sys.modules)))

serving.DrainingServer.run = dump
from kernelgw.cli.main import main
main(args=["serve", "--port", "1"], prog_name="kernelgw")
"""


def _serve_modules(tmp_path: Path) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELGW_")}
    env.update(
        KERNELGW_DATA_DIR=str(tmp_path / "data"),
        KERNELGW_RUNTIME_DIR=str(tmp_path / "run"),
        KERNELGW_GATEWAY_NAME="startup-imports",
        KERNELGW_LOG_FORMAT="text",
        PYTHONPATH=os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")) if p),
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return set(modules)


@pytest.fixture(scope="module")
def serve_modules(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    return _serve_modules(tmp_path_factory.mktemp("serve"))


def test_the_probe_reaches_the_server(serve_modules: set[str]) -> None:
    """The dump comes from after create_app: its route modules are in it (else the
    absences below would prove nothing)."""
    for module in ("kernelgw.server.app", "kernelgw.server.routes", "kernelgw.server.ws", "kernelgw.storage.store"):
        assert module in serve_modules


@pytest.mark.parametrize("package", sorted(LAZY))
def test_serve_does_not_import_before_it_listens(serve_modules: set[str], package: str) -> None:
    eager = sorted(m for m in serve_modules if m == package or m.startswith(package + "."))
    assert not eager, f"`kernelgw serve` imports {eager} at start; it is needed only for {LAZY[package]}"


def test_an_allowlist_still_imports_packaging_when_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side of the lazy import: a set allowlist is still checked at load."""
    from kernelgw.config import Settings

    monkeypatch.setenv("KERNELGW_DATA_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="not a requirement"):
        Settings.load(None, package_allowlist=["sympy>=>1"])
    assert Settings.load(None, package_allowlist=["sympy>=1.12"]).package_allowlist == ["sympy>=1.12"]
