"""Kill -9 rounds against a real gateway: acknowledged cells lost, cut-off cells
marked, containers leaked (the loop is tests/support/crash_loop.py).

Each round starts ``kernelgw serve`` (own name, own data directory, SQLite),
posts ``1+1`` cells over REST one after another and SIGKILLs the gateway a
random delay after a random request was sent; the next round's gateway
reattaches the session. A last gateway reads the history and stops with
``on_shutdown=stop``. Goals over 100 rounds: lost 0, unmarked 0, leaked 0.

By default all rounds are one chain (one gateway name, one session carried
over). ``--batch N`` splits them into chains of N rounds (each its own gateway
name, data directory and final check), so that ``--max-minutes`` can stop
starting chains after that long; the JSON then says how many rounds ran.

Run:  .venv/bin/python benchmarks/bench_crash.py [--rounds 100] [--seed N]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import DEFAULT_IMAGE, DOCS_BENCH, machine_info, now_iso, other_activity, write_json  # noqa: E402

from tests.support.crash_loop import crash_rounds  # noqa: E402

GOALS = {"lost": 0, "unmarked": 0, "leaked": 0}
GOAL_ROUNDS = 100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=GOAL_ROUNDS)
    parser.add_argument(
        "--batch", type=int, default=None, help="rounds per gateway name and final history check (default: all)"
    )
    parser.add_argument("--max-minutes", type=float, default=25.0, help="start no batch after this long")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, stored")
    parser.add_argument("--quick", action="store_true", help="--rounds 10")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--json", type=Path, default=DOCS_BENCH / "crash.json")
    parser.add_argument("--chart", type=Path, default=None, help="accepted for scripts/bench.sh; no chart is drawn")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 10
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    machine = machine_info(args.image)
    date = now_iso()
    started = time.monotonic()
    batches: list[dict[str, Any]] = []
    done = 0
    stopped_early = None
    while done < args.rounds:
        minutes = (time.monotonic() - started) / 60
        if minutes > args.max_minutes:
            stopped_early = f"stopped after {minutes:.1f} min (--max-minutes {args.max_minutes:g})"
            break
        n = min(args.batch or args.rounds, args.rounds - done)
        t = time.monotonic()
        load = [round(x, 2) for x in os.getloadavg()]
        with tempfile.TemporaryDirectory(prefix="kgw-crash-") as workdir:
            c = crash_rounds(n, Path(workdir), args.image, seed + len(batches))
        batch = {
            "rounds": c.rounds,
            "seed": seed + len(batches),
            "sent": c.sent,
            "acknowledged": c.acknowledged,
            "lost": c.lost,
            "cut_off": c.cut_off,
            "unmarked": c.unmarked,
            "leaked": c.leaked,
            "seconds": round(time.monotonic() - t, 1),
            "loadavg_start": load,
        }
        batches.append(batch)
        done += c.rounds
        print(
            f"batch {len(batches)}: {c.rounds} rounds, {c.sent} sent, {c.acknowledged} acknowledged, "
            f"{len(c.lost)} lost, {c.cut_off} cut off (marked), {len(c.unmarked)} unmarked, {len(c.leaked)} leaked, "
            f"{batch['seconds']:.0f} s, load {load[0]:.2f}",
            flush=True,
        )
    seconds = time.monotonic() - started
    totals = {k: sum(b[k] for b in batches) for k in ("rounds", "sent", "acknowledged", "cut_off")} | {
        k: sum(len(b[k]) for b in batches) for k in ("lost", "unmarked", "leaked")
    }
    met = totals["rounds"] >= GOAL_ROUNDS and all(totals[k] <= v for k, v in GOALS.items())
    result = {
        "benchmark": "crash",
        "date": date,
        "machine": machine,
        "args": vars(args) | {"json": str(args.json), "chart": str(args.chart)},
        "seed": seed,
        "rounds_asked": args.rounds,
        "stopped_early": stopped_early,
        "totals": totals,
        "goals": GOALS,
        "goal_rounds": GOAL_ROUNDS,
        "met": met,
        "seconds": round(seconds, 1),
        "seconds_per_round": round(seconds / max(1, totals["rounds"]), 2),
        "batches": batches,
        "activity_end": other_activity(),
    }
    print(
        f"\nrounds            {totals['rounds']} of {args.rounds} asked"
        + (f" ({stopped_early})" if stopped_early else "")
    )
    print(f"requests sent     {totals['sent']}")
    print(f"acknowledged      {totals['acknowledged']}")
    print(f"lost              {totals['lost']}")
    print(f"cut off (marked)  {totals['cut_off']}")
    print(f"left running      {totals['unmarked']}")
    print(f"containers leaked {totals['leaked']}")
    print(f"goals (0 / 0 / 0 over {GOAL_ROUNDS} rounds): {'MET' if met else 'MISSED'}")
    print(f"load average      {' '.join(f'{x:.2f}' for x in os.getloadavg())}  ({seconds:.0f} s)")
    if args.json:
        write_json(args.json, result)
    return 0 if not (totals["lost"] or totals["unmarked"] or totals["leaked"]) else 1


if __name__ == "__main__":
    sys.exit(main())
