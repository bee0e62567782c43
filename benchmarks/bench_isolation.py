"""Isolation (issue 15, item 1): do four bystanders' `1+1` slow down while one session floods?

One gateway with its default settings (16 MiB output cap per cell, 64 MiB
largest kernel message), five sessions: four bystanders and one flooder. Each
bystander has its own WebSocket and runs `1+1` after `1+1`; the four run at
once, each starting one every 100 ms. The flooder's driver is a separate process (its JSON decoding must not
share the measuring process's CPU time or event loop); it runs one kind of flood
cell after another until told to stop:

  print    a print loop at full speed: 50 MB of 100-byte lines per cell
  display  10,000 display messages per cell
  line     one 100 MB line per cell (over the largest message: refused by ZMQ)

A fifth bystander runs the same paced `1+1` straight to its kernel with
jupyter_client, bypassing the gateway: the floor, what the machine's two cores
alone do to a `1+1` while the flood's kernel and client take their share.

Phases alternate, a quiet phase before each flood phase, and the rounds repeat,
so that drift on this shared machine hits quiet and flooded phases alike. The
verdict compares each flood's bystander p95 and p99 with those of all quiet
phases of the same run (goal: p95 within 1.25x, p99 within 1.5x).

Run:  .venv/bin/python benchmarks/bench_isolation.py [--quick] [--kinds print,display,line]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
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
    proc_status_kib,
    session_container,
    summary,
    write_json,
)

BYSTANDERS = 4
P95_GOAL = 1.25
P99_GOAL = 1.5

FLOODS = {
    "print": "import sys\nline = 'y' * 99 + '\\n'\nfor _ in range(500_000):\n    sys.stdout.write(line)\n",
    "display": "from IPython.display import display\nfor i in range(10_000):\n    display(i)\n",
    "line": "print('y' * 100_000_000)\n",
}
DESCRIBED = {
    "print": "printing at full speed (50 MB of lines per cell)",
    "display": "sending 10,000 display messages per cell",
    "line": "printing one 100 MB line per cell",
}


def flooder(ws_url: str, code: str, started: Any, stop: Any, out: Any) -> None:
    """The flooder's driver (own process): flood cell after flood cell until `stop`.
    Niced: it stands for a client on another machine, not for a part of the
    system under test, so it should take the CPU it needs only when nobody else does."""
    os.nice(10)

    async def run() -> dict[str, Any]:
        import json
        import uuid

        from websockets.asyncio.client import connect

        stats: dict[str, Any] = {"executions": 0, "events": 0, "output_chars": 0, "statuses": [], "seconds": []}
        async with connect(ws_url, max_size=None, compression=None) as ws:
            while not stop.is_set():
                eid = uuid.uuid4().hex
                t0 = time.perf_counter()
                await ws.send(json.dumps({"type": "execute", "code": code, "execution_id": eid}))
                started.set()  # the cell is sent: the kernel floods from now on
                while True:
                    event = json.loads(await ws.recv())
                    if event.get("execution_id") != eid:
                        continue
                    stats["events"] += 1
                    if event["type"] == "stream":
                        stats["output_chars"] += len(event["text"])
                    elif event["type"] == "done":
                        stats["statuses"].append(event["status"])
                        if event["status"] != "ok":  # why, in the results: a flood must not kill its kernel
                            stats.setdefault("reasons", []).append(event.get("reason"))
                        break
                stats["executions"] += 1
                stats["seconds"].append(time.perf_counter() - t0)
        return stats

    out.put(asyncio.run(run()))


INTERVAL_S = 0.1
"""A bystander starts a `1+1` this often (or at once when the last took longer):
sessions that work, not ones that saturate the machine's two cores by themselves."""


