"""``jupyter lab --gateway-url=<kernelgw>`` in a subprocess, quiet and offline:
its config, data, runtime, settings and workspaces directories in a temporary
directory (the user's own are not read), no update check, no news, the read-only
extension manager, and the key as its gateway token (sent as
``Authorization: token <key>``)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.processes import free_port

JUPYTER_LAB = Path(sys.executable).with_name("jupyter-lab")


@dataclass
class JupyterLab:
    url: str
    token: str
    process: subprocess.Popen[bytes]
    log: Path

    def http(self) -> httpx.Client:
        """A client of the JupyterLab server's own REST API (its token, not kernelgw's key)."""
        return httpx.Client(base_url=self.url, headers={"Authorization": f"token {self.token}"}, timeout=60)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@contextmanager
def jupyter_lab(gateway_url: str, key: str, workdir: Path, start_timeout_s: float = 120) -> Iterator[JupyterLab]:
    port, token = free_port(), secrets.token_hex(16)
    dirs = {sub: workdir / sub for sub in ("config", "data", "runtime", "root", "settings", "workspaces")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    # no "receive official Jupyter news?" toast over the notebook
    notification = dirs["settings"] / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notification.parent.mkdir(parents=True, exist_ok=True)
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(dirs["config"]),
        "JUPYTER_DATA_DIR": str(dirs["data"]),
        "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
        "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    log = workdir / "jupyter-lab.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(JUPYTER_LAB),
                "--no-browser",
                "--allow-root",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={dirs['root']}",
                f"--gateway-url={gateway_url}",
                f"--GatewayClient.auth_token={key}",
                "--GatewayClient.request_timeout=120",
                "--GatewayClient.connect_timeout=60",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.news_url=None",
                "--LabApp.extension_manager=readonly",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    lab = JupyterLab(f"http://127.0.0.1:{port}", token, process, log)
    try:
        deadline = time.monotonic() + start_timeout_s
        with lab.http() as http:
            while True:
                assert process.poll() is None, f"jupyter lab exited:\n{lab.tail()}"
                try:
                    if http.get("/api/status").status_code == 200 and http.get("/lab").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"jupyter lab did not start:\n{lab.tail()}"
                time.sleep(0.2)
        yield lab
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
