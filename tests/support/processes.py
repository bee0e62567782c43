"""``kernelgw serve`` in a process of its own, for tests that stop, kill and
restart gateways (reattachment, crash loops, drain)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


@contextmanager
def gateway_process(
    name: str,
    data_dir: Path,
    log: Path,
    *,
    image: str,
    runtime_dir: Path,
    runtime: str | None = None,
    database_url: str | None = None,
    start_deadline_s: float = 90.0,
    **env: str,
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Start ``kernelgw serve`` (history in SQLite in ``data_dir`` unless
    ``database_url``), wait until ``/healthz`` answers 200, yield the process and
    its URL; kill it at the end if it still runs. Its output goes to ``log``."""
    port = free_port()
    full_env = {
        **os.environ,
        "KERNELGW_GATEWAY_NAME": name,
        "KERNELGW_IMAGE": image,
        "KERNELGW_RUNTIME_DIR": str(runtime_dir),
        "KERNELGW_DATA_DIR": str(data_dir),
        "KERNELGW_MEMORY_MB": "256",
        "KERNELGW_LOG_FORMAT": "text",
        "KERNELGW_POOL_SIZE": "0",  # tests that want a pool ask for one
    }
    full_env.pop("KERNELGW_DATABASE_URL", None)
    if database_url is not None:
        full_env["KERNELGW_DATABASE_URL"] = database_url
    if runtime is not None:
        full_env["KERNELGW_RUNTIME"] = runtime
    full_env.update(env)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernelgw", "serve", "--port", str(port)], env=full_env, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_deadline_s
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"the gateway exited while starting: {log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start within {start_deadline_s:g}s")
            time.sleep(0.05)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
