"""Does the gateway's memory come back after large outputs?

One gateway (``kernelgw serve``, no pool, the output cap raised so that all of
each output flows through it), one session, one WebSocket client reading every
event. The gateway's RSS is read from /proc (the whole process) every 20 ms:

* idle: after five ``1+1`` and a second of rest;
* 5 x 50 MB: five cells each printing one 50 MB line, back to back: the peak
  while they run, the RSS right after, and 10 s later (goal: within 50 MB of idle);
* 100 MB to a WebSocket client: one cell printing 100 MB in 1 MB prints, each flushed (unflushed, ipykernel sends them as messages over the 64 MiB frame cap), the
  peak growth over the RSS before it (goal: under 100 MB).

Run:  .venv/bin/python benchmarks/bench_memory.py [--json docs/bench/memory.json --chart docs/bench/memory.png]
A benchmark, not a test: numbers vary with the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_IMAGE, DOCS_BENCH, Gateway, WsConn, machine_info, now_iso, other_activity, write_json

MIB = 1024 * 1024
AFTER_GOAL_MB = 50
PEAK_GOAL_MB = 100


class RssSampler:
    """The gateway's RSS in MB, sampled every 20 ms in a thread, with its peak."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def now(self) -> float:
        return self.gw.rss_kib() / 1024

    def __enter__(self) -> RssSampler:
        self.peak = self.now()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.02)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()


def measure(image: str, cap: int | None) -> dict[str, Any]:
    """``cap``: the output cap (None: the default, 16 MiB, which cuts the 100 MB stream)."""
    env = {"KERNELGW_POOL_SIZE": "0"}
    if cap is not None:
        env["KERNELGW_MAX_OUTPUT_BYTES"] = str(cap)
    with Gateway("memory", image=image, env=env) as gw:
        sid = httpx.post(f"{gw.url}/v1/sessions", json={}, timeout=120).json()["id"]
        try:
            return asyncio.run(stream(gw, sid))
        finally:
            httpx.delete(f"{gw.url}/v1/sessions/{sid}", timeout=60)


async def stream(gw: Gateway, sid: str) -> dict[str, Any]:
    async with WsConn(gw.ws_url(sid)) as ws:
        for _ in range(5):
            await ws.execute("1+1")
        await asyncio.sleep(1)
        rss = RssSampler(gw)
        idle = rss.now()
        with rss:
            for _ in range(5):
                _, events = await ws.execute("print('x' * 50_000_000)")
                assert events[-1]["status"] in ("ok", "error"), events[-1]
        right_after = rss.now()
        await asyncio.sleep(10)
        later = rss.now()
        burst_peak = rss.peak
        before_big = rss.now()
        with rss:
            _, events = await ws.execute("for _ in range(100):\n    print('y' * 1_048_575, flush=True)")
            assert events[-1]["status"] == "ok", events[-1]
        got = sum(len(e.get("text", "")) for e in events if e["type"] == "stream")
        return {
            "idle_mb": round(idle, 1),
            "burst_peak_mb": round(burst_peak, 1),
            "right_after_mb": round(right_after, 1),
            "after_10s_mb": round(later, 1),
            "after_10s_over_idle_mb": round(later - idle, 1),
            "big_before_mb": round(before_big, 1),
            "big_peak_mb": round(rss.peak, 1),
            "big_peak_growth_mb": round(rss.peak - before_big, 1),
            "big_delivered_bytes": got,
        }


def chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["idle", "peak, 5 x 50 MB", "right after", "10 s later", "before 100 MB", "peak, 100 MB"]
    keys = ["idle_mb", "burst_peak_mb", "right_after_mb", "after_10s_mb", "big_before_mb", "big_peak_mb"]
    values = [result[k] for k in keys]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.barh(labels, values, color=["#888888", "#3572A5", "#3572A5", "#3572A5", "#888888", "#3572A5"])
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.0f} MB", va="center", fontsize=8)
    ax.axvline(result["idle_mb"] + AFTER_GOAL_MB, color="#a00", linestyle="--", linewidth=1)
    ax.invert_yaxis()
    ax.set_xlabel("gateway RSS, MB (dashed: idle + 50 MB, the goal 10 s after the outputs)", fontsize=8)
    ax.set_title("The gateway's memory around large outputs", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--quick", action="store_true", help="accepted for scripts/bench.sh; the run is short already")
    parser.add_argument("--json", type=Path, default=DOCS_BENCH / "memory.json")
    parser.add_argument("--chart", type=Path, default=DOCS_BENCH / "memory.png")
    args = parser.parse_args()
    started = now_iso()
    results = {
        "output cap 160 MiB": measure(args.image, 160 * MIB),
        "default output cap (16 MiB)": measure(args.image, None),
    }
    verdicts = {}
    for name, result in results.items():
        after_ok = result["after_10s_over_idle_mb"] <= AFTER_GOAL_MB
        peak_ok = result["big_peak_growth_mb"] < PEAK_GOAL_MB
        verdicts[name] = {"after_ok": after_ok, "peak_ok": peak_ok}
        print(f"\nThe gateway's RSS around large outputs (MB), {name}\n")
        print("| measurement | MB |")
        print("|---|---:|")
        for key, value in result.items():
            if key.endswith("_mb"):
                print(f"| {key.removesuffix('_mb').replace('_', ' ')} | {value} |")
        print(
            f"\n10 s after 5 x 50 MB: +{result['after_10s_over_idle_mb']} MB over idle "
            f"(goal <= {AFTER_GOAL_MB}: {'met' if after_ok else 'MISSED'}); "
            f"100 MB streamed: peak +{result['big_peak_growth_mb']} MB "
            f"(goal < {PEAK_GOAL_MB}: {'met' if peak_ok else 'MISSED'}); "
            f"delivered {result['big_delivered_bytes']:,} bytes"
        )
    write_json(
        args.json,
        {
            "benchmark": "memory",
            "date": started,
            "machine": machine_info(args.image),
            "activity_end": other_activity(),
            "results": results,
            "verdicts": verdicts,
        },
    )
    chart(results["output cap 160 MiB"], args.chart)
    print(f"wrote {args.json}\nwrote {args.chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
