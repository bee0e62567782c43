"""Kill -9 rounds against a real gateway: acknowledged cells lost, cut-off cells
marked, containers leaked (the loop is tests/support/crash_loop.py).

Each round starts ``kernelgw serve`` (own name, own data directory, SQLite),
posts cells over REST one after another and SIGKILLs the gateway a random
delay after a random request was sent; the next round's gateway reattaches the
session. A last gateway reads the history and stops with ``on_shutdown=stop``.
Goals over 100 rounds: lost 0, unmarked 0, leaked 0. "journal" counts the
answered cells a restart wrote in from the answer journal
(kernelgw.storage.journal): answered, killed before their commit.

The loop posts ``1+1`` and kills 0-20 ms after a request was sent. A cell's
``running`` row lingers up to 20 ms in the writer (kernelgw.storage.writer
LINGER_S) and is skipped when the cell ends first, so such a kill almost never
finds a committed ``running`` row: "unmarked" is barely tested. A second
variant (``--cells``) posts a cell that sleeps 0.3 s and kills ``--shift``
(0.1 s) to 20 ms later after a send, so the kill lands 100-120 ms into a
running cell whose row is stored: the cut-off cells the next gateway must mark
(crash_rounds' ``code`` and ``kill_after_send_s``).

By default all rounds of a variant are one chain (one gateway name, one session
carried over). ``--batch N`` splits them into chains of N rounds (each its own
gateway name, data directory and final check), so that ``--max-minutes`` can
stop starting chains after that long; the JSON then says how many rounds ran.

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

from tests.support import crash_loop  # noqa: E402

GOALS = {"lost": 0, "unmarked": 0, "leaked": 0}
GOAL_ROUNDS = 100
LOOP_CELL = "1+1"
SLOW_CELL = "import time; time.sleep(0.3); 1+1"


def totals(batches: list[dict[str, Any]]) -> dict[str, int]:
    out = {k: sum(b.get(k, 0) for b in batches) for k in ("rounds", "sent", "acknowledged", "cut_off", "from_journal")}
    return out | {k: sum(len(b[k]) for b in batches) for k in ("lost", "unmarked", "leaked")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=GOAL_ROUNDS, help="rounds per cell variant")
    parser.add_argument(
        "--cells",
        nargs="+",
        default=[LOOP_CELL, SLOW_CELL],
        help=f"the cell of each variant (default: the loop's {LOOP_CELL!r}, then {SLOW_CELL!r})",
    )
    parser.add_argument(
        "--shift",
        type=float,
        default=0.1,
        help="earliest kill after a request's send, for the slow cell (the kill lands up to 20 ms later)",
    )
    parser.add_argument(
        "--batch", type=int, default=None, help="rounds per gateway name and final history check (default: all)"
    )
    parser.add_argument("--max-minutes", type=float, default=25.0, help="start no chain after this long")
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
    variants: list[dict[str, Any]] = []
    stopped_early = None
    for code in args.cells:
        kill_after = (0.0, 0.02) if code == LOOP_CELL else (args.shift, args.shift + 0.02)
        batches: list[dict[str, Any]] = []
        done = 0
        while done < args.rounds and stopped_early is None:
            minutes = (time.monotonic() - started) / 60
            if minutes > args.max_minutes:
                stopped_early = f"stopped after {minutes:.1f} min (--max-minutes {args.max_minutes:g})"
                break
            n = min(args.batch or args.rounds, args.rounds - done)
            chain_seed = seed + 1000 * len(variants) + len(batches)
            t = time.monotonic()
            load = [round(x, 2) for x in os.getloadavg()]
            with tempfile.TemporaryDirectory(prefix="kgw-crash-") as workdir:
                c = crash_loop.crash_rounds(
                    n, Path(workdir), args.image, chain_seed, code=code, kill_after_send_s=kill_after
                )
            batches.append(
                {
                    "rounds": c.rounds,
                    "seed": chain_seed,
                    "sent": c.sent,
                    "acknowledged": c.acknowledged,
                    "lost": c.lost,
                    "cut_off": c.cut_off,
                    "from_journal": c.from_journal,
                    "unmarked": c.unmarked,
                    "leaked": c.leaked,
                    "seconds": round(time.monotonic() - t, 1),
                    "loadavg_start": load,
                }
            )
            done += c.rounds
            print(
                f"{code!r} chain {len(batches)}: {c.rounds} rounds, {c.sent} sent, {c.acknowledged} acknowledged, "
                f"{len(c.lost)} lost ({c.from_journal} written from the answer journal), "
                f"{c.cut_off} cut off (marked), {len(c.unmarked)} unmarked, "
                f"{len(c.leaked)} leaked, {time.monotonic() - t:.0f} s, load {load[0]:.2f}",
                flush=True,
            )
        variants.append(
            {
                "cell": code,
                "kill_after_send_s": list(kill_after),
                "totals": totals(batches),
                "batches": batches,
            }
        )
    seconds = time.monotonic() - started
    all_batches = [b for v in variants for b in v["batches"]]
    total = totals(all_batches)
    loop_rounds = sum(v["totals"]["rounds"] for v in variants if v["cell"] == LOOP_CELL)
    met = loop_rounds >= GOAL_ROUNDS and all(total[k] <= v for k, v in GOALS.items())
    result = {
        "benchmark": "crash",
        "date": date,
        "machine": machine,
        "args": vars(args) | {"json": str(args.json), "chart": str(args.chart)},
        "seed": seed,
        "rounds_asked": args.rounds * len(args.cells),
        "stopped_early": stopped_early,
        "loop_cell": LOOP_CELL,
        "totals": total,
        "variants": [{k: v[k] for k in ("cell", "kill_after_send_s", "totals")} for v in variants],
        "goals": GOALS,
        "goal_rounds": GOAL_ROUNDS,
        "met": met,
        "seconds": round(seconds, 1),
        "seconds_per_round": round(seconds / max(1, total["rounds"]), 2),
        "batches": [{"cell": v["cell"], **b} for v in variants for b in v["batches"]],
        "activity_end": other_activity(),
    }
    print()
    print(
        f"{'cell':<40} {'rounds':>6} {'sent':>5} {'acked':>5} {'lost':>4} {'journal':>7} {'cut off':>7} "
        f"{'unmarked':>8} {'leaked':>6}"
    )
    for v in [*variants, {"cell": "all", "totals": total}]:
        t = v["totals"]
        print(
            f"{v['cell']:<40} {t['rounds']:>6} {t['sent']:>5} {t['acknowledged']:>5} {t['lost']:>4} "
            f"{t['from_journal']:>7} {t['cut_off']:>7} {t['unmarked']:>8} {t['leaked']:>6}"
        )
    if stopped_early:
        print(f"{total['rounds']} of {result['rounds_asked']} rounds: {stopped_early}")
    print(
        f"goals (0 lost / 0 unmarked / 0 leaked, {GOAL_ROUNDS} rounds of {LOOP_CELL!r}): {'MET' if met else 'MISSED'}"
    )
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}  ({seconds:.0f} s)")
    if args.json:
        write_json(args.json, result)
    return 0 if not (total["lost"] or total["unmarked"] or total["leaked"]) else 1


if __name__ == "__main__":
    sys.exit(main())
