"""Core latency benchmark: session start and the `1+1` round trip.

Prints p50/p95/p99 for, all in one run on this machine and image:
  - session create (cold container) over REST
  - `1+1` over the WebSocket, over blocking REST
  - `1+1` over raw jupyter_client against the same kernel (the floor)
  - `docker run --rm IMAGE python -c 1+1` (the one-container-per-snippet pattern)
The fuller suite (warm pool, llm-sandbox, 1 MB / PNG outputs, scale, output flood,
an agent trace) is in the other bench_*.py scripts; scripts/bench.sh runs them all.

Run: .venv/bin/python benchmarks/bench_core.py [--n 200] [--json out.json] [--chart out.png]
This is a benchmark, not a test: numbers vary with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    Gateway,
    RawKernel,
    WsConn,
    docker_run,
    draw_bars,
    machine_info,
    machine_line,
    now_iso,
    print_table,
    rest_execute,
    session_container,
    summary,
    write_json,
)

FLOOR = "1+1 raw jupyter_client (floor)"


async def raw_round_trips(conn_dir: Path, n: int, warmup: int = 10) -> list[float]:
    """The floor: jupyter_client straight to the kernel's sockets, no gateway."""
    async with RawKernel(conn_dir) as raw:
        samples = [(await raw.execute("1+1"))[0] for _ in range(n + warmup)]
    return samples[warmup:]


async def ws_round_trips(ws_url: str, n: int, warmup: int = 10) -> list[float]:
    async with WsConn(ws_url) as ws:
        samples = [(await ws.execute("1+1"))[0] for _ in range(n + warmup)]
    return samples[warmup:]


async def rest_round_trips(url: str, sid: str, n: int, warmup: int = 10) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        samples = [(await rest_execute(client, sid, "1+1"))[0] for _ in range(n + warmup)]
    return samples[warmup:]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    with Gateway("core", image=args.image, port=args.port, env={"KERNELGW_POOL_SIZE": "0"}) as gw:
        async with httpx.AsyncClient(base_url=gw.url, timeout=120) as client:
            create = []
            for _ in range(args.creates):
                t0 = time.perf_counter()
                resp = await client.post("/v1/sessions", json={})
                resp.raise_for_status()
                create.append((time.perf_counter() - t0) * 1000)
                await client.delete(f"/v1/sessions/{resp.json()['id']}")
            rows.append(summary("session create (cold container)", create))

            sid = (await client.post("/v1/sessions", json={})).json()["id"]
            _, conn_dir = session_container(sid)
            # Interleave the transports in rounds so drift in machine load hits all alike.
            raw: list[float] = []
            ws: list[float] = []
            rest: list[float] = []
            per_round = max(1, args.n // args.rounds)
            for _ in range(args.rounds):
                raw += await raw_round_trips(conn_dir, per_round)
                ws += await ws_round_trips(gw.ws_url(sid), per_round)
                rest += await rest_round_trips(gw.url, sid, per_round)
            rows.append(summary(FLOOR, raw))
            rows.append(summary("1+1 kernelgw WebSocket", ws))
            rows.append(summary("1+1 kernelgw REST", rest))
            await client.delete(f"/v1/sessions/{sid}")
    rows.append(
        summary(
            "docker run --rm per snippet", [docker_run(args.image, "print(1+1)")[0] for _ in range(args.docker_runs)]
        )
    )
    machine = machine_info(args.image)
    return {
        "date": now_iso(),
        "machine": machine_line(machine),
        "machine_info": machine,
        "image": args.image,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200, help="round trips per transport")
    parser.add_argument("--quick", action="store_true", help="--n 50 --creates 3 --docker-runs 3")
    parser.add_argument("--creates", type=int, default=10, help="cold session creations")
    parser.add_argument("--docker-runs", type=int, default=10)
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--port", type=int, default=None, help="gateway port (default: a free one)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds for the round trips")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--chart", type=Path, help="also draw a PNG chart here (needs matplotlib)")
    args = parser.parse_args()
    if args.quick:
        args.n, args.creates, args.docker_runs = 50, 3, 3
    result = asyncio.run(main_async(args))
    print_table(f"{result['date']}  {result['machine']}", result["rows"], FLOOR)
    if args.json:
        write_json(args.json, result)
    if args.chart:
        draw_bars(
            [("", result["rows"])],
            args.chart,
            floor_names=[FLOOR],
            title=f"kernelgw core latency, {result['date'][:10]}, {result['machine_info']['cores']} cores",
        )


if __name__ == "__main__":
    main()
