"""What "acknowledged means stored" costs: `1+1` over the WebSocket, interleaved,
on a gateway built from an older source tree (``--before``, e.g. a `git archive`
of the commit before the change) and on this tree, with raw jupyter_client to
this tree's session kernel as the floor.

Both gateways run as ``python -m kernelgw serve`` with the working directory at
their tree (so that tree's package is the one imported), SQLite history in a
throwaway data directory, one session each. Each round takes one sample of each
row in a shuffled order, so load drift hits all alike; the load average is
stored next to the table, and each gateway's CPU time per cell (all its threads,
from the send of its cell to its done, and over the whole measured run, which
for this tree includes reading the floor's iopub: less sensitive to load than
latency). Goal: this tree's WebSocket `1+1` within 1 ms of raw
jupyter_client at p50.

Run:  git archive d7b8a43 | tar -x -C /tmp/kgw_before
      .venv/bin/python benchmarks/bench_ack.py --before /tmp/kgw_before [--before-commit d7b8a43] [--rounds 400]
      [--idle-sessions 11 --block 20 --rounds 20]  (blocks of samples, beside idle sessions)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common
from _common import (
    DEFAULT_IMAGE,
    DOCS_BENCH,
    Gateway,
    RawKernel,
    WsConn,
    draw_bars,
    machine_info,
    now_iso,
    other_activity,
    print_table,
    session_container,
    summary,
)

FLOOR = "raw jupyter_client (floor)"
BEFORE = "kernelgw WebSocket, before"
AFTER = "kernelgw WebSocket, this tree"
GOAL_MS = 1.0
POOL_SIZE = 2
"""The gateways' warm pool (the default `pool_size`)."""


# Runs the gateway's CLI; when its history store closes (the gateway stops), writes to
# $KGWB_STORE_LATENCY the store's queue-to-commit time of every row it wrote
# (``Store.write_latency_ms``, kept by both trees) and, where the writer is its own
# class (this tree), each row's kind and whether a caller waited for its commit (an
# execution's end row is what the answer waits for). Nothing else is changed.
STORE_LATENCY_PROBE = r"""
import json, os, re, sys, time
import kernelgw.storage.store as _store
_ops = []
try:
    import kernelgw.storage.writer as _writer
except ImportError:
    _writer = None
if _writer is not None and hasattr(_writer, "Writer"):
    _committed = _writer.Writer._committed
    def committed(self, batch, results):
        done = time.perf_counter()
        for op in batch:
            kind = " ".join(w for w in op.what.split() if not re.fullmatch(r"[0-9a-f-]{8,}", w))
            _ops.append([kind, op.future is not None, (done - op.queued_at) * 1000])
        return _committed(self, batch, results)
    _writer.Writer._committed = committed
_close = _store.Store.close
async def close(self):
    with open(os.environ["KGWB_STORE_LATENCY"], "w") as f:
        json.dump({"all_ms": list(self.write_latency_ms), "ops": _ops}, f)
    await _close(self)
_store.Store.close = close
from kernelgw.cli.main import main
main(args=sys.argv[1:], prog_name="kernelgw")
"""


class TreeGateway(Gateway):
    """A `Gateway` whose package comes from ``tree`` (its working directory)."""

    def __init__(self, name: str, tree: Path, image: str) -> None:
        super().__init__(name, image=image, env={"KERNELGW_ON_SHUTDOWN": "stop"})  # the older tree ignores it
        self.tree = tree
        self.latency_file = Path(self._data) / "store_latency.json"
        self.env["KGWB_STORE_LATENCY"] = str(self.latency_file)
        self.command = ["-c", STORE_LATENCY_PROBE]
        self.store_latency: dict[str, Any] = {"all_ms": [], "ops": []}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=180)
        if self.latency_file.exists():
            self.store_latency = json.loads(self.latency_file.read_text())
        super().stop()

    def start(self, timeout: float = 90) -> Gateway:
        saved, _common.REPO = _common.REPO, self.tree
        try:
            return super().start(timeout)
        finally:
            _common.REPO = saved


