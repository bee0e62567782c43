"""Restart -> first successful execute on a reattached session, with N sessions.

A real ``kernelgw serve`` (own name, runtime and data dirs) gets N sessions with
state, is stopped (SIGTERM, on_shutdown=keep) or killed (SIGKILL), and started
again; timed from the new process's spawn to: /healthz answering (start-up
includes the reattachment), the first ``print(x)`` answering 42, all N answered.

    .venv/bin/python benchmarks/bench_reattach.py [--sessions 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import httpx

IMAGE = os.environ.get("KERNELGW_IMAGE", "kernelgw/python:latest")


def spawn(name: str, data: Path, runtime_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "KERNELGW_GATEWAY_NAME": name,
        "KERNELGW_IMAGE": IMAGE,
        "KERNELGW_RUNTIME_DIR": str(runtime_dir),
        "KERNELGW_DATA_DIR": str(data),
        "KERNELGW_MEMORY_MB": "256",
        "KERNELGW_MAX_SESSIONS": "100",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kernelgw", "serve", "--port", str(port)], env=env, stdout=out, stderr=out
        )


def wait_healthy(url: str, deadline_s: float = 120) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.01)
    raise TimeoutError("the gateway did not start")


def print_x(url: str, sid: str) -> float:
    body = httpx.post(f"{url}/v1/sessions/{sid}/execute", json={"code": "print(x)"}, timeout=60).json()
    assert body["status"] == "ok", body
    return time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=20)
    n = parser.parse_args().sessions
    name = f"bench{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="kgwb"))
    runtime_dir = Path(f"/tmp/kgwb{os.getpid()}")
    log = tmp / "gateway.log"
    port = 18000 + os.getpid() % 1000
    url = f"http://127.0.0.1:{port}"
    rows = []
    proc = spawn(name, tmp / "data", runtime_dir, port, log)
    try:
        wait_healthy(url)
        with ThreadPoolExecutor(n) as pool:
            sids = list(
                pool.map(lambda _: httpx.post(f"{url}/v1/sessions", json={}, timeout=120).json()["id"], range(n))
            )
            list(
                pool.map(
                    lambda s: httpx.post(f"{url}/v1/sessions/{s}/execute", json={"code": "x = 42"}, timeout=60), sids
                )
            )
            for how in ("SIGTERM", "SIGKILL", "SIGTERM", "SIGKILL"):
                proc.send_signal(getattr(signal, how))
                proc.wait()
                t0 = time.perf_counter()
                proc = spawn(name, tmp / "data", runtime_dir, port, log)
                wait_healthy(url)
                healthy = time.perf_counter()
                first = print_x(url, sids[0])
                rest = list(pool.map(lambda s: print_x(url, s), sids[1:]))
                listed = len(httpx.get(f"{url}/v1/sessions", timeout=10).json()["sessions"])
                rows.append((how, listed, healthy - t0, first - t0, max([first, *rest]) - t0))
    finally:
        proc.kill()
        proc.wait()
        client = docker.from_env()
        for c in client.containers.list(all=True, filters={"label": f"kernelgw.gateway={name}"}):
            c.remove(force=True)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(runtime_dir, ignore_errors=True)
    print(f"{n} sessions; seconds from the new process's spawn (includes Python start-up)")
    print(f"{'stopped by':<10} {'reattached':>10} {'healthy':>8} {'first exec':>10} {'all exec':>9}")
    for how, listed, h, f, a in rows:
        print(f"{how:<10} {listed:>10} {h:>8.2f} {f:>10.2f} {a:>9.2f}")


if __name__ == "__main__":
    main()
