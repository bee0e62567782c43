"""Core latency benchmark: session start and the `1+1` round trip.

Prints p50/p95 for, all in one run on this machine and image:
  - session create (cold container) over REST
  - `1+1` over the WebSocket, over blocking REST
  - `1+1` over raw jupyter_client against the same kernel (the floor)
  - `docker run --rm IMAGE python -c 1+1` (the one-container-per-snippet pattern)

Run: .venv/bin/python benchmarks/bench_core.py [--n 200] [--json out.json]
This is a benchmark, not a test: numbers vary with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import docker
import httpx
from jupyter_client.asynchronous import AsyncKernelClient
from websockets.asyncio.client import connect



def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(name: str, samples_ms: list[float]) -> dict[str, Any]:
    return {
        "name": name,
        "n": len(samples_ms),
        "p50_ms": pct(samples_ms, 50),
        "p95_ms": pct(samples_ms, 95),
        "mean_ms": statistics.fmean(samples_ms),
    }


class Gateway:
    """`kernelgw serve` in its own process, as in production: the benchmark's
    client loop never shares a GIL or an event loop with the gateway."""

    def __init__(self, port: int, image: str) -> None:
        env = {**os.environ, "KERNELGW_GATEWAY_NAME": "bench", "KERNELGW_RUNTIME_DIR": "/tmp/kgwb",
               "KERNELGW_IMAGE": image, "KERNELGW_MAX_SESSIONS": "100"}
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "kernelgw", "serve", "--port", str(port)], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{self.url}/healthz", timeout=2)
                return
            except httpx.TransportError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the gateway did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)


async def ws_round_trips(ws_url: str, n: int, warmup: int = 10) -> list[float]:
    samples = []
    async with connect(ws_url, max_size=None) as ws:
        for i in range(n + warmup):
            eid = uuid.uuid4().hex
            t0 = time.perf_counter()
            await ws.send(json.dumps({"type": "execute", "code": "1+1", "execution_id": eid}))
            while True:
                event = json.loads(await ws.recv())
                if event["type"] == "done" and event["execution_id"] == eid:
                    break
            if i >= warmup:
                samples.append((time.perf_counter() - t0) * 1000)
    return samples


async def rest_round_trips(url: str, sid: str, n: int, warmup: int = 10) -> list[float]:
    samples = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        for i in range(n + warmup):
            t0 = time.perf_counter()
            resp = await client.post(f"/v1/sessions/{sid}/execute", json={"code": "1+1"})
            resp.raise_for_status()
            if i >= warmup:
                samples.append((time.perf_counter() - t0) * 1000)
    return samples


async def raw_round_trips(conn_dir: Path, n: int, warmup: int = 10) -> list[float]:
    """The floor: jupyter_client straight to the kernel's sockets, no gateway."""
    info = json.loads((conn_dir / "kernel.json").read_text())
    info["ip"] = str(conn_dir / "k")
    kc = AsyncKernelClient()
    kc.load_connection_info(info)
    kc.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
    await kc.wait_for_ready(timeout=30)
    samples = []
    try:
        for i in range(n + warmup):
            t0 = time.perf_counter()
            msg_id = kc.execute("1+1")
            reply_seen = idle_seen = False
            while not (reply_seen and idle_seen):
                if not reply_seen:
                    reply = await kc.get_shell_msg(timeout=30)
                    reply_seen = reply["parent_header"].get("msg_id") == msg_id
                while not idle_seen:
                    msg = await kc.get_iopub_msg(timeout=30)
                    idle_seen = (
                        msg["parent_header"].get("msg_id") == msg_id
                        and msg["header"]["msg_type"] == "status"
                        and msg["content"]["execution_state"] == "idle"
                    )
            if i >= warmup:
                samples.append((time.perf_counter() - t0) * 1000)
    finally:
        kc.stop_channels()
    return samples


