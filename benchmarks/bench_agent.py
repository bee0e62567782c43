"""A data-analysis agent's trace, 10 turns, end to end: kernelgw against llm-sandbox.

The turns an LLM agent typically sends for "analyse this sales data": generate and
write a CSV (100k rows with duplicates and gaps), load it, describe, clean, group,
aggregate, plot, pivot, save (CSV + Excel), summarise. The same code runs on:
  - raw jupyter_client on a kernelgw session's kernel (the floor; no gateway, session start not counted)
  - kernelgw through the SDK (sync `Client`): variables persist between turns
  - llm-sandbox `run` (stateless, Docker backend, same image): every turn is a fresh
    `python` process, so every turn must import pandas and re-load (and re-clean,
    re-aggregate, ...) what earlier turns built -- the point of this comparison
  - llm-sandbox interactive `run` (IPython runner): state persists
Plot: kernelgw and the floor get the PNG inline (plt.show()); llm-sandbox saves it
and copies it out (copy_from_runtime): both end with the PNG bytes on the client.
The final summary line must be identical everywhere (checked).

Each repetition interleaves the systems (order rotated). "end to end" adds the
session start (kernelgw: a cold container, no pool) and the close.

Run:  .venv/bin/python benchmarks/bench_agent.py [--quick] [--reps 5] [--json docs/bench/agent.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    DOCS_BENCH,
    LLMSB_WORKDIR,
    Gateway,
    RawKernel,
    failed_row,
    leftover_llmsb_containers,
    llm_sandbox_version,
    llmsb_fetch,
    llmsb_interactive,
    llmsb_session,
    machine_info,
    now_iso,
    print_table,
    remove_llmsb_leftovers,
    session_container,
    summary,
    write_json,
)

from kernelgw import Client

GENERATE = """\
import numpy as np, pandas as pd
rng = np.random.default_rng(42)
n = 100_000
raw = pd.DataFrame({
    "date": pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 366, n), unit="D"),
    "region": rng.choice(["north", "south", "east", "west"], n),
    "product": rng.choice(list("ABCDE"), n),
    "units": rng.integers(-2, 50, n).astype(float),
    "price": rng.normal(20, 5, n).round(2),
})
raw.loc[rng.choice(n, 2_000, replace=False), "units"] = np.nan
raw = pd.concat([raw, raw.sample(1_000, random_state=1)])
raw.to_csv("sales.csv", index=False)
print(len(raw), "rows written")
"""
# state each turn builds, re-run by a stateless sandbox in every later turn that needs it
SETUP = {
    "load": 'import pandas as pd\ndf = pd.read_csv("sales.csv", parse_dates=["date"])\n',
    "clean": (
        'df = df.drop_duplicates()\ndf["units"] = df["units"].fillna(0)\n'
        'df = df[df.units >= 0].copy()\ndf["revenue"] = df.units * df.price\n'
    ),
    "aggregate": (
        'agg = df.groupby(["region", "product"]).agg(revenue=("revenue", "sum"), units=("units", "mean")).round(2)\n'
    ),
    "pivot": (
        'pivot = df.pivot_table(index=df.date.dt.month, columns="region", values="revenue", aggfunc="sum").round(0)\n'
    ),
}
PLOT = (
    'import matplotlib.pyplot as plt\nmonthly = df.set_index("date").revenue.resample("MS").sum()\n'
    'fig, ax = plt.subplots(figsize=(6, 4), dpi=100)\nmonthly.plot(ax=ax)\nax.set_title("monthly revenue")\n'
)
# (name, code, what earlier turns' state it needs)
TURNS: list[tuple[str, str, list[str]]] = [
    ("generate CSV", GENERATE, []),
    ("load", SETUP["load"] + "print(df.shape)\n", []),
    ("describe", "print(df.describe())\n", ["load"]),
    ("clean", SETUP["clean"] + 'print(len(df), "rows after cleaning")\n', ["load"]),
    ("group", 'by_region = df.groupby("region")\nprint(by_region.size())\n', ["load", "clean"]),
    ("aggregate", SETUP["aggregate"] + "print(agg.head(10))\n", ["load", "clean"]),
    ("plot", PLOT + "<SHOW>", ["load", "clean"]),
    ("pivot", SETUP["pivot"] + "print(pivot)\n", ["load", "clean"]),
    (
        "save",
        'pivot.to_csv("pivot.csv")\nagg.to_excel("agg.xlsx")\nprint("saved")\n',
        ["load", "clean", "aggregate", "pivot"],
    ),
    (
        "summary",
        "top = agg.revenue.groupby(level=0).sum().idxmax()\n"
        'print(f"total revenue {df.revenue.sum():,.2f}; top region {top}; rows {len(df)}")\n',
        ["load", "clean", "aggregate"],
    ),
]
SHOW_INLINE = "plt.show()\n"
SHOW_FILE = f"fig.savefig('{LLMSB_WORKDIR}/revenue.png')\nplt.close(fig)\nprint('chart saved')\n"
FLOOR = "raw jupyter_client (floor): 10 turns"


def stateful_code(i: int, show: str) -> str:
    return TURNS[i][1].replace("<SHOW>", show)


def stateless_code(i: int) -> str:
    """What a stateless sandbox must send for turn i: the state it needs, rebuilt, then the turn."""
    _name, code, needs = TURNS[i]
    return "".join(SETUP[k] for k in needs) + code.replace("<SHOW>", SHOW_FILE)


def run_raw(conn_dir: Path) -> tuple[list[float], str]:
    async def go() -> tuple[list[float], str]:
        times, last = [], ""
        async with RawKernel(conn_dir) as raw:
            for i in range(len(TURNS)):
                ms, msgs = await raw.execute(stateful_code(i, SHOW_INLINE))
                assert not any(m["header"]["msg_type"] == "error" for m in msgs), msgs
                if TURNS[i][0] == "plot":
                    assert any("image/png" in m["content"].get("data", {}) for m in msgs)
                last = "".join(m["content"]["text"] for m in msgs if m["header"]["msg_type"] == "stream")
                times.append(ms)
        return times, last

    return asyncio.run(go())


def run_kernelgw(client: Client) -> dict[str, Any]:
    t0 = time.perf_counter()
    session = client.create_session()
    start = (time.perf_counter() - t0) * 1000
    times, last = [], ""
    try:
        for i in range(len(TURNS)):
            t = time.perf_counter()
            run = session.run(stateful_code(i, SHOW_INLINE))
            if TURNS[i][0] == "plot":
                png = run.images[0]  # the chart, on the client
                assert png[:4] == b"\x89PNG"
            times.append((time.perf_counter() - t) * 1000)
            assert run.ok, (TURNS[i][0], run.error)
            last = run.stdout
    finally:
        t = time.perf_counter()
        session.delete()
        close = (time.perf_counter() - t) * 1000
    return {"start": start, "turns": times, "close": close, "summary": last.strip()}


def run_llmsb(make: Callable[[], Any], stateless: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    s = make()
    s.open()
    start = (time.perf_counter() - t0) * 1000
    times, last = [], ""
    try:
        for i in range(len(TURNS)):
            code = stateless_code(i) if stateless else stateful_code(i, SHOW_FILE)
            t = time.perf_counter()
            out = s.run(code)
            if TURNS[i][0] == "plot" and out.exit_code == 0:
                png = llmsb_fetch(s, f"{LLMSB_WORKDIR}/revenue.png")
                assert png[:4] == b"\x89PNG"
            times.append((time.perf_counter() - t) * 1000)
            assert out.exit_code == 0, (TURNS[i][0], out.stderr[-2000:])
            last = out.stdout
    finally:
        t = time.perf_counter()
        s.close()
        close = (time.perf_counter() - t) * 1000
    return {"start": start, "turns": times, "close": close, "summary": last.strip()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one repetition")
    ap.add_argument("--reps", type=int, help="repetitions (default 5, quick 1)")
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--skip-llm-sandbox", action="store_true")
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "agent.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "agent.png")
    args = ap.parse_args()
    reps = args.reps or (1 if args.quick else 5)
    use_llmsb = not args.skip_llm_sandbox and llm_sandbox_version() is not None
    machine = machine_info(args.image)

    systems = ["raw", "kernelgw"] + (["llmsb", "llmsb_i"] if use_llmsb else [])
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in systems}
    with Gateway("agent", image=args.image, env={"KERNELGW_POOL_SIZE": "0"}) as gw, Client(gw.url) as client:
        for r in range(reps):
            print(f"repetition {r + 1}/{reps}", flush=True)
            order = systems[r % len(systems) :] + systems[: r % len(systems)]
            for system in order:
                if system == "raw":
                    s = client.create_session()
                    try:
                        times, last = run_raw(session_container(s.id)[1])
                    finally:
                        s.delete()
                    runs["raw"].append({"turns": times, "summary": last.strip()})
                elif system == "kernelgw":
                    runs["kernelgw"].append(run_kernelgw(client))
                elif system == "llmsb":
                    runs["llmsb"].append(run_llmsb(lambda: llmsb_session(args.image), stateless=True))
                else:
                    runs["llmsb_i"].append(run_llmsb(lambda: llmsb_interactive(args.image), stateless=False))
    leftovers = remove_llmsb_leftovers()

    summaries = {k: {run["summary"].splitlines()[-1] for run in v} for k, v in runs.items()}
    all_lines = set().union(*summaries.values())
    assert len(all_lines) == 1, summaries

    label = {
        "raw": "raw jupyter_client (floor)",
        "kernelgw": "kernelgw SDK",
        "llmsb": "llm-sandbox run (stateless)",
        "llmsb_i": "llm-sandbox interactive",
    }
    rows = [summary(FLOOR, [sum(x["turns"]) for x in runs["raw"]])]
    e2e = []
    for k in systems[1:]:
        rows.append(summary(f"{label[k]}: 10 turns", [sum(x["turns"]) for x in runs[k]]))
        e2e.append(
            summary(
                f"{label[k]}: end to end (start + 10 turns + close)",
                [x["start"] + sum(x["turns"]) + x["close"] for x in runs[k]],
            )
        )
    rows += e2e
    if not use_llmsb:
        rows.append(failed_row("llm-sandbox", "not installed or skipped"))
    per_turn = {
        label[k]: {TURNS[i][0]: summary(TURNS[i][0], [x["turns"][i] for x in runs[k]]) for i in range(len(TURNS))}
        for k in systems
    }
    phases = {label[k]: {p: summary(p, [x[p] for x in runs[k]]) for p in ("start", "close")} for k in systems[1:]}
    result = {
        "benchmark": "agent",
        "date": now_iso(),
        "machine": machine,
        "args": vars(args) | {"json": str(args.json), "chart": str(args.chart)},
        "llm_sandbox_version": llm_sandbox_version(),
        "floor": FLOOR,
        "turns": [
            {"name": n, "code": c, "needs": needs, "stateless_code": stateless_code(i)}
            for i, (n, c, needs) in enumerate(TURNS)
        ],
        "final_summary": all_lines.pop(),
        "rows": rows,
        "per_turn": per_turn,
        "start_close": phases,
        "reps": reps,
        "llm_sandbox_leftovers_removed": leftovers,
    }
    print_table(f"10-turn data-analysis trace ({result['date']}, {reps} repetitions)", rows, FLOOR)
    print("\nper turn, p50 ms:")
    names = list(per_turn)
    print(f"| {'turn':<13} | " + " | ".join(f"{n[:26]:>26}" for n in names) + " |")
    for t, _, _ in TURNS:
        print(f"| {t:<13} | " + " | ".join(f"{per_turn[n][t]['p50_ms']:>26.1f}" for n in names) + " |")
    print(f"\nfinal summary (identical everywhere): {result['final_summary']}")
    if args.json:
        write_json(args.json, result)
    if args.chart:
        chart(result, args.chart)
    assert not leftover_llmsb_containers()


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_turn = result["per_turn"]
    systems = list(per_turn)
    turns = [t["name"] for t in result["turns"]]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [2.2, 1]})
    width = 0.8 / len(systems)
    colors = ["#888888", "#3572A5", "#d95f02", "#7570b3"]
    for j, s in enumerate(systems):
        a1.bar(
            [i + j * width for i in range(len(turns))],
            [per_turn[s][t]["p50_ms"] for t in turns],
            width,
            label=s,
            color=colors[j % len(colors)],
        )
    a1.set_xticks([i + 0.4 - width / 2 for i in range(len(turns))], turns, rotation=30, fontsize=8)
    a1.set_yscale("log")
    a1.set_ylabel("ms per turn (p50, log scale)")
    a1.legend(fontsize=7, ncol=len(systems), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    # totals: start + turns + close stacked
    names, start, body, close = [], [], [], []
    for s in systems:
        names.append(s.replace(" (", "\n("))
        sc = result["start_close"].get(s)
        start.append(sc["start"]["p50_ms"] if sc else 0)
        close.append(sc["close"]["p50_ms"] if sc else 0)
        body.append(sum(per_turn[s][t]["p50_ms"] for t in turns))
    y = range(len(names))
    a2.barh(y, start, color="#e6ab02", label="start")
    a2.barh(y, body, left=start, color="#3572A5", label="10 turns")
    a2.barh(y, close, left=[a + b for a, b in zip(start, body, strict=True)], color="#999999", label="close")
    for i in y:
        tot = start[i] + body[i] + close[i]
        a2.text(tot, i, f" {tot / 1000:.2f} s", va="center", fontsize=8)
    a2.set_yticks(list(y), names, fontsize=7)
    a2.invert_yaxis()
    a2.set_xlabel("ms end to end (sum of per-turn p50s)")
    a2.set_xlim(0, max(a + b + c for a, b, c in zip(start, body, close, strict=True)) * 1.25)
    a2.legend(fontsize=7, loc="upper right")
    a2.set_title("end to end", fontsize=9)
    fig.suptitle(
        f"10-turn data-analysis trace, {result['date'][:10]}, {result['machine']['cores']} cores "
        f"({result['reps']} repetitions)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
