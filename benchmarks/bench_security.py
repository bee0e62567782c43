"""What the security layer costs: API keys, the code policy, and gVisor.

Four gateways, each its own ``kernelgw serve`` process on this machine and image:
  - open: no keys (the floor for the REST and WebSocket rows)
  - keyed: an API key exists, every request carries it
  - keyed + policy: the same, plus a code policy (deny imports/calls/shell)
  - gvisor: no keys, kernels under runsc
Rows (interleaved in rounds so load drift hits all alike): ``1+1`` over REST and
over the WebSocket on each gateway, and a cold session start on runc and runsc.

Run: .venv/bin/python benchmarks/bench_security.py [--n 300] [--json out.json] [--chart out.png]
This is a benchmark, not a test: numbers vary with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    Gateway,
    draw_bars,
    machine_info,
    machine_line,
    now_iso,
    print_table,
    summary,
    write_json,
)

REST_FLOOR = "REST 1+1, open"
WS_FLOOR = "WS 1+1, open"
START_FLOOR = "session start, runc"
POLICY = {
    "KERNELGW_POLICY_DENY_IMPORTS": '["subprocess", "ctypes"]',
    "KERNELGW_POLICY_DENY_CALLS": '["os.system", "eval", "exec"]',
    "KERNELGW_POLICY_DENY_SHELL": "true",
}


def make_key(gw: Gateway) -> str:
    env = {**os.environ, "KERNELGW_DATA_DIR": gw.env["KERNELGW_DATA_DIR"]}
    out = subprocess.run(
        [sys.executable, "-m", "kernelgw", "keys", "create", "bench", "--json"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)["key"]  # type: ignore[no-any-return]


class Target:
    """One gateway with one session, driven over REST and the WebSocket."""

    def __init__(self, gw: Gateway, key: str | None) -> None:
        self.gw = gw
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.AsyncClient(base_url=gw.url, headers=self.headers, timeout=120)
        self.sid = self.ws_sid = ""
        self.ws: Any = None

    async def open(self) -> None:
        from websockets.asyncio.client import connect

        # REST and WebSocket on separate sessions: REST executions publish to the
        # session's watchers, and an unread socket would stall (and time out)
        ids = []
        for _ in range(2):
            resp = await self.http.post("/v1/sessions", json={})
            resp.raise_for_status()
            ids.append(resp.json()["id"])
        self.sid, self.ws_sid = ids
        self.ws = await connect(
            self.gw.ws_url(self.ws_sid), additional_headers=self.headers, max_size=None, compression=None
        )

    async def rest(self) -> float:
        t0 = time.perf_counter()
        resp = await self.http.post(f"/v1/sessions/{self.sid}/execute", json={"code": "1+1"})
        resp.raise_for_status()
        return (time.perf_counter() - t0) * 1000

    async def websocket(self) -> float:
        t0 = time.perf_counter()
        await self.ws.send(json.dumps({"type": "execute", "code": "1+1"}))
        while json.loads(await self.ws.recv())["type"] != "done":
            pass
        return (time.perf_counter() - t0) * 1000

    async def start(self) -> float:
        t0 = time.perf_counter()
        resp = await self.http.post("/v1/sessions", json={})
        resp.raise_for_status()
        elapsed = (time.perf_counter() - t0) * 1000
        await self.http.delete(f"/v1/sessions/{resp.json()['id']}")
        return elapsed

    async def close(self) -> None:
        await self.ws.close()
        for sid in (self.sid, self.ws_sid):
            await self.http.delete(f"/v1/sessions/{sid}")
        await self.http.aclose()


async def measure(targets: dict[str, Target], n: int, starts: int, rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    for t in targets.values():
        await t.open()
        for _ in range(10):  # warm-up
            await t.rest()
            await t.websocket()
    for _ in range(rounds):
        for label, t in targets.items():
            samples.setdefault(f"REST 1+1, {label}", []).extend([await t.rest() for _ in range(n // rounds)])
            samples.setdefault(f"WS 1+1, {label}", []).extend([await t.websocket() for _ in range(n // rounds)])
        for label, runtime in (("open", "runc"), ("gvisor", "runsc")):
            samples.setdefault(f"session start, {runtime}", []).extend(
                [await targets[label].start() for _ in range(max(1, starts // rounds))]
            )
    for t in targets.values():
        await t.close()
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="round trips per row")
    ap.add_argument("--starts", type=int, default=10, help="session starts per runtime")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="n=60, starts=4")
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--chart", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.n, args.starts = 60, 4
    machine = machine_info(args.image)
    print(machine_line(machine))
    gateways = {
        "open": Gateway("sec-open", image=args.image),
        "keyed": Gateway("sec-key", image=args.image),
        "keyed + policy": Gateway("sec-pol", image=args.image, env=POLICY),
        "gvisor": Gateway("sec-gv", image=args.image, env={"KERNELGW_RUNTIME": "runsc"}),
    }
    keys = {label: make_key(gw) if label.startswith("keyed") else None for label, gw in gateways.items()}
    for gw in gateways.values():
        gw.start()
    try:
        targets = {label: Target(gw, keys[label]) for label, gw in gateways.items()}
        samples = asyncio.run(measure(targets, args.n, args.starts, args.rounds))
    finally:
        for gw in gateways.values():
            gw.stop()
    rows = {name: summary(name, values) for name, values in samples.items()}
    rest = [rows[f"REST 1+1, {label}"] for label in gateways]
    ws = [rows[f"WS 1+1, {label}"] for label in gateways]
    start = [rows[START_FLOOR], rows["session start, runsc"]]
    print_table("1+1 over REST (floor: the open gateway)", rest, REST_FLOOR, floor_label="open")
    print_table("1+1 over the WebSocket (floor: the open gateway)", ws, WS_FLOOR, floor_label="open")
    print_table("Cold session start", start, START_FLOOR, floor_label="runc")
    if args.json:
        write_json(
            args.json,
            {
                "machine": machine,
                "date": now_iso(),
                "args": vars(args) | {"json": str(args.json), "chart": str(args.chart)},
                "rest": rest,
                "websocket": ws,
                "start": start,
            },
        )
    if args.chart:
        draw_bars(
            [("1+1 over REST", rest), ("1+1 over the WebSocket", ws), ("cold session start", start)],
            args.chart,
            title="Cost of API keys, the code policy and gVisor",
            floor_names=[REST_FLOOR, WS_FLOOR, START_FLOOR],
        )


if __name__ == "__main__":
    main()
