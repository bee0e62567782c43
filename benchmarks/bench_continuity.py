"""Session continuity: what keeping files across kernels costs, and how long
recovery by replay and a fork take.

All in one run, same machine, same image, gateways without a pool (cold starts):
  - create, restart and delete with ``persistent_workspace`` on (the default: a
    store container and two tmpfs volumes per session) and off (the tmpfs inside
    the kernel's container), interleaved in rounds
  - pause and resume of a session holding nothing, and one holding a 100 MiB
    DataFrame (the snapshot is pickled, moved to the gateway's disk and back)
  - a 20-cell pandas analysis (a 2.2 MB CSV of 100,000 rows uploaded, read, cleaned, grouped,
    joined, modelled with numpy): the 20 cells as first run (the floor), then
    ``restart {"replay": true}`` (wall time of the request, and the replay's own
    ``duration_ms``), then a fork of that session (``{"from": id}``) with 0, 50
    and 200 MB more in its workspace (copy and replay reported apart)

Run:  .venv/bin/python benchmarks/bench_continuity.py [--quick] [--json docs/bench/continuity.json --chart docs/bench/continuity.png]
A benchmark, not a test: numbers vary with the machine's load.
"""

from __future__ import annotations

import argparse
import sys
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

ANALYSIS = [
    "import pandas as pd, numpy as np",
    "df = pd.read_csv('sales.csv')",
    "df['date'] = pd.to_datetime(df['date'])",
    "df = df.dropna()",
    "df['month'] = df['date'].dt.to_period('M').astype(str)",
    "df['revenue'] = df['units'] * df['price']",
    "by_region = df.groupby('region')['revenue'].sum()",
    "by_month = df.groupby('month')['revenue'].sum()",
    "top = df.nlargest(100, 'revenue')",
    "regions = pd.DataFrame({'region': sorted(df.region.unique())}); regions['code'] = range(len(regions))",
    "df = df.merge(regions, on='region')",
    "pivot = df.pivot_table(index='month', columns='region', values='units', aggfunc='sum')",
    "X = np.column_stack([df['units'], df['price'], np.ones(len(df))])",
    "coef, *_ = np.linalg.lstsq(X, df['revenue'].to_numpy(), rcond=None)",
    "df['predicted'] = X @ coef",
    "df['residual'] = df['revenue'] - df['predicted']",
    "summary_stats = df.describe()",
    "outliers = df[np.abs(df.residual) > 3 * df.residual.std()]",
    "report = {'regions': len(by_region), 'months': len(by_month), 'outliers': len(outliers)}",
    "report['total'] = float(df.revenue.sum())",
]


PAUSE_DATAFRAME = (
    "import numpy as np, pandas as pd\n"
    "df = pd.DataFrame(np.random.default_rng(1).random((1_310_720, 10)))  # 10 float64 columns: 100 MiB"
)


def sales_csv(rows: int = 100_000) -> bytes:
    import random

    rng = random.Random(7)
    lines = ["date,region,units,price"]
    for i in range(rows):
        lines.append(
            f"2025-{1 + i % 12:02d}-{1 + i % 28:02d},r{rng.randrange(12)},{rng.randrange(1, 50)},{rng.uniform(1, 99):.2f}"
        )
    return ("\n".join(lines) + "\n").encode()


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return (time.perf_counter() - t0) * 1000, out


def lifecycle(client: httpx.Client) -> tuple[float, float, float]:
    """(create ms, restart ms, delete ms) of one session, a cell run before the restart."""
    ms_create, r = timed(client.post, "/v1/sessions", json={})
    r.raise_for_status()
    sid = r.json()["id"]
    client.post(f"/v1/sessions/{sid}/execute", json={"code": "open('f.txt', 'w').write('x')"}).raise_for_status()
    ms_restart, r = timed(client.post, f"/v1/sessions/{sid}/restart")
    r.raise_for_status()
    ms_delete, r = timed(client.delete, f"/v1/sessions/{sid}")
    r.raise_for_status()
    return ms_create, ms_restart, ms_delete


