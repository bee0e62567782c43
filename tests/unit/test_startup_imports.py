"""What `kernelgw serve` imports before it listens.

Imports were most of a restart's time to its first answer (issue 12: under 2 s
with 20 sessions; ~1 s of ~1.6 s). Modules that only some routes, commands or
configurations need are imported where they are used; these tests run the real
`kernelgw serve` (settings, CLI checks, create_app, uvicorn's config) in a fresh
interpreter, stopped where uvicorn would start the lifespan, then make the
imports the lifespan makes in its thread (the Docker backend, the routes), and
fail when one of the lazy modules is imported eagerly again. No timing: the
list of modules is the guard.
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
    "sqlalchemy.ext.asyncio": "a PostgreSQL store, a cluster's registry (SQLite: kernelgw.storage.thread_engine)",
    "sqlalchemy.orm": "nothing of ours (SQLAlchemy's asyncio engine imports it)",
    "aiosqlite": "a cluster's registry on SQLite (the store's engine runs pysqlite in threads)",
    "psycopg": "a PostgreSQL store",
}

# Imported by the lifespan in a thread, beside the store's and Docker's waits
# (kernelgw.server.app: create_app(defer_routes=True)), not in series before it.
IN_THE_LIFESPAN = {
    "docker": "the Docker SDK (requests, charset_normalizer) is imported by create_backend in that thread",
    "kernelgw.runtime.backends.docker": "create_backend imports it in that thread",
    "kernelgw.server.v1.routes": "the route modules are imported there (include_routes)",
    "kernelgw.server.auth": "a route module (the CLI's checks import kernelgw.server.authenticator)",
    "kernelgw.server.v1.ws": "the route modules are imported there (include_routes)",
    "kernelgw.server.jupyter.rest": "the route modules are imported there (include_routes)",
    "kernelgw.server.v1.files": "the route modules are imported there (include_routes)",
}

# Runs `kernelgw serve` as the console script does, with the server's `run`
# replaced by two dumps of sys.modules: before the lifespan (everything before it
# ran for real), and after the imports its start-up thread makes.
PROBE = r"""
import json, sys
from kernelgw.server import serving

def dump(self):
    print(json.dumps(sorted(sys.modules)))
    import kernelgw.runtime.backends.docker  # create_backend's import
    from kernelgw.server.app import _prepare_routes

    _prepare_routes(self._app, True)
    print(json.dumps(sorted(sys.modules)))

serving.DrainingServer.run = dump
from kernelgw.cli.main import main
main(args=["serve", "--port", "1"], prog_name="kernelgw")
"""


def _serve_modules(tmp_path: Path) -> tuple[set[str], set[str]]:
    """The modules loaded before the lifespan, and after its start-up thread's imports."""
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
    before, after = (set(json.loads(line)) for line in done.stdout.strip().splitlines()[-2:])
    return before, after


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], set[str]]:
    return _serve_modules(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def serve_modules(probed: tuple[set[str], set[str]]) -> set[str]:
    """Everything a serve imports before it listens."""
    return probed[1]


def test_the_probe_reaches_the_server(serve_modules: set[str]) -> None:
    """The second dump comes from after the routes were added: their modules are
    in it (else the absences below would prove nothing)."""
    for module in (
        "kernelgw.server.app",
        "kernelgw.server.v1.routes",
        "kernelgw.server.v1.ws",
        "kernelgw.storage.store",
        "kernelgw.runtime.backends.docker",
    ):
        assert module in serve_modules


@pytest.mark.parametrize("package", sorted(LAZY))
def test_serve_does_not_import_before_it_listens(serve_modules: set[str], package: str) -> None:
    eager = sorted(m for m in serve_modules if m == package or m.startswith(package + "."))
    assert not eager, f"`kernelgw serve` imports {eager} at start; it is needed only for {LAZY[package]}"


@pytest.mark.parametrize("module", sorted(IN_THE_LIFESPAN))
def test_the_lifespan_thread_imports(probed: tuple[set[str], set[str]], module: str) -> None:
    before, after = probed
    assert module in after, f"{module} is no longer imported at start: drop it from IN_THE_LIFESPAN"
    assert module not in before, f"`kernelgw serve` imports {module} before the lifespan; {IN_THE_LIFESPAN[module]}"


def test_an_allowlist_still_imports_packaging_when_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side of the lazy import: a set allowlist is still checked at load."""
    from kernelgw.config import Settings

    monkeypatch.setenv("KERNELGW_DATA_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="not a requirement"):
        Settings.load(None, package_allowlist=["sympy>=>1"])
    assert Settings.load(None, package_allowlist=["sympy>=1.12"]).package_allowlist == ["sympy>=1.12"]


def test_the_cli_imports_no_storage() -> None:
    """Every ``kernelgw`` command imports the CLI first; ``serve`` pauses the cyclic
    collector only after that, and ``run`` never opens a database. The audit
    command's ``--kind`` choices once imported the whole store (SQLAlchemy) there."""
    code = "import json, sys, kernelgw.cli.main; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = set(json.loads(done.stdout))
    assert "kernelgw.cli.admin" in loaded  # the audit command is defined
    eager = sorted(m for m in loaded if m.startswith(("sqlalchemy", "kernelgw.storage", "kernelgw.server")))
    assert not eager, f"importing the CLI imports {eager[:5]}"
