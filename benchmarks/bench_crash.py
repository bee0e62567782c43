"""Kill -9 rounds against a real gateway: acknowledged cells lost, cut-off cells
marked, containers leaked (the loop is tests/support/crash_loop.py).

Each round starts ``kernelgw serve`` (own name, own data directory, SQLite),
posts ``1+1`` cells over REST one after another and SIGKILLs the gateway a
random delay after a random request was sent; the next round's gateway
reattaches the session. A last gateway reads the history and stops with
``on_shutdown=stop``. Goals: lost 0, unmarked 0, leaked 0.

Run:  .venv/bin/python benchmarks/bench_crash.py [--rounds 100] [--seed N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.crash_loop import crash_rounds  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--image", default=os.environ.get("KERNELGW_IMAGE", "kernelgw/python:latest"))
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kgw-crash-") as workdir:
        counts = crash_rounds(args.rounds, Path(workdir), args.image, args.seed)
    print(f"rounds            {counts.rounds}")
    print(f"requests sent     {counts.sent}")
    print(f"acknowledged      {counts.acknowledged}")
    print(f"lost              {len(counts.lost)}  {counts.lost[:5]}")
    print(f"cut off (marked)  {counts.cut_off}")
    print(f"left running      {len(counts.unmarked)}  {counts.unmarked[:5]}")
    print(f"containers leaked {len(counts.leaked)}  {counts.leaked[:5]}")
    print(f"load average      {' '.join(f'{x:.2f}' for x in os.getloadavg())}  ({time.monotonic() - started:.0f} s)")
    return 0 if not (counts.lost or counts.unmarked or counts.leaked) else 1


if __name__ == "__main__":
    sys.exit(main())
