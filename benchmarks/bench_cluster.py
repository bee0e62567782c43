"""The cost of forwarding: `1+1` on a session through a gateway that does not own
it (the request is forwarded to the owner) against through its owner.

Two ``kernelgw serve`` processes share one PostgreSQL (a throwaway database on
the server scripts/ensure-postgres.sh runs) and one ``cluster_secret``; one
session lives on gateway A. Rows, interleaved in shuffled order every round so
load drift hits all alike:
  - REST ``POST .../execute`` to the owner A (the floor)
  - REST ``POST .../execute`` to B, forwarded to A (httpx, streamed)
  - /v1 WebSocket to A (execute until ``done``, one connection)
  - /v1 WebSocket to B, relayed to A frame by frame (one connection)
Also: the WebSocket handshake through each (connect, first frame out).

Run:  .venv/bin/python benchmarks/bench_cluster.py [--rounds 200] [--json docs/bench/cluster.json]
A benchmark, not a test: numbers vary with the machine's load (printed with them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    REPO,
    Gateway,
    WsConn,
    draw_bars,
    machine_info,
    now_iso,
    other_activity,
    print_table,
    rest_execute,
    summary,
    write_json,
)

REST_OWNER = "REST to the owner (floor)"
REST_FORWARDED = "REST via a non-owner (forwarded)"
WS_OWNER = "WebSocket to the owner"
WS_RELAYED = "WebSocket via a non-owner (relayed)"
CONNECT_OWNER = "WebSocket connect, owner"
CONNECT_RELAYED = "WebSocket connect, via a non-owner"
SECRET = "bench-cluster-secret"


async def _admin(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def database(base: str | None) -> tuple[str, str, str]:
    """(the benchmark's database URL, the server's admin URL, the database name): a fresh database."""
    base = (
        base
        or subprocess.run(
            ["bash", str(REPO / "scripts/ensure-postgres.sh")], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    url = make_url(base)
    name = f"kgw_bench_cluster_{os.getpid()}"
    admin = url.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    asyncio.run(_admin(admin, f"CREATE DATABASE {name}"))
    return url.set(database=name).render_as_string(hide_password=False), admin, name


async def measure(owner: str, other: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {
        k: [] for k in (REST_OWNER, REST_FORWARDED, WS_OWNER, WS_RELAYED, CONNECT_OWNER, CONNECT_RELAYED)
    }
    async with httpx.AsyncClient(base_url=owner, timeout=60) as a, httpx.AsyncClient(base_url=other, timeout=60) as b:
        created = await a.post("/v1/sessions", json={})
        created.raise_for_status()
        sid = created.json()["id"]
        ws_owner = f"ws{owner[len('http') :]}/v1/sessions/{sid}/ws"
        ws_other = f"ws{other[len('http') :]}/v1/sessions/{sid}/ws"
        check = await b.get(f"/v1/sessions/{sid}")
        if check.headers.get("x-kernelgw-via") is None:
            raise RuntimeError(f"the request through B was not forwarded: {check.headers}")
        async with WsConn(ws_owner) as wa, WsConn(ws_other) as wb:
            for _ in range(5):  # warm both paths (connections, the owner lookup's cache)
                await rest_execute(a, sid, "1+1")
                await rest_execute(b, sid, "1+1")
                await wa.execute("1+1")
                await wb.execute("1+1")

            async def rest(client: httpx.AsyncClient) -> float:
                ms, body = await rest_execute(client, sid, "1+1")
                assert body["status"] == "ok", body
                return ms

            async def ws(conn: WsConn) -> float:
                ms, events = await conn.execute("1+1")
                assert events[-1]["status"] == "ok", events
                return ms

            async def handshake(url: str) -> float:
                t0 = time.perf_counter()
                async with WsConn(url):
                    return (time.perf_counter() - t0) * 1000

            rows = {
                REST_OWNER: lambda: rest(a),
                REST_FORWARDED: lambda: rest(b),
                WS_OWNER: lambda: ws(wa),
                WS_RELAYED: lambda: ws(wb),
                CONNECT_OWNER: lambda: handshake(ws_owner),
                CONNECT_RELAYED: lambda: handshake(ws_other),
            }
            for _ in range(rounds):
                order = [name for name in rows for _ in range(per_round)]
                random.shuffle(order)
                for name in order:
                    samples[name].append(await rows[name]())
        await a.delete(f"/v1/sessions/{sid}")
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=3, help="samples of each row per round")
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--database-url", default=os.environ.get("KERNELGW_TEST_DATABASE_URL"))
    ap.add_argument("--json", type=Path, default=None, help="also write the result here (e.g. docs/bench/cluster.json)")
    ap.add_argument("--chart", type=Path, default=None, help="also draw the rows here (e.g. docs/bench/cluster.png)")
    ap.add_argument("--quick", action="store_true", help="10 rounds (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.rounds = min(args.rounds, 10)

    machine = machine_info(args.image)
    url, admin, name = database(args.database_url)
    env = {
        "KERNELGW_POOL_SIZE": "0",
        "KERNELGW_DATABASE_URL": url,
        "KERNELGW_CLUSTER_SECRET": SECRET,
        "KERNELGW_CLUSTER_HEARTBEAT_S": "1",
    }
    try:
        with (
            Gateway(f"cla{os.getpid()}", image=args.image, env=env) as owner,
            Gateway(f"clb{os.getpid()}", image=args.image, env=env) as other,
        ):
            time.sleep(2)  # a heartbeat or two: each sees the other live
            load_before = other_activity()
            samples = asyncio.run(measure(owner.url, other.url, args.rounds, args.per_round))
            load_after = other_activity()
    finally:
        asyncio.run(_admin(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    rows = [summary(n, v) for n, v in samples.items()]
    p50 = {r["name"]: r["p50_ms"] for r in rows}
    result: dict[str, Any] = {
        "benchmark": "cluster",
        "date": now_iso(),
        "machine": machine,
        "args": vars(args)
        | {"json": str(args.json) if args.json else None, "chart": str(args.chart) if args.chart else None}
        | {"database_url": None},
        "load": {"before": load_before, "after": load_after},
        "rows": rows,
        "rest_forwarding_p50_ms": round(p50[REST_FORWARDED] - p50[REST_OWNER], 3),
        "ws_relay_p50_ms": round(p50[WS_RELAYED] - p50[WS_OWNER], 3),
    }
    print_table(f"1+1 through the owner vs through a non-owner ({result['date']})", rows[:2], REST_OWNER)
    print_table("the same over the /v1 WebSocket", rows[2:4], WS_OWNER)
    print_table("WebSocket handshake", rows[4:], CONNECT_OWNER)
    print(
        f"\nforwarding adds {result['rest_forwarding_p50_ms']:+.2f} ms at p50 over REST, "
        f"{result['ws_relay_p50_ms']:+.2f} ms over the WebSocket; load {load_before} -> {load_after}"
    )
    if args.json:
        write_json(args.json, result)
    if args.chart:
        draw_bars(
            [("REST", rows[:2]), ("/v1 WebSocket", rows[2:4]), ("WebSocket handshake", rows[4:])],
            args.chart,
            title="1+1 through the session's owner and through another gateway",
            floor_names=(REST_OWNER, WS_OWNER, CONNECT_OWNER),
        )


if __name__ == "__main__":
    main()