async def bystanders(conns: list[WsConn], raw: RawKernel, n: int) -> tuple[list[float], list[float]]:
    """`n` paced `1+1` in every bystander at once, and as many straight to one
    more bystander's kernel with jupyter_client (the floor: what the machine
    alone does to a `1+1` meanwhile); their round trips, ms."""

    async def one(i: int, ws: WsConn | RawKernel) -> list[float]:
        samples = []
        await asyncio.sleep(INTERVAL_S * i / len(conns))  # spread over the interval
        for _ in range(n):
            t0 = time.perf_counter()
            ms, events = await ws.execute("1+1")
            if isinstance(ws, WsConn) and events[-1]["status"] != "ok":
                raise RuntimeError(f"a bystander's 1+1 ended {events[-1]['status']}")
            samples.append(ms)
            await asyncio.sleep(max(0.0, INTERVAL_S - (time.perf_counter() - t0)))
        return samples

    *parts, floor = await asyncio.gather(*(one(i, ws) for i, ws in enumerate([*conns, raw])))
    return [ms for part in parts for ms in part], floor


async def phases(
    urls: list[str], raw_conn: Path, flood_url: str, kinds: list[str], rounds: int, n: int, ctx: Any, cpu: CpuMeter
) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"quiet": [], **{k: [] for k in kinds}}
    floor: dict[str, list[float]] = {"quiet": [], **{k: [] for k in kinds}}
    floods: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    cores: dict[str, list[dict[str, float]]] = {"quiet": [], **{k: [] for k in kinds}}
    conns = [WsConn(u) for u in urls]
    for c in conns:
        await c.__aenter__()
    raw = await RawKernel(raw_conn).__aenter__()
    try:
        await bystanders(conns, raw, 10)  # warm-up
        for r in range(rounds):
            for kind in kinds:
                print(f"round {r + 1}/{rounds}: quiet, then {kind}", flush=True)
                cpu.start()
                ws_ms, raw_ms = await bystanders(conns, raw, n)
                cores["quiet"].append(cpu.stop())
                samples["quiet"] += ws_ms
                floor["quiet"] += raw_ms
                started, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
                proc = ctx.Process(target=flooder, args=(flood_url, FLOODS[kind], started, stop, out))
                proc.start()
                if not await asyncio.to_thread(started.wait, 120):
                    proc.terminate()
                    raise RuntimeError("the flood did not start")
                await asyncio.sleep(0.3)  # the kernel is flooding by now
                cpu.start()
                ws_ms, raw_ms = await bystanders(conns, raw, n)
                cores[kind].append(cpu.stop())
                samples[kind] += ws_ms
                floor[kind] += raw_ms
                stop.set()
                floods[kind].append(await asyncio.to_thread(out.get, True, 600))
                await asyncio.to_thread(proc.join, 60)
                await asyncio.sleep(1.0)  # the flooder's last cell is over before the next quiet phase
    finally:
        await raw.__aexit__(None, None, None)
        for c in conns:
            await c.__aexit__(None, None, None)
    avg = {ph: {k: sum(x[k] for x in v) / len(v) for k in v[0]} for ph, v in cores.items() if v}
    return {"samples": samples, "floor": floor, "floods": floods, "cpu_cores": avg}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small n (a smoke run)")
    ap.add_argument("--n", type=int, help="1+1 per bystander per phase (default 60, quick 20)")
    ap.add_argument("--rounds", type=int, help="rounds over the kinds (default 3, quick 1)")
    ap.add_argument("--kinds", default=",".join(FLOODS), help="flood kinds, comma-separated")
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "isolation.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "isolation.png")
    args = ap.parse_args()
    n = args.n or (20 if args.quick else 60)
    rounds = args.rounds or (1 if args.quick else 3)
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - set(FLOODS):
        ap.error(f"unknown flood kinds: {sorted(unknown)}")
    machine = machine_info(args.image)
    ctx = mp.get_context("spawn")

    with Gateway("isolation", image=args.image) as gw, httpx.Client(base_url=gw.url, timeout=120) as c:
        ids = [c.post("/v1/sessions", json={}).json()["id"] for _ in range(BYSTANDERS + 2)]
        containers = {f"s{i}": session_container(sid)[0] for i, sid in enumerate(ids)}
        cpu = CpuMeter(gw.pid, containers)
        rss_idle = gw.rss_kib() / 1024
        out = asyncio.run(
            phases(
                [gw.ws_url(s) for s in ids[:BYSTANDERS]],
                session_container(ids[BYSTANDERS])[1],
                gw.ws_url(ids[-1]),
                kinds,
                rounds,
                n,
                ctx,
                cpu,
            )
        )
        rss_after = gw.rss_kib() / 1024
        peak = proc_status_kib(gw.pid, "VmHWM") / 1024
        for sid in ids:
            c.delete(f"/v1/sessions/{sid}")

    s, fl = out["samples"], out["floor"]
    quiet = summary("bystanders, no flood", s["quiet"])
    rows = [quiet]
    floor_rows = [summary("floor (raw jupyter_client), no flood", fl["quiet"])]
    verdicts = {}
    for kind in kinds:
        row = summary(f"bystanders, one session {DESCRIBED[kind]}", s[kind])
        rows.append(row)
        floor_rows.append(summary(f"floor (raw jupyter_client), {kind} flood", fl[kind]))
        p95, p99 = row["p95_ms"] / quiet["p95_ms"], row["p99_ms"] / quiet["p99_ms"]
        verdicts[kind] = {
            "p95_ratio": p95,
            "p99_ratio": p99,
            "floor_p95_ratio": floor_rows[-1]["p95_ms"] / floor_rows[0]["p95_ms"],
            "floor_p99_ratio": floor_rows[-1]["p99_ms"] / floor_rows[0]["p99_ms"],
            "met": p95 <= P95_GOAL and p99 <= P99_GOAL,
            "flood": {
                "executions": sum(f["executions"] for f in out["floods"][kind]),
                "events": sum(f["events"] for f in out["floods"][kind]),
                "output_chars": sum(f["output_chars"] for f in out["floods"][kind]),
                "statuses": sorted({st for f in out["floods"][kind] for st in f["statuses"]}),
                "reasons": sorted({str(r) for f in out["floods"][kind] for r in f.get("reasons", [])}),
            },
        }
    result = {
        "benchmark": "isolation",
        "date": now_iso(),
        "machine": machine,
        "load_average": os.getloadavg(),
        "args": vars(args) | {"json": str(args.json), "chart": str(args.chart)},
        "bystanders": BYSTANDERS,
        "n_per_bystander_per_phase": n,
        "rounds": rounds,
        "rows": rows,
        "floor_rows": floor_rows,
        "goal": {"p95_ratio": P95_GOAL, "p99_ratio": P99_GOAL},
        "verdicts": verdicts,
        "cpu_cores": out["cpu_cores"],
        "gateway_rss_mib": {"idle": rss_idle, "after": rss_after, "peak": peak},
    }
    print_table(f"1+1 in {BYSTANDERS} bystander sessions at once, over the WebSocket ({result['date']})", rows)
    print_table("1+1 in one more bystander, straight to its kernel (the machine's own share)", floor_rows)
    print(f"\nload average at the end: {result['load_average']}")
    print(
        "\n| flood | p95 / quiet p95 | p99 / quiet p99 | goal met | floor p95 / quiet | floor p99 / quiet"
        " | flood cells | events | statuses |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, v in verdicts.items():
        f = v["flood"]
        print(
            f"| {kind} | {v['p95_ratio']:.2f}x | {v['p99_ratio']:.2f}x | {'yes' if v['met'] else 'no'}"
            f" | {v['floor_p95_ratio']:.2f}x | {v['floor_p99_ratio']:.2f}x | {f['executions']} | {f['events']} | {', '.join(f['statuses'])} |"
        )
    print(f"\nCPU, cores used on average (of {machine['cores']}): {out['cpu_cores']}")
    print(f"gateway RSS, MiB: {result['gateway_rss_mib']}")
    if args.json:
        write_json(args.json, result)
    if args.chart:
        draw_bars(
            [("1+1 in four bystanders", rows), ("floor: raw jupyter_client", floor_rows)],
            args.chart,
            title=f"Flood isolation, {result['date'][:10]}",
            floor_names=[quiet["name"]],
        )


if __name__ == "__main__":
    main()
