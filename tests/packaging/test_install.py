"""Each extra installed from the wheel into a fresh virtualenv, as a user would.

``pip install kernelgw`` must give the SDK and the client commands without the
gateway's dependencies, and the gateway's commands must then say what to
install; ``kernelgw[server]`` must create the app; ``kernelgw[all]`` must load
the agent integrations too. The wheel is built once; the three virtualenvs are
made in parallel, with requirements/lock.txt as constraints and pip's cache, so
the run takes well under two minutes once the cache holds the locked wheels. No
Docker engine is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "lock.txt"
SERVER_INSTALL = "pip install 'kernelgw[server]'"
SERVER_MODULES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "docker",
    "sqlalchemy",
    "jupyter_client",
    "zmq",
    "pydantic_settings",
)
INTEGRATION_MODULES = ("langchain_core", "mcp")
EXTRAS = ("client", "server", "all")
"""``client`` is the plain ``pip install kernelgw``."""
GATEWAY_COMMANDS = (("serve",), ("image", "build"), ("keys", "list"), ("audit",))


@dataclass(frozen=True)
class Venv:
    """A fresh virtualenv with kernelgw installed from the wheel."""

    path: Path
    env: Mapping[str, str]
    seconds: float

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, env=self.env, capture_output=True, text=True, timeout=timeout, cwd=self.path, check=False
        )

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.path / "bin" / "python"), "-c", code)

    def kernelgw(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.path / "bin" / "kernelgw"), *args)

    def installed(self, modules: tuple[str, ...]) -> dict[str, bool]:
        probe = self.run(
            str(self.path / "bin" / "python"),
            "-c",
            "import importlib.util, json, sys; "
            "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))",
            *modules,
        )
        assert probe.returncode == 0, probe.stderr
        found: dict[str, bool] = json.loads(probe.stdout)
        return found


def _clean_env(home: Path) -> dict[str, str]:
    """This process's environment without its virtualenv or kernelgw settings."""
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("KERNELGW_")}
    env["XDG_DATA_HOME"] = str(home)  # the server's default data_dir: nowhere shared
    return env


def _build_wheel(work: Path) -> Path:
    """The wheel of the working tree, built from a copy so the tree gets no build/."""
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for tree in ("kernelgw", "images"):
        shutil.copytree(ROOT / tree, src / tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = work / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}\n{built.stderr}"
    (wheel,) = dist.glob("kernelgw-*.whl")
    return wheel