def imported_from(tree: Path) -> str:
    """Where ``import kernelgw`` resolves with ``tree`` as the working directory (a check
    that the older tree's package is the one the `before` gateway runs)."""
    return subprocess.run(
        [sys.executable, "-c", "import kernelgw; print(kernelgw.__file__)"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def process_cpu_s(pid: int) -> float:
    """CPU seconds a process ran, all its threads, to the nanosecond (Linux
    ``/proc/PID/task/*/schedstat``; threads that ended are not counted)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return total / 1e9


async def measure(
    before: Gateway, after: Gateway, rounds: int, warmup: int, idle_sessions: int = 0, block: int = 1
) -> dict[str, Any]:
    """``idle_sessions`` more sessions on each gateway do nothing meanwhile; each
    round takes ``block`` samples of one row after another (rows in shuffled order)."""
    sids = {}
    for label, gw in (("before", before), ("after", after)):
        async with httpx.AsyncClient(base_url=gw.url, timeout=120) as http:
            resp = await http.post("/v1/sessions", json={})
            resp.raise_for_status()
            sids[label] = resp.json()["id"]
            for _ in range(idle_sessions):
                (await http.post("/v1/sessions", json={})).raise_for_status()
    for gw in (before, after):
        # the pool's refills (cold kernel starts) are over before anything is measured
        await asyncio.to_thread(gw.wait_pool_ready, POOL_SIZE)
    samples: dict[str, list[float]] = {FLOOR: [], BEFORE: [], AFTER: []}
    loads: list[float] = []
    async with WsConn(before.ws_url(sids["before"])) as ws_b, WsConn(after.ws_url(sids["after"])) as ws_a:
        raw = RawKernel(session_container(sids["after"])[1])
        async with raw:
            rows = {FLOOR: raw.execute, BEFORE: ws_b.execute, AFTER: ws_a.execute}
            pids = {BEFORE: before.pid, AFTER: after.pid}
            cpu: dict[str, float] = {}
            own = dict.fromkeys(pids, 0.0)
            for i in range(warmup + rounds):
                if i == warmup:
                    cpu = {name: process_cpu_s(pid) for name, pid in pids.items()}
                order = list(rows)
                random.shuffle(order)
                for name in order:
                    for _ in range(block):
                        pid = pids.get(name)
                        start = process_cpu_s(pid) if pid is not None and i >= warmup else 0.0
                        ms, _ = await rows[name]("1+1")
                        if i >= warmup:
                            samples[name].append(ms)
                            if pid is not None:
                                own[name] += process_cpu_s(pid) - start
                if i % 50 == 0:
                    loads.append(os.getloadavg()[0])
    # each gateway served `rounds` cells meanwhile; "during" counts only the time from
    # sending its cell to its done (this tree's gateway also reads the floor's iopub:
    # the raw client shares its session's kernel)
    cpu_us = {
        label: {
            "whole_run": round((process_cpu_s(pids[name]) - cpu[name]) / (rounds * block) * 1e6),
            "during_its_cells": round(own[name] / (rounds * block) * 1e6),
        }
        for label, name in (("before", BEFORE), ("after", AFTER))
    }
    return {"samples": samples, "loadavg_1min_during": [round(x, 2) for x in loads], "gateway_cpu_us_per_cell": cpu_us}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the source tree to compare against")
    parser.add_argument("--before-commit", default=None, help="the commit that tree was archived from (stored)")
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="--rounds 100")
    parser.add_argument(
        "--idle-sessions", type=int, default=0, help="more sessions on each gateway that stay idle meanwhile"
    )
    parser.add_argument("--block", type=int, default=1, help="samples of one row in a row, per round")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--json", type=Path, default=DOCS_BENCH / "ack.json")
    parser.add_argument("--chart", type=Path, default=DOCS_BENCH / "ack.png")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 100
    before_tree = args.before.resolve()
    before_pkg = imported_from(before_tree)
    if not before_pkg.startswith(str(before_tree)):
        sys.exit(f"with {before_tree} as working directory, kernelgw is imported from {before_pkg}")
    machine = machine_info(args.image)
    date = now_iso()
    with (
        TreeGateway("ackold", before_tree, args.image) as before,
        TreeGateway("acknew", _common.REPO, args.image) as after,
    ):
        out = asyncio.run(measure(before, after, args.rounds, args.warmup, args.idle_sessions, args.block))
    # stopped now: each store's queue-to-commit times (in the tree before, nobody waited for them)
    store_rows = [
        summary(f"{label}: all rows", gw.store_latency["all_ms"])
        for label, gw in (("before", before), ("this tree", after))
    ]
    kinds: dict[tuple[str, bool], list[float]] = {}
    for kind, waited, ms in after.store_latency["ops"]:
        kinds.setdefault((kind, waited), []).append(ms)
    store_rows += [
        summary(f"this tree: {kind} ({'answer waits' if waited else 'nobody waits'})", ms, kind=kind, waited=waited)
        for (kind, waited), ms in sorted(kinds.items(), key=lambda kv: -len(kv[1]))
    ]
    rows = [summary(name, s) for name, s in out["samples"].items()]
    floor, after_row, before_row = rows[0], rows[2], rows[1]
    over = after_row["p50_ms"] - floor["p50_ms"]
    result = {
        "benchmark": "ack",
        "date": date,
        "machine": machine,
        "args": vars(args) | {"before": str(before_tree), "json": str(args.json), "chart": str(args.chart)},
        "before_commit": args.before_commit,
        "before_package": before_pkg,
        "floor": FLOOR,
        "rows": rows,
        "rounds": args.rounds,
        "samples_per_row": args.rounds * args.block,
        "warmup": args.warmup,
        "loadavg_1min_during": out["loadavg_1min_during"],
        "gateway_cpu_us_per_cell": out["gateway_cpu_us_per_cell"],
        "store_write_latency": store_rows,
        "goal_ms": GOAL_MS,
        "after_over_floor_p50_ms": over,
        "before_over_floor_p50_ms": before_row["p50_ms"] - floor["p50_ms"],
        "after_over_before_p50_ms": after_row["p50_ms"] - before_row["p50_ms"],
        "after_over_before_p95_ms": after_row["p95_ms"] - before_row["p95_ms"],
        "met": over <= GOAL_MS,
        "activity_end": other_activity(),
    }
    how = f"interleaved in {args.rounds} rounds" + (f" of {args.block}-sample blocks" if args.block > 1 else "")
    if args.idle_sessions:
        how += f", {args.idle_sessions} more sessions idle on each gateway"
    print_table(f"1+1 over the WebSocket, {how} ({date})", rows, floor=FLOOR)
    print(
        f"\nthis tree's WebSocket p50 - raw p50: {over:+.2f} ms (goal <= {GOAL_MS:g} ms: "
        f"{'MET' if result['met'] else 'MISSED'}); before's: {result['before_over_floor_p50_ms']:+.2f} ms; "
        f"this tree - before: p50 {result['after_over_before_p50_ms']:+.2f} ms, "
        f"p95 {result['after_over_before_p95_ms']:+.2f} ms"
    )
    cpu_us = out["gateway_cpu_us_per_cell"]
    for kind in ("during_its_cells", "whole_run"):
        b, a = cpu_us["before"][kind], cpu_us["after"][kind]
        print(f"gateway CPU per cell ({kind.replace('_', ' ')}): before {b} us, this tree {a} us ({a - b:+d} us)")
    print_table("history rows, queue -> commit (ms; every row the gateways wrote, warm-up included)", store_rows)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, cores {os.cpu_count()}")
    if args.json:
        _common.write_json(args.json, result)
    if args.chart:
        draw_bars(
            [(f"1+1 over the WebSocket vs raw jupyter_client, interleaved ({args.rounds} rounds)", rows)],
            args.chart,
            title=f"What 'acknowledged means stored' costs, {date[:10]}, {machine['cores']} cores",
            floor_names=[FLOOR],
            log=False,
            xlabel="milliseconds (bar: p50; marks: p95 |, p99 x)",
        )
        print(f"wrote {args.chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
