"""What "acknowledged means stored" costs: `1+1` over the WebSocket, interleaved,
on a gateway built from an older source tree (``--before``, e.g. a `git archive`
of the commit before the change) and on this tree, with raw jupyter_client to
this tree's session kernel as the floor.

Both gateways run as ``python -m kernelgw serve`` with the working directory at
their tree (so that tree's package is the one imported), SQLite history in a
throwaway data directory, one session each. Each round takes one sample of each
row in a shuffled order, so load drift hits all alike; the load average is
printed next to the table.

Run:  git archive <commit> | tar -x -C /tmp/kgw_before
      .venv/bin/python benchmarks/bench_ack.py --before /tmp/kgw_before [--rounds 400]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common
from _common import Gateway, RawKernel, WsConn, print_table, session_container, summary


class TreeGateway(Gateway):
    """A `Gateway` whose package comes from ``tree`` (its working directory)."""

    def __init__(self, name: str, tree: Path) -> None:
        super().__init__(name, env={"KERNELGW_ON_SHUTDOWN": "stop"})  # the older tree ignores it
        self.tree = tree

    def start(self, timeout: float = 90) -> Gateway:
        saved, _common.REPO = _common.REPO, self.tree
        try:
            return super().start(timeout)
        finally:
            _common.REPO = saved


async def measure(before: Gateway, after: Gateway, rounds: int, warmup: int) -> dict[str, list[float]]:
    sids = {}
    for label, gw in (("before", before), ("after", after)):
        async with httpx.AsyncClient(base_url=gw.url, timeout=120) as http:
            resp = await http.post("/v1/sessions", json={})
            resp.raise_for_status()
            sids[label] = resp.json()["id"]
    ws_url = {
        label: gw.url.replace("http://", "ws://") + f"/v1/sessions/{sids[label]}/ws"
        for label, gw in (("before", before), ("after", after))
    }
    samples: dict[str, list[float]] = {"raw jupyter_client": [], "WS before": [], "WS after": []}
    async with WsConn(ws_url["before"]) as ws_b, WsConn(ws_url["after"]) as ws_a:
        raw = RawKernel(session_container(sids["after"])[1])
        async with raw:
            rows = {"raw jupyter_client": raw.execute, "WS before": ws_b.execute, "WS after": ws_a.execute}
            for i in range(warmup + rounds):
                order = list(rows)
                random.shuffle(order)
                for name in order:
                    ms, _ = await rows[name]("1+1")
                    if i >= warmup:
                        samples[name].append(ms)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the source tree to compare against")
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    with TreeGateway("ackold", args.before.resolve()) as before, TreeGateway("acknew", _common.REPO) as after:
        samples = asyncio.run(measure(before, after, args.rounds, args.warmup))
    rows = [summary(name, s) for name, s in samples.items()]
    print_table("1+1 over the WebSocket, interleaved (ms)", rows, floor="raw jupyter_client")
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, cores {os.cpu_count()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
