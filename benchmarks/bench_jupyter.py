"""`1+1` over Jupyter's channels WebSocket: kernelgw's Jupyter face against its own
/v1 WebSocket on the same kernel, raw jupyter_client as the floor, and a stock
Jupyter Kernel Gateway (no sandbox) in a container of the same kernel image.

Rows, interleaved in shuffled order every round so load drift hits all alike:
  - raw jupyter_client to the kernelgw session's kernel sockets (the floor)
  - kernelgw /v1 WebSocket (execute until ``done``)
  - kernelgw /api/kernels/{id}/channels, JSON frames (execute_request until the
    reply and the idle status, as Jupyter clients wait)
  - stock Jupyter Kernel Gateway /api/kernels/{id}/channels, same framing, its own
    kernel in a container of kernelgw's image with jupyter_kernel_gateway added
    (wheels downloaded on the host, image built with --network none); the
    container runs on the host's network with a writable root, nothing limited.
Goal (issue 13): kernelgw's channels within 1 ms of its /v1 WebSocket at p50.

Run:  .venv/bin/python benchmarks/bench_jupyter.py [--rounds 200] [--json docs/bench/jupyter.json]
A benchmark, not a test: numbers vary with the machine's load (printed with them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    DOCS_BENCH,
    Gateway,
    RawKernel,
    WsConn,
    draw_bars,
    free_port,
    machine_info,
    now_iso,
    other_activity,
    print_table,
    session_container,
    summary,
    write_json,
)

FLOOR = "raw jupyter_client (floor)"
V1 = "kernelgw /v1 WebSocket"
CHANNELS = "kernelgw Jupyter channels"
STOCK = "stock Kernel Gateway channels (no sandbox)"
GOAL_MS = 1.0
KG_IMAGE = "kernelgw/bench-kernel-gateway:latest"
KG_PACKAGE = "jupyter_kernel_gateway"


class ChannelsConn:
    """A Jupyter channels WebSocket with JSON frames, as Open WebUI and AutoGen use it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = uuid.uuid4().hex
        self.ws: Any = None

    async def __aenter__(self) -> ChannelsConn:
        from websockets.asyncio.client import connect

        self.ws = await connect(f"{self.url}?session_id={self.session}", max_size=None, compression=None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.close()

    async def execute(self, code: str) -> tuple[float, str]:
        """(elapsed ms, the result's text/plain) once the reply and the idle status came."""
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "bench",
            "session": self.session,
            "date": "2026-01-01T00:00:00.000000Z",
            "version": "5.3",
        }
        msg = {
            "header": header,
            "parent_header": {},
            "metadata": {},
            "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {}},
            "buffers": [],
        }
        t0 = time.perf_counter()
        await self.ws.send(json.dumps(msg))
        reply = idle = False
        result = ""
        while not (reply and idle):
            m = json.loads(await self.ws.recv())
            if (m.get("parent_header") or {}).get("msg_id") != msg_id:
                continue
            kind = m.get("msg_type") or m["header"]["msg_type"]
            if kind == "execute_reply":
                reply = True
            elif kind == "status" and m["content"]["execution_state"] == "idle":
                idle = True
            elif kind == "execute_result":
                result = m["content"]["data"].get("text/plain", "")
        return (time.perf_counter() - t0) * 1000, result