def run_analysis(client: httpx.Client, sid: str, csv: bytes) -> float:
    """The 20 cells as first run: the sum of their own durations (ms)."""
    client.put(f"/v1/sessions/{sid}/files/sales.csv", content=csv).raise_for_status()
    total = 0.0
    for code in ANALYSIS:
        body = client.post(f"/v1/sessions/{sid}/execute", json={"code": code}).json()
        assert body["status"] == "ok", (code, body["events"][-1])
        total += body["events"][-1]["duration_ms"]
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "continuity.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "continuity.png")
    args = ap.parse_args()
    rounds = 2 if args.quick else 4
    per_round = 2 if args.quick else 3
    analyses = 2 if args.quick else 5
    extras_mb = [0, 50] if args.quick else [0, 50, 200]
    started = now_iso()
    s: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        s.setdefault(key, []).append(value)

    # ---- 1: what the store costs; two gateways, rounds interleaved
    with (
        Gateway("cont-on", image=args.image, env={"KERNELGW_POOL_SIZE": "0"}) as on,
        Gateway(
            "cont-off", image=args.image, env={"KERNELGW_POOL_SIZE": "0", "KERNELGW_PERSISTENT_WORKSPACE": "false"}
        ) as off,
        httpx.Client(base_url=on.url, timeout=300) as c_on,
        httpx.Client(base_url=off.url, timeout=300) as c_off,
    ):
        lifecycle(c_on), lifecycle(c_off)  # warm-up, not counted
        for r in range(rounds):
            print(f"lifecycle round {r + 1}/{rounds}", flush=True)
            for _ in range(per_round):
                for key, client in (("on", c_on), ("off", c_off)):
                    a, b, c = lifecycle(client)
                    add(f"{key}_create", a), add(f"{key}_restart", b), add(f"{key}_delete", c)

        # ---- 2: replay and fork, on the default gateway
        csv = sales_csv()
        for i in range(analyses):
            print(f"analysis {i + 1}/{analyses}", flush=True)
            sid = c_on.post("/v1/sessions", json={}).json()["id"]
            try:
                add("first_run", run_analysis(c_on, sid, csv))
                ms, r = timed(c_on.post, f"/v1/sessions/{sid}/restart", json={"replay": True})
                report = r.json()["replay"]
                assert report["complete"] and report["replayed"] == len(ANALYSIS), report
                add("replay_wall", ms)
                add("replay_own", report["duration_ms"])
                for extra in extras_mb:
                    if extra:
                        code = f"open('extra-{extra}.bin', 'wb').write(bytes({extra} << 20))"
                        c_on.post(f"/v1/sessions/{sid}/execute", json={"code": code}).raise_for_status()
                    ms, r = timed(c_on.post, "/v1/sessions", json={"from": sid})
                    r.raise_for_status()
                    fork = r.json()["fork"]
                    assert fork["replay"]["complete"], fork
                    add(f"fork_{extra}", ms)
                    add(f"fork_{extra}_copy", fork["copy_ms"])
                    add(f"fork_{extra}_replay", fork["replay"]["duration_ms"])
                    add(f"fork_{extra}_mb", fork["copied_bytes"] / 2**20)
                    c_on.delete(f"/v1/sessions/{r.json()['id']}")
                    if extra:
                        c_on.post(
                            f"/v1/sessions/{sid}/execute", json={"code": f"import os; os.remove('extra-{extra}.bin')"}
                        ).raise_for_status()
            finally:
                c_on.delete(f"/v1/sessions/{sid}")

        # ---- 3: pause and resume, an empty namespace and a 100 MB DataFrame
        for i in range(analyses):
            print(f"pause and resume {i + 1}/{analyses}", flush=True)
            for label, code in (("empty", "x = 1"), ("100mb", PAUSE_DATAFRAME)):
                sid = c_on.post("/v1/sessions", json={}).json()["id"]
                try:
                    c_on.post(f"/v1/sessions/{sid}/execute", json={"code": code}).raise_for_status()
                    ms, r = timed(c_on.post, f"/v1/sessions/{sid}/pause")
                    r.raise_for_status()
                    assert not r.json()["namespace"]["failed"], r.json()["namespace"]
                    add(f"pause_{label}", ms)
                    add(f"pause_{label}_mb", r.json()["stored_bytes"] / 2**20)
                    ms, r = timed(c_on.post, f"/v1/sessions/{sid}/resume")
                    r.raise_for_status()
                    add(f"resume_{label}", ms)
                    check = c_on.post(f"/v1/sessions/{sid}/execute", json={"code": "print('df' in dir() or x == 1)"})
                    assert "True" in check.text, check.text
                finally:
                    c_on.delete(f"/v1/sessions/{sid}")

    lifecycle_rows = [
        summary("create, files in the kernel's container (off)", s["off_create"]),
        summary("create, files in a store (default)", s["on_create"]),
        summary("restart, off", s["off_restart"]),
        summary("restart, default", s["on_restart"]),
        summary("delete, off", s["off_delete"]),
        summary("delete, default", s["on_delete"]),
    ]
    replay_rows = [
        summary("20 cells, first run (sum of their durations)", s["first_run"]),
        summary("restart + replay of the 20 cells (request)", s["replay_wall"]),
        summary("replay alone (report's duration_ms)", s["replay_own"]),
    ]
    fork_rows = []
    for extra in extras_mb:
        mb = sum(s[f"fork_{extra}_mb"]) / len(s[f"fork_{extra}_mb"])
        fork_rows += [
            summary(f"fork, {mb:.0f} MB of files: request", s[f"fork_{extra}"]),
            summary(f"fork, {mb:.0f} MB: copy", s[f"fork_{extra}_copy"]),
            summary(f"fork, {mb:.0f} MB: replay", s[f"fork_{extra}_replay"]),
        ]
    pause_rows = []
    for label, what in (("empty", "an empty namespace"), ("100mb", "a 100 MB DataFrame")):
        mb = sum(s[f"pause_{label}_mb"]) / len(s[f"pause_{label}_mb"])
        pause_rows += [
            summary(f"pause, {what} ({mb:.0f} MB kept)", s[f"pause_{label}"]),
            summary(f"resume, {what}", s[f"resume_{label}"]),
        ]
    print_table(
        "Session lifecycle: persistent_workspace on (default) and off",
        lifecycle_rows,
        floor="create, files in the kernel's container (off)",
    )
    print_table(
        "Recovery by replay: a 20-cell pandas analysis",
        replay_rows,
        floor="20 cells, first run (sum of their durations)",
    )
    print_table("Fork of that session", fork_rows, floor=None)
    print_table("Pause and resume", pause_rows, floor=None)
    data = {
        "benchmark": "continuity",
        "date": started,
        "finished": now_iso(),
        "machine": machine_info(args.image),
        "rounds": rounds,
        "analysis_cells": len(ANALYSIS),
        "csv_bytes": len(csv),
        "lifecycle": lifecycle_rows,
        "replay": replay_rows,
        "fork": fork_rows,
        "pause": pause_rows,
    }
    write_json(args.json, data)
    draw_bars(
        [
            ("session lifecycle", lifecycle_rows),
            ("replay, 20 cells", replay_rows),
            ("fork", fork_rows),
            ("pause and resume", pause_rows),
        ],
        args.chart,
        title="Session continuity (p50 bars; p95 |, p99 x)",
        floor_names=["create, files in the kernel's container (off)", "20 cells, first run (sum of their durations)"],
    )
    print(f"\nwrote {args.json} and {args.chart}")


if __name__ == "__main__":
    main()
