"""The warm pool under sustained demand: does the default pool keep up?

A gateway with the default pool (``pool_size`` 2) gets one ``POST /v1/sessions``
every INTERVAL seconds (each session runs ``1+1`` and is deleted a moment later,
as a short agent task would), for a few intervals, with the workspace store on
(the default) and off. Reported: create latency p50/p95/p99 and how many creates
the pool served (``kernelgw_pool_hits``). A create the pool cannot serve is a
cold start (about 0.7-0.8 s here).

Run:  .venv/bin/python benchmarks/bench_pool.py [--quick] [--json docs/bench/pool.json --chart docs/bench/pool.png]
A benchmark, not a test: numbers vary with the machine's load.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    DOCS_BENCH,
    Gateway,
    draw_bars,
    machine_info,
    now_iso,
    print_table,
    summary,
    write_json,
)


def wait_pool_full(gw: Gateway, size: int, timeout: float = 120) -> None:
    if (gw.wait_pool_ready(size, timeout) or 0) < size:
        raise RuntimeError("the pool never filled")


def demand(gw: Gateway, interval: float, creates: int) -> tuple[list[float], int]:
    """Create a session every ``interval`` s; returns create latencies (ms) and pool hits."""
    hits0 = gw.metric("kernelgw_pool_hits") or 0
    latencies: list[float] = []
    workers: list[threading.Thread] = []

    def one(client: httpx.Client) -> None:
        t0 = time.perf_counter()
        r = client.post("/v1/sessions", json={})
        r.raise_for_status()
        latencies.append((time.perf_counter() - t0) * 1000)
        sid = r.json()["id"]
        client.post(f"/v1/sessions/{sid}/execute", json={"code": "1+1"}).raise_for_status()
        client.delete(f"/v1/sessions/{sid}")

    with httpx.Client(base_url=gw.url, timeout=120, limits=httpx.Limits(max_connections=64)) as client:
        start = time.monotonic()
        for i in range(creates):
            time.sleep(max(0.0, start + i * interval - time.monotonic()))
            t = threading.Thread(target=one, args=(client,))
            t.start()
            workers.append(t)
        for t in workers:
            t.join()
    return latencies, int((gw.metric("kernelgw_pool_hits") or 0) - hits0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "pool.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "pool.png")
    args = ap.parse_args()
    creates = 10 if args.quick else 40
    intervals = [1.0, 0.5, 0.25]
    started = now_iso()
    rows: list[dict[str, Any]] = []
    for store in (True, False):
        env = {"KERNELGW_POOL_SIZE": "2"}
        if not store:
            env["KERNELGW_PERSISTENT_WORKSPACE"] = "false"
        label = "store on (default)" if store else "store off"
        with Gateway(f"pool-{'on' if store else 'off'}", image=args.image, env=env) as gw:
            for interval in intervals:
                wait_pool_full(gw, 2)
                print(f"{label}: one create every {interval} s, {creates} creates", flush=True)
                latencies, hits = demand(gw, interval, creates)
                rows.append(
                    summary(
                        f"every {interval:g} s, {label}: create",
                        latencies,
                        interval_s=interval,
                        store=store,
                        pool_hits=hits,
                        creates=creates,
                    )
                )
    print_table("Create latency under sustained demand, pool_size=2", rows, floor=None)
    for r in rows:
        print(f"  {r['name']}: {r['pool_hits']} of {r['creates']} creates served by the pool")
    write_json(
        args.json,
        {"benchmark": "pool", "date": started, "machine": machine_info(args.image), "creates": creates, "rows": rows},
    )
    draw_bars(
        [("one create every N s, pool_size=2", rows)],
        args.chart,
        title="Warm pool under sustained demand (p50 bars; p95 |, p99 x)",
    )
    print(f"wrote {args.json} and {args.chart}")


if __name__ == "__main__":
    main()