def _install(work: Path, wheel: Path, extra: str) -> Venv:
    """A fresh virtualenv (no system site-packages) with the wheel and ``extra``.

    This process's pip installs into it (``pip --python``), so the venv needs no
    pip of its own; it uses the machine's pip configuration and cache."""
    t0 = time.monotonic()
    path = work / f"venv-{extra}"
    env = _clean_env(work / f"data-{extra}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, env=env, timeout=120)
    requirement = str(wheel) if extra == "client" else f"{wheel}[{extra}]"
    pip = [sys.executable, "-m", "pip", "--python", str(path / "bin" / "python")]
    install = subprocess.run(
        [*pip, "install", "--quiet", "--disable-pip-version-check", "--constraint", str(LOCK), requirement],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, f"pip install {requirement} failed:\n{install.stdout}\n{install.stderr}"
    return Venv(path, env, time.monotonic() - t0)


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Venv]:
    work = tmp_path_factory.mktemp("packaging")
    t0 = time.monotonic()
    wheel = _build_wheel(work)
    built = time.monotonic() - t0
    with ThreadPoolExecutor(len(EXTRAS)) as pool:
        jobs = {extra: pool.submit(_install, work, wheel, extra) for extra in EXTRAS}
        made = {extra: job.result() for extra, job in jobs.items()}
    times = ", ".join(f"{extra} {v.seconds:.0f}s" for extra, v in made.items())
    print(f"\nwheel built in {built:.0f}s; virtualenvs: {times}; total {time.monotonic() - t0:.0f}s")
    return made


def test_the_lock_pins_every_package() -> None:
    pins = [line for line in LOCK.read_text().splitlines() if line and not line.startswith((" ", "#"))]
    assert pins and all("==" in line for line in pins), [p for p in pins if "==" not in p]
    assert not any(line.lower().startswith("kernelgw") for line in pins)


def test_client_install_has_the_sdk_without_the_gateway(venvs: dict[str, Venv]) -> None:
    client = venvs["client"]
    imported = client.python(
        "import kernelgw; from kernelgw import AsyncClient, Client, Execution; "
        "from kernelgw.client import SessionInfo; from kernelgw.models import SessionInfo as Shared; "
        "assert SessionInfo is Shared; print(kernelgw.__version__)"
    )
    assert imported.returncode == 0, imported.stderr
    assert client.installed(SERVER_MODULES + INTEGRATION_MODULES) == dict.fromkeys(
        SERVER_MODULES + INTEGRATION_MODULES, False
    )
    for command in ("--help", "run --help", "export --help"):
        shown = client.kernelgw(*command.split())
        assert shown.returncode == 0, shown.stderr


@pytest.mark.parametrize("command", GATEWAY_COMMANDS, ids=" ".join)
def test_client_install_names_the_server_extra(venvs: dict[str, Venv], command: tuple[str, ...]) -> None:
    result = venvs["client"].kernelgw(*command)
    assert result.returncode != 0
    assert SERVER_INSTALL in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_server_install_creates_the_app(venvs: dict[str, Venv]) -> None:
    server = venvs["server"]
    created = server.python(
        "from kernelgw.config import Settings; from kernelgw.server.app import create_app; "
        "app = create_app(Settings()); print(len(app.openapi()['paths']))"
    )
    assert created.returncode == 0, created.stderr
    assert int(created.stdout) > 10
    assert server.installed(SERVER_MODULES) == dict.fromkeys(SERVER_MODULES, True)
    assert server.installed(INTEGRATION_MODULES) == dict.fromkeys(INTEGRATION_MODULES, False)
    shown = server.kernelgw("serve", "--help")
    assert shown.returncode == 0, shown.stderr
    # the schema migrations ship in the wheel: a new database comes up at their head
    migrated = server.python(
        "import asyncio, sqlite3, tempfile, pathlib\n"
        "from kernelgw.storage import Store\n"
        "d = pathlib.Path(tempfile.mkdtemp())\n"
        "async def main():\n"
        "    store = Store(f'sqlite+aiosqlite:///{d}/h.db', gateway_name='pkg')\n"
        "    await store.start(background=False)\n"
        "    await store.close()\n"
        "asyncio.run(main())\n"
        "print(sqlite3.connect(d / 'h.db').execute('select version_num from kgw_alembic_version').fetchone()[0])\n"
    )
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.strip(), migrated.stdout


def test_the_wheel_carries_the_kernel_images_build_context(venvs: dict[str, Venv]) -> None:
    """`pip install kernelgw` can build the kernel image without a source checkout:
    the installed build context is the source tree's, byte for byte (same build
    hash, so the same image)."""
    from kernelgw.image import context

    server = venvs["server"]
    probe = server.python(
        "import json; from kernelgw.image import context\n"
        "d = context.default_image_dir()\n"
        "print(json.dumps({'dir': str(d), 'hash': context.compute_build_hash(context.read_context_files(d), 'b')}))"
    )
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert Path(seen["dir"]).is_relative_to(server.path), seen  # the venv's copy, not this tree
    ours = context.compute_build_hash(context.read_context_files(ROOT / "images" / "python"), "b")
    assert seen["hash"] == ours


@pytest.mark.integration
def test_image_build_from_the_installed_package_finds_the_image_up_to_date(venvs: dict[str, Venv]) -> None:
    """`kernelgw image build` run from the wheel computes the same build hash as
    the source tree's build (scripts/setup.sh made that image): up to date."""
    built = venvs["server"].kernelgw("image", "build")
    assert built.returncode == 0, built.stderr
    assert "is up to date" in built.stdout, (built.stdout, built.stderr)


def test_all_install_loads_the_integrations(venvs: dict[str, Venv]) -> None:
    loaded = venvs["all"].python(
        "import kernelgw.integrations.langchain, kernelgw.integrations.mcp; "
        "from kernelgw.config import Settings; from kernelgw.server.app import create_app; create_app(Settings())"
    )
    assert loaded.returncode == 0, loaded.stderr