# ------------------------------------------------------------ stock Kernel Gateway
def build_kernel_gateway_image(base: str) -> str:
    """The kernel image plus jupyter_kernel_gateway (its wheels fetched on the host,
    the build itself offline); the package's version."""
    with tempfile.TemporaryDirectory(prefix="kgwb-kg-") as ctx:
        wheels = Path(ctx) / "wheels"
        python = "3.11"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--only-binary=:all:",
                "--python-version",
                python,
                "--platform",
                "manylinux2014_x86_64",
                "--dest",
                str(wheels),
                KG_PACKAGE,
            ],
            check=True,
        )
        version = next(p.name.split("-")[1] for p in wheels.glob("jupyter_kernel_gateway-*.whl"))
        (Path(ctx) / "Dockerfile").write_text(
            f"FROM {base}\n"
            "USER 0:0\n"
            "COPY wheels /tmp/wheels\n"
            f"RUN /opt/kernel/bin/python -m pip install --no-index --find-links /tmp/wheels {KG_PACKAGE} "
            "&& rm -rf /tmp/wheels\n"
            "USER 61000:61000\n"
        )
        print(f"building {KG_IMAGE} ({KG_PACKAGE} {version}) ...", flush=True)
        subprocess.run(
            ["docker", "build", "--quiet", "--network", "none", "-t", KG_IMAGE, ctx],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return version


class StockKernelGateway:
    """``jupyter kernelgateway`` in a container of the image above, on a published port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.container = f"kgwb-stock-kg-{self.port}"

    def __enter__(self) -> StockKernelGateway:
        subprocess.run(
            [
                "docker",
                "run",
                "-d",
                "--rm",
                "--name",
                self.container,
                # the host's network: no docker-proxy between client and gateway
                # (through a published port, its relay added ~40 ms per round trip)
                "--network",
                "host",
                "--tmpfs",
                "/tmp:exec,mode=1777",
                KG_IMAGE,
                "/opt/kernel/bin/jupyter",
                "kernelgateway",
                "--KernelGatewayApp.ip=127.0.0.1",
                f"--KernelGatewayApp.port={self.port}",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/api", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                logs = subprocess.run(["docker", "logs", self.container], capture_output=True, text=True)
                raise RuntimeError(f"the stock Kernel Gateway did not start:\n{logs.stdout}{logs.stderr}")
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["docker", "rm", "-f", self.container], capture_output=True, check=False)


# ------------------------------------------------------------ the run
async def measure(gw_url: str, kg_url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    async with httpx.AsyncClient(timeout=120) as http:
        created = await http.post(f"{gw_url}/api/kernels", json={"name": "python3"})
        created.raise_for_status()
        kid = created.json()["id"]
        stock = await http.post(f"{kg_url}/api/kernels", json={"name": "python3"})
        stock.raise_for_status()
        stock_id = stock.json()["id"]
        _, conn_dir = session_container(kid)
        ws_base = gw_url.replace("http://", "ws://")
        samples: dict[str, list[float]] = {FLOOR: [], V1: [], CHANNELS: [], STOCK: []}
        async with (
            RawKernel(conn_dir) as raw,
            WsConn(f"{ws_base}/v1/sessions/{kid}/ws") as v1,
            ChannelsConn(f"{ws_base}/api/kernels/{kid}/channels") as channels,
            ChannelsConn(f"{kg_url.replace('http://', 'ws://')}/api/kernels/{stock_id}/channels") as stock_ws,
        ):

            async def one(name: str) -> float:
                if name == FLOOR:
                    ms, _ = await raw.execute("1+1")
                elif name == V1:
                    ms, events = await v1.execute("1+1")
                    assert events[-1]["status"] == "ok", events[-1]
                else:
                    ms, text = await (channels if name == CHANNELS else stock_ws).execute("1+1")
                    assert text == "2", (name, text)
                return ms

            for name in samples:  # warm-up, not counted
                for _ in range(5):
                    await one(name)
            for r in range(rounds):
                order = list(samples)
                random.shuffle(order)
                for name in order:
                    for _ in range(per_round):
                        samples[name].append(await one(name))
                if (r + 1) % max(1, rounds // 10) == 0:
                    print(f"round {r + 1}/{rounds}", flush=True)
        await http.delete(f"{gw_url}/api/kernels/{kid}")
        await http.delete(f"{kg_url}/api/kernels/{stock_id}")
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=3, help="samples of each row per round")
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "jupyter.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "jupyter.png")
    ap.add_argument("--quick", action="store_true", help="10 rounds (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.rounds = min(args.rounds, 10)

    machine = machine_info(args.image)
    version = build_kernel_gateway_image(args.image)
    with Gateway("jupyter", image=args.image, env={"KERNELGW_POOL_SIZE": "0"}) as gw, StockKernelGateway() as kg:
        load_before = other_activity()
        samples = asyncio.run(measure(gw.url, kg.url, args.rounds, args.per_round))
        load_after = other_activity()
    rows = [summary(name, values) for name, values in samples.items()]
    p50 = {row["name"]: row["p50_ms"] for row in rows}
    gap = p50[CHANNELS] - p50[V1]
    result = {
        "benchmark": "jupyter",
        "date": now_iso(),
        "machine": machine,
        "kernel_gateway_version": version,
        "args": vars(args) | {"json": str(args.json), "chart": str(args.chart)},
        "load": {"before": load_before, "after": load_after},
        "rows": rows,
        "channels_minus_v1_p50_ms": round(gap, 3),
        "goal_ms": GOAL_MS,
        "goal_met": gap <= GOAL_MS,
    }
    print_table(f"1+1 over Jupyter channels ({result['date']}, floor: {FLOOR})", rows, FLOOR)
    print(
        f"\nkernelgw channels - kernelgw /v1 WebSocket at p50: {gap:+.2f} ms "
        f"(goal: within {GOAL_MS:g} ms: {'met' if gap <= GOAL_MS else 'MISSED'}); "
        f"stock Kernel Gateway {version}; load {load_before} -> {load_after}"
    )
    if args.json:
        write_json(args.json, result)
    if args.chart:
        draw_bars([("1+1 round trip", rows)], args.chart, title="1+1 over Jupyter channels", floor_names=[FLOOR])


if __name__ == "__main__":
    main()
