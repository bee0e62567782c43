"""Isolation: is `1+1` in session A slowed while session B floods output?

One gateway, two sessions. B's driver is a separate process (its JSON decoding
must not share the measuring process's CPU time or event loop): it runs a cell
printing 50 MB (100-byte lines) over its own WebSocket, reads every event, and
starts the next one at once, until told to stop. The gateway's per-execution
output cap is raised to 64 MiB for this run so that all 50 MB really flow through
it to B's watcher (with the default 16 MiB cap the rest would be dropped behind a
`truncated` event: an easier case).

Meanwhile A runs `1+1`, alternating between the kernelgw WebSocket and raw
jupyter_client on A's kernel sockets (the floor). Rounds alternate a baseline
phase (B idle) and a flood phase, so drift hits both. The raw floor separates
the machine's own contention (2 cores shared by B's kernel, the gateway and the
clients) from any delay the gateway adds.

Run:  .venv/bin/python benchmarks/bench_flood.py [--quick] [--mb 50] [--json docs/bench/flood.json]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    DOCS_BENCH,
    CpuMeter,
    Gateway,
    RawKernel,
    WsConn,
    draw_bars,
    machine_info,
    now_iso,
    print_table,
    session_container,
    summary,
    write_json,
)


def flood_code(mb: int) -> str:
    lines = mb * 1_000_000 // 100
    return f"import sys\nline = 'y' * 99 + '\\n'\nfor _ in range({lines}):\n    sys.stdout.write(line)\n"


def flooder(ws_url: str, code: str, started: Any, stop: Any, out: Any) -> None:
    """B's driver (own process): flood back to back until `stop`; report what arrived."""

    async def run() -> dict[str, Any]:
        import json
        import uuid

        from websockets.asyncio.client import connect

        stats: dict[str, Any] = {
            "executions": 0,
            "bytes": 0,
            "seconds": [],
            "truncated": 0,
            "statuses": [],
            "stream_events": 0,
            "max_event_bytes": 0,
        }
        async with connect(ws_url, max_size=None, compression=None) as ws:
            while not stop.is_set():
                eid = uuid.uuid4().hex
                t0 = time.perf_counter()
                got = 0
                await ws.send(json.dumps({"type": "execute", "code": code, "execution_id": eid}))
                while True:
                    event = json.loads(await ws.recv())
                    if event.get("execution_id") != eid:
                        continue
                    if event["type"] == "stream":
                        got += len(event["text"])
                        stats["stream_events"] += 1
                        stats["max_event_bytes"] = max(stats["max_event_bytes"], len(event["text"]))
                        if not started.is_set():
                            started.set()
                    elif event["type"] == "truncated":
                        stats["truncated"] += 1
                    elif event["type"] == "done":
                        stats["statuses"].append(event["status"])
                        break
                stats["executions"] += 1
                stats["bytes"] += got
                stats["seconds"].append(time.perf_counter() - t0)
        return stats

    out.put(asyncio.run(run()))


async def measure(ws: WsConn, raw: RawKernel, n: int) -> tuple[list[float], list[float]]:
    w, r = [], []
    for _ in range(n):
        ms, events = await ws.execute("1+1")
        assert events[-1]["status"] == "ok"
        w.append(ms)
        ms, _ = await raw.execute("1+1")
        r.append(ms)
    return w, r