def docker_run_samples(image: str, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "--entrypoint", "/opt/kernel/bin/python",
             image, "-c", "print(1+1)"],
            check=True, capture_output=True,
        )
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    gateway = Gateway(args.port, args.image)
    url = gateway.url
    rows = []
    try:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            create = []
            for _ in range(args.creates):
                t0 = time.perf_counter()
                resp = await client.post("/v1/sessions", json={})
                resp.raise_for_status()
                create.append((time.perf_counter() - t0) * 1000)
                await client.delete(f"/v1/sessions/{resp.json()['id']}")
            rows.append(summary("session create (cold container)", create))

            sid = (await client.post("/v1/sessions", json={})).json()["id"]
            dc = docker.from_env()
            (container,) = dc.containers.list(filters={"label": f"kernelgw.session={sid}"})
            conn_dir = Path(container.attrs["Mounts"][0]["Source"])
            dc.close()

            # Interleave the transports in rounds so drift in machine load hits all alike.
            raw: list[float] = []
            ws: list[float] = []
            rest: list[float] = []
            per_round = max(1, args.n // args.rounds)
            ws_url = f"ws://127.0.0.1:{args.port}/v1/sessions/{sid}/ws"
            for _ in range(args.rounds):
                raw += await raw_round_trips(conn_dir, per_round)
                ws += await ws_round_trips(ws_url, per_round)
                rest += await rest_round_trips(url, sid, per_round)
            rows.append(summary("1+1 raw jupyter_client (floor)", raw))
            rows.append(summary("1+1 kernelgw WebSocket", ws))
            rows.append(summary("1+1 kernelgw REST", rest))
            await client.delete(f"/v1/sessions/{sid}")
    finally:
        gateway.stop()
    rows.append(summary("docker run --rm per snippet", docker_run_samples(args.image, args.docker_runs)))
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {_mem_gib():.0f} GiB, "
        f"Python {platform.python_version()}",
        "image": args.image,
        "rows": rows,
    }


def _mem_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def print_table(result: dict[str, Any]) -> None:
    floor = next(r for r in result["rows"] if "floor" in r["name"])
    print(f"\n{result['date']}  {result['machine']}  image {result['image']}\n")
    header = (f"| {'measurement':<34} | {'n':>4} | {'p50 ms':>8} | {'p95 ms':>8} | {'p50 - floor':>11} "
              f"| {'p50 / floor':>11} |")
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for r in result["rows"]:
        delta = f"{r['p50_ms'] - floor['p50_ms']:+.2f} ms" if r["name"].startswith("1+1") else ""
        ratio = f"{r['p50_ms'] / floor['p50_ms']:.2f}x"
        print(f"| {r['name']:<34} | {r['n']:>4} | {r['p50_ms']:>8.2f} | {r['p95_ms']:>8.2f} | {delta:>11} "
              f"| {ratio:>11} |")


def draw_chart(result: dict[str, Any], path: Path) -> None:
    """p50 with a p95 whisker per measurement, log scale (docker run is ~50x 1+1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    names = [r["name"] for r in rows]
    p50 = [r["p50_ms"] for r in rows]
    p95 = [r["p95_ms"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    y = range(len(rows))
    ax.barh(y, p50, color=["#888" if "floor" in n else "#3572A5" for n in names])
    ax.errorbar(p50, y, xerr=[[0] * len(rows), [b - a for a, b in zip(p50, p95, strict=True)]], fmt="none", ecolor="black",
                capsize=3)
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds (bar p50, whisker p95; log scale)")
    ax.set_title(f"kernelgw core latency, {result['date'][:10]}, {result['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200, help="round trips per transport")
    parser.add_argument("--creates", type=int, default=10, help="cold session creations")
    parser.add_argument("--docker-runs", type=int, default=10)
    parser.add_argument("--image", default="kernelgw/python:latest")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds for the round trips")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--chart", type=Path, help="also draw a PNG chart here (needs matplotlib)")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.chart:
        draw_chart(result, args.chart)


if __name__ == "__main__":
    main()
