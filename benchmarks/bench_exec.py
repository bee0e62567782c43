"""Execute round trips on a running session: `1+1`, printing 1 MB, a matplotlib PNG.

Per workload, all against the same machine and image, interleaved in rounds:
  - raw jupyter_client straight to the kernelgw session's kernel sockets (the floor)
  - kernelgw over the WebSocket (one connection, execute -> done)
  - kernelgw over blocking REST (POST /execute, httpx.AsyncClient, keep-alive)
  - the kernelgw SDK: sync `Client.run` (REST + parsing into an `Execution`)
  - llm-sandbox `run` (stateless: a new `python file.py` per call through
    `docker exec`; the PNG through its ArtifactSandboxSession plot capture)
  - llm-sandbox interactive `run` (its IPython runner; PNG via savefig + copy out)
Session start is excluded (see bench_start.py). Each timing ends when the caller
holds the whole result (kernelgw: the `done` event / the response; raw: the
execute_reply and the idle status; llm-sandbox: `run` returned).

Run:  .venv/bin/python benchmarks/bench_exec.py [--quick] [--json docs/bench/exec.json --chart docs/bench/exec.png]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    DOCS_BENCH,
    Gateway,
    RawKernel,
    WsConn,
    draw_bars,
    event_output_bytes,
    failed_row,
    leftover_llmsb_containers,
    llm_sandbox_version,
    llmsb_fetch,
    llmsb_interactive,
    llmsb_session,
    machine_info,
    now_iso,
    print_table,
    raw_output_bytes,
    remove_llmsb_leftovers,
    rest_execute,
    session_container,
    summary,
    write_json,
)

from kernelgw import Client

PLOT = (
    "import matplotlib.pyplot as plt\n"
    "fig, ax = plt.subplots(figsize=(6, 4), dpi=100)\n"
    "ax.plot(range(100), [i * i for i in range(100)])\n"
    "ax.set_title('squares')\n"
)
# code per workload and system: kernelgw and the raw floor send the same cell
WORKLOADS: dict[str, dict[str, str]] = {
    "1+1": {
        "kernel": "1+1",
        "llmsb": "print(1+1)",  # a script has no displayhook: print is its 1+1
        "interactive": "1+1",
    },
    "print 1 MB": {
        "kernel": "print('x' * 1_000_000)",
        "llmsb": "print('x' * 1_000_000)",
        "interactive": "print('x' * 1_000_000)",
    },
    "matplotlib PNG": {
        "kernel": PLOT + "plt.show()",
        "llmsb": PLOT + "plt.show()",  # ArtifactSandboxSession captures plt.show()
        "interactive": PLOT + "fig.savefig('/sandbox/plot.png'); plt.close(fig)",
    },
}
FLOOR = "raw jupyter_client (floor)"


def check_events(workload: str, events: list[dict[str, Any]]) -> int:
    done = events[-1]
    assert done["type"] == "done" and done["status"] == "ok", done
    if workload == "1+1":
        assert any(e.get("data", {}).get("text/plain") == "2" for e in events), events
    if workload == "print 1 MB":
        assert event_output_bytes(events) >= 1_000_000, event_output_bytes(events)
    if workload == "matplotlib PNG":
        pngs = [base64.b64decode(e["data"]["image/png"]) for e in events if "image/png" in e.get("data", {})]
        assert pngs and pngs[0][:4] == b"\x89PNG", "no PNG"
        return len(pngs[0])
    return event_output_bytes(events)


async def kgw_round(
    gw_url: str, sid: str, conn_dir: Path, session: Any, code: str, n: int, warmup: int, workload: str
) -> dict[str, tuple[list[float], int]]:
    """All four kernelgw-side transports open at once, alternating per sample (the
    order rotates every sample), so each sees the same machine state."""
    out: dict[str, tuple[list[float], int]] = {}
    async with (
        RawKernel(conn_dir) as raw,
        WsConn(gw_url.replace("http", "ws", 1) + f"/v1/sessions/{sid}/ws") as ws,
        httpx.AsyncClient(base_url=gw_url, timeout=120) as client,
    ):

        async def raw_fn(first: bool) -> tuple[float, int]:
            ms, msgs = await raw.execute(code)
            if first and workload == "matplotlib PNG":
                assert any("image/png" in m["content"].get("data", {}) for m in msgs), "raw: no PNG"
            return ms, raw_output_bytes(msgs) if first else 0

        async def ws_fn(first: bool) -> tuple[float, int]:
            ms, events = await ws.execute(code)
            return ms, check_events(workload, events) if first else 0

        async def rest_fn(first: bool) -> tuple[float, int]:
            ms, body = await rest_execute(client, sid, code)
            return ms, check_events(workload, body["events"]) if first else 0

        async def sdk_fn(first: bool) -> tuple[float, int]:
            t0 = time.perf_counter()
            run = session.run(code)  # the sync SDK, blocking this loop like a sync caller would
            ms = (time.perf_counter() - t0) * 1000
            size = 0
            if first:
                assert run.ok, run
                if workload == "1+1":
                    assert run.text == "2", run.text
                elif workload == "print 1 MB":
                    assert len(run.stdout) >= 1_000_000
                else:
                    assert run.images and run.images[0][:4] == b"\x89PNG"
                size = len(run.images[0]) if run.images else len(run.stdout) + len(run.text or "")
            return ms, size

        fns = [
            (FLOOR, raw_fn),
            ("kernelgw WebSocket", ws_fn),
            ("kernelgw REST", rest_fn),
            ("kernelgw SDK Client.run", sdk_fn),
        ]
        samples: dict[str, list[float]] = {name: [] for name, _ in fns}
        sizes: dict[str, int] = {}
        for i in range(n + warmup):
            k = i % len(fns)
            for name, fn in fns[k:] + fns[:k]:
                ms, size = await fn(i == 0)
                if i == 0:
                    sizes[name] = size
                if i >= warmup:
                    samples[name].append(ms)
        for name, _ in fns:
            out[name] = (samples[name], sizes[name])
    return out


def llmsb_round(fn: Callable[[], int], n: int, warmup: int) -> tuple[list[float], int]:
    out, size = [], 0
    for i in range(n + warmup):
        t0 = time.perf_counter()
        got = fn()
        ms = (time.perf_counter() - t0) * 1000
        size = got
        if i >= warmup:
            out.append(ms)
    return out, size


def llmsb_call(session: Any, workload: str, code: str, artifacts: bool = False) -> Callable[[], int]:
    def call() -> int:
        if artifacts:
            res = session.run(code, clear_plots=True)
            assert res.exit_code == 0 and len(res.plots) == 1, (res.stderr, len(res.plots))
            data = base64.b64decode(res.plots[0].content_base64)
            assert data[:4] == b"\x89PNG"
            return len(data)
        res = session.run(code)
        assert res.exit_code == 0, res.stderr
        if workload == "1+1":
            assert res.stdout.strip().endswith("2"), res.stdout
        if workload == "print 1 MB":
            assert len(res.stdout) >= 1_000_000
        if workload == "matplotlib PNG":  # interactive: the figure was saved in the container
            data = llmsb_fetch(session, "/sandbox/plot.png")
            assert data[:4] == b"\x89PNG"
            return len(data)
        return len(res.stdout)

    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small n (a smoke run)")
    ap.add_argument("--n", type=int, help="kernelgw/raw samples for 1+1 (default 300, quick 50)")
    ap.add_argument("--n-big", type=int, help="kernelgw/raw samples for 1 MB and PNG (default 60, quick 15)")
    ap.add_argument("--n-llmsb", type=int, help="llm-sandbox samples per workload (default 25, quick 5)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 5, quick 2)")
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--skip-llm-sandbox", action="store_true")
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "exec.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "exec.png")
    args = ap.parse_args()
    q = args.quick
    rounds = args.rounds or (2 if q else 5)
    n_of = {
        "1+1": args.n or (50 if q else 300),
        "print 1 MB": args.n_big or (15 if q else 60),
        "matplotlib PNG": args.n_big or (15 if q else 60),
    }
    n_lsb = args.n_llmsb or (5 if q else 25)
    use_llmsb = not args.skip_llm_sandbox and llm_sandbox_version() is not None
    machine = machine_info(args.image)

    names = [FLOOR, "kernelgw WebSocket", "kernelgw REST", "kernelgw SDK Client.run"]
    if use_llmsb:
        names += ["llm-sandbox run (stateless)", "llm-sandbox interactive run"]
    samples = {w: {k: [] for k in names} for w in WORKLOADS}
    sizes: dict[str, dict[str, int]] = {w: {} for w in WORKLOADS}

    lsb = lsb_art = lsbi = None
    with Gateway("exec", image=args.image) as gw, Client(gw.url) as sdk:
        session = sdk.create_session()
        sid = session.id
        _, conn_dir = session_container(sid)
        try:
            if use_llmsb:
                lsb = llmsb_session(args.image)
                lsb.open()
                lsb_art = llmsb_session(args.image, artifacts=True)
                lsb_art.open()
                lsbi = llmsb_interactive(args.image)
                lsbi.open()
            for r in range(rounds):
                print(f"round {r + 1}/{rounds}", flush=True)
                for w, codes in WORKLOADS.items():
                    n = max(1, n_of[w] // rounds)
                    warm = 3 if r == 0 else 1
                    got = asyncio.run(kgw_round(gw.url, sid, conn_dir, session, codes["kernel"], n, warm, w))
                    for name, (ms_list, size) in got.items():
                        samples[w][name] += ms_list
                        sizes[w][name] = size
                    if use_llmsb:
                        nl = max(1, n_lsb // rounds)
                        lw = 1 if r == 0 else 0
                        art = w == "matplotlib PNG"
                        got, size = llmsb_round(llmsb_call(lsb_art if art else lsb, w, codes["llmsb"], art), nl, lw)
                        samples[w]["llm-sandbox run (stateless)"] += got
                        sizes[w]["llm-sandbox run (stateless)"] = size
                        got, size = llmsb_round(llmsb_call(lsbi, w, codes["interactive"]), nl, lw)
                        samples[w]["llm-sandbox interactive run"] += got
                        sizes[w]["llm-sandbox interactive run"] = size
        finally:
            for s in (lsb, lsb_art, lsbi):
                if s is not None:
                    s.close()
            session.delete(missing_ok=True)
    leftovers = remove_llmsb_leftovers()

    tables = {}
    for w in WORKLOADS:
        rows = [summary(name, samples[w][name], output_bytes=sizes[w].get(name)) for name in names]
        if not use_llmsb:
            rows.append(failed_row("llm-sandbox", "not installed or skipped"))
        tables[w] = rows
    result = {
        "benchmark": "exec",
        "date": now_iso(),
        "machine": machine,
        "args": vars(args) | {"json": str(args.json), "chart": str(args.chart)},
        "llm_sandbox_version": llm_sandbox_version(),
        "floor": FLOOR,
        "code": WORKLOADS,
        "tables": tables,
        "llm_sandbox_leftovers_removed": leftovers,
    }
    for w, rows in tables.items():
        print_table(f"Execute round trip: {w}", rows, FLOOR)
    if args.json:
        write_json(args.json, result)
    if args.chart:
        draw_bars(
            [
                (
                    w
                    + (f" (output: ~{size:,} bytes)" if (size := tables[w][1].get("output_bytes") or 0) > 100 else ""),
                    rows,
                )
                for w, rows in tables.items()
            ],
            args.chart,
            title=f"Execute round trip, {result['date'][:10]}, {machine['cores']} cores",
            floor_names=[FLOOR],
        )
    assert not leftover_llmsb_containers()


if __name__ == "__main__":
    main()