async def phases(
    a_ws_url: str, a_conn: Path, b_ws_url: str, code: str, rounds: int, n: int, ctx: Any, cpu: CpuMeter
) -> dict[str, Any]:
    s: dict[str, list[float]] = {"ws_base": [], "raw_base": [], "ws_flood": [], "raw_flood": []}
    flood_stats = []
    cpu_use: dict[str, list[dict[str, float]]] = {"idle": [], "flood": []}
    async with WsConn(a_ws_url) as ws, RawKernel(a_conn) as raw:
        await measure(ws, raw, 10)  # warm-up
        for r in range(rounds):
            print(f"round {r + 1}/{rounds}: baseline", flush=True)
            cpu.start()
            w, rr = await measure(ws, raw, n)
            cpu_use["idle"].append(cpu.stop())
            s["ws_base"] += w
            s["raw_base"] += rr
            print(f"round {r + 1}/{rounds}: flood", flush=True)
            started, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
            proc = ctx.Process(target=flooder, args=(b_ws_url, code, started, stop, out))
            proc.start()
            if not started.wait(120):
                proc.terminate()
                raise RuntimeError("the flood did not start")
            cpu.start()
            w, rr = await measure(ws, raw, n)
            cpu_use["flood"].append(cpu.stop())
            s["ws_flood"] += w
            s["raw_flood"] += rr
            stop.set()
            flood_stats.append(out.get(timeout=600))
            proc.join(60)
            await asyncio.sleep(1.0)  # B idle again before the next baseline
    avg = {ph: {k: sum(x[k] for x in v) / len(v) for k in v[0]} for ph, v in cpu_use.items()}
    return {"samples": s, "flood": flood_stats, "cpu_cores": avg}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small n (a smoke run)")
    ap.add_argument("--n", type=int, help="1+1 samples per transport and phase per round (default 150, quick 40)")
    ap.add_argument("--rounds", type=int, help="baseline/flood rounds (default 3, quick 2)")
    ap.add_argument("--mb", type=int, default=50, help="output per flood execution, MB")
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "flood.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "flood.png")
    args = ap.parse_args()
    n = args.n or (40 if args.quick else 150)
    rounds = args.rounds or (2 if args.quick else 3)
    machine = machine_info(args.image)
    ctx = mp.get_context("spawn")

    env = {"KERNELGW_MAX_OUTPUT_BYTES": str(64 * 2**20)}
    with Gateway("flood", image=args.image, env=env) as gw, httpx.Client(base_url=gw.url, timeout=120) as c:
        a = c.post("/v1/sessions", json={}).json()["id"]
        b = c.post("/v1/sessions", json={}).json()["id"]
        a_cid, a_conn = session_container(a)
        b_cid, _ = session_container(b)
        cpu = CpuMeter(gw.pid, {"A": a_cid, "B": b_cid})
        out = asyncio.run(phases(gw.ws_url(a), a_conn, gw.ws_url(b), flood_code(args.mb), rounds, n, ctx, cpu))
        # What the flood left in the gateway: B's events stay in its replay buffer (bounded by count)
        time.sleep(2)
        rss = {"after_flood": gw.rss_kib() / 1024}
        c.delete(f"/v1/sessions/{b}")
        time.sleep(2)
        rss["after_deleting_b"] = gw.rss_kib() / 1024
        c.delete(f"/v1/sessions/{a}")
        time.sleep(1)
        rss["after_deleting_both"] = gw.rss_kib() / 1024

    s = out["samples"]
    rows = [
        summary("A raw jupyter_client, B idle (floor)", s["raw_base"]),
        summary("A raw jupyter_client, B flooding", s["raw_flood"]),
        summary("A kernelgw WebSocket, B idle", s["ws_base"]),
        summary("A kernelgw WebSocket, B flooding", s["ws_flood"]),
    ]
    floods = out["flood"]
    execs = sum(f["executions"] for f in floods)
    secs = [x for f in floods for x in f["seconds"]]
    total_bytes = sum(f["bytes"] for f in floods)
    flood = {
        "mb_per_execution": args.mb,
        "executions": execs,
        "bytes_received": total_bytes,
        "complete": all(f["truncated"] == 0 and f["bytes"] == f["executions"] * args.mb * 1_000_000 for f in floods),
        "truncated_events": sum(f["truncated"] for f in floods),
        "stream_events": sum(f["stream_events"] for f in floods),
        "mean_event_bytes": total_bytes / max(1, sum(f["stream_events"] for f in floods)),
        "max_event_bytes": max(f["max_event_bytes"] for f in floods),
        "statuses": sorted({st for f in floods for st in f["statuses"]}),
        "mb_per_s": total_bytes / 1e6 / sum(secs) if secs else None,
        "seconds_per_execution_p50": sorted(secs)[len(secs) // 2] if secs else None,
    }
    result = {
        "benchmark": "flood",
        "date": now_iso(),
        "machine": machine,
        "args": vars(args) | {"json": str(args.json), "chart": str(args.chart)},
        "floor": rows[0]["name"],
        "rows": rows,
        "flood": flood,
        "gateway_rss_mib": rss,
        "n_per_phase_round": n,
        "rounds": rounds,
        "cpu_cores": out["cpu_cores"],
        "overhead_ms": {
            "p50_idle": rows[2]["p50_ms"] - rows[0]["p50_ms"],
            "p50_flood": rows[3]["p50_ms"] - rows[1]["p50_ms"],
            "p95_idle": rows[2]["p95_ms"] - rows[0]["p95_ms"],
            "p95_flood": rows[3]["p95_ms"] - rows[1]["p95_ms"],
        },
    }
    print_table(
        f"1+1 in session A while session B prints {args.mb} MB per cell ({result['date']})", rows, rows[0]["name"]
    )
    print(f"\nflood: {flood}")
    print(f"gateway overhead (WebSocket minus raw, same phase): {result['overhead_ms']}")
    print(f"gateway RSS, MiB: {rss}")
    print(f"CPU, cores used on average (of {machine['cores']}): {out['cpu_cores']}")
    if args.json:
        write_json(args.json, result)
    if args.chart:
        draw_bars(
            [("1+1 in session A", rows)],
            args.chart,
            title=f"Output flood isolation ({args.mb} MB per cell in B), {result['date'][:10]}",
            floor_names=[rows[0]["name"]],
        )


if __name__ == "__main__":
    main()
