"""kernelgw and the systems users would pick instead, side by side on this machine, in one run.

Peers (benchmarks/peers/adapters.py, one class each, the same interface):
  - kernelgw: a gateway this script starts with its defaults (warm pool of 2), /v1
  - stock Jupyter Kernel Gateway (PyPI jupyter_kernel_gateway) in one container: the floor
    for a Jupyter-based service, no sandbox beyond the container
  - AutoGen's DockerJupyterCodeExecutor on its DockerJupyterServer (autogen-ext)
  - smolagents' DockerExecutor (what CodeAgent(executor_type="docker") makes)
  - llm-sandbox, stateless (ArtifactSandboxSession) and interactive (IPython runner)
All run our kernel image: the three Kernel-Gateway-based peers from an image built
offline on top of it (benchmarks/peers/images.py), llm-sandbox on it directly.

Measured, peers interleaved in rounds (each round in a rotated order) so load drift
hits all alike:
  1. start to first `1+1`: open a session as the peer's users do, run `1+1`, close (n 5)
  2. warm `1+1` on an open session (n 30)
  3. a 10-turn data-analysis trace in one session (benchmarks/peers/trace.py), turn by
     turn across peers, every turn's output checked; a turn a peer cannot do is failed
     with the reason
  4. the limits each peer's container runs under (docker inspect, while it runs)

Needs the peers' packages: run it with the venv of scripts/ensure-peers.sh:
  PY=$(bash scripts/ensure-peers.sh) && $PY benchmarks/bench_peers.py [--quick]
A benchmark, not a test: numbers vary with the machine's load (printed with them).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    DOCS_BENCH,
    Gateway,
    container_memory,
    draw_bars,
    failed_row,
    machine_info,
    now_iso,
    other_activity,
    print_table,
    remove_llmsb_leftovers,
    summary,
    write_json,
)
from peers.base import Output, Peer, one_plus_one_ok
from peers.limits import COLUMNS, inspect_limits
from peers.trace import TURNS

PEER_LABEL = "kernelgw.bench.peer"
REFERENCE = "kernelgw"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def remove_peer_leftovers() -> int:
    """Containers this benchmark's peers made (by label, or by the name it gave them)."""
    import docker

    client = docker.from_env()
    n = 0
    try:
        found = {c.id: c for c in client.containers.list(all=True, filters={"label": PEER_LABEL})}
        found |= {c.id: c for c in client.containers.list(all=True, filters={"name": "kgwb-peer-"})}
        for c in found.values():
            with contextlib.suppress(Exception):
                c.remove(force=True)
                n += 1
    finally:
        client.close()
    return n + remove_llmsb_leftovers()


def short(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def rotated(items: list[Any], k: int) -> list[Any]:
    k %= max(1, len(items))
    return items[k:] + items[:k]


def memory_mib(peer: Peer) -> float | None:
    """The working set of the peer's container(s) (what `docker stats` shows), in MiB."""
    try:
        return round(sum(container_memory(c)["working_set"] for c in peer.container_ids()) / 2**20, 1)
    except Exception as exc:
        print(f"  {peer.name}: memory not read: {short(exc)}", flush=True)
        return None


# ---------------------------------------------------------------- phase 1: start


def measure_starts(
    makers: dict[str, Callable[[], Peer]], n: int, limits: dict[str, list[dict[str, str]]]
) -> dict[str, dict[str, Any]]:
    """Per peer: start ms, start + first 1+1 ms, close ms, failures (with their reasons)."""
    res: dict[str, dict[str, Any]] = {
        name: {"start": [], "first": [], "stop": [], "failures": [], "wrong": 0} for name in makers
    }
    names = list(makers)
    for i in range(n):
        for name in rotated(names, i):
            peer = makers[name]()
            r = res[name]
            try:
                t0 = time.perf_counter()
                peer.start()
                t1 = time.perf_counter()
                out = peer.run(peer.one_plus_one)
                t2 = time.perf_counter()
                if not one_plus_one_ok(out):
                    r["wrong"] += 1
                    r["failures"].append(f"1+1 gave {out}")
                else:
                    r["start"].append((t1 - t0) * 1000)
                    r["first"].append((t2 - t0) * 1000)
                if name not in limits:
                    try:
                        limits[name] = inspect_limits(peer.container_ids())
                    except Exception as exc:  # not the peer's failure: say so, do not count it
                        print(f"  {name}: could not read its limits: {short(exc)}", flush=True)
            except Exception as exc:
                r["failures"].append(short(exc))
                print(f"  {name}: start failed: {short(exc)}", flush=True)
            finally:
                t3 = time.perf_counter()
                try:
                    peer.stop()
                    r["stop"].append((time.perf_counter() - t3) * 1000)
                except Exception as exc:
                    r["failures"].append("stop: " + short(exc))
                r.setdefault("start_retries", 0)
                r["start_retries"] += getattr(peer, "start_failures", 0)
                close = getattr(peer, "close", None)
                if close:
                    close()
        print(f"  start round {i + 1}/{n} done (load {load()[0]})", flush=True)
    return res


# ------------------------------------------------------- phase 2 and 3: open sessions


def measure_warm(peers: dict[str, Peer], n: int, warmup: int = 3) -> dict[str, dict[str, Any]]:
    res: dict[str, dict[str, Any]] = {name: {"ms": [], "wrong": 0} for name in peers}
    for peer in peers.values():
        for _ in range(warmup):
            peer.run(peer.one_plus_one)
    names = list(peers)
    for i in range(n):
        for name in rotated(names, i):
            peer = peers[name]
            t0 = time.perf_counter()
            out = peer.run(peer.one_plus_one)
            ms = (time.perf_counter() - t0) * 1000
            if one_plus_one_ok(out):
                res[name]["ms"].append(ms)
            else:
                res[name]["wrong"] += 1
    return res


def run_trace(peers: dict[str, Peer]) -> dict[str, list[dict[str, Any]]]:
    """Turn by turn across peers (so a load spike hits one turn of every peer, not one peer)."""
    res: dict[str, list[dict[str, Any]]] = {name: [] for name in peers}
    for i, turn in enumerate(TURNS):
        for name in rotated(list(peers), i):
            t0 = time.perf_counter()
            try:
                out: Output | None = peers[name].run(turn.code)
                why = turn.check(out) if out is not None else "no output"
            except Exception as exc:
                out, why = None, f"the run raised {short(exc)}"
            ms = (time.perf_counter() - t0) * 1000
            res[name].append(
                {
                    "turn": i + 1,
                    "title": turn.title,
                    "ms": round(ms, 2),
                    "ok": why is None,
                    "reason": why,
                    "stdout_chars": len(out.stdout) if out else None,
                    "images": [len(b) for b in out.images] if out else [],
                    "error": out.error if out else None,
                }
            )
    return res


# ------------------------------------------------------------------------ main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small n (a smoke run)")
    ap.add_argument("--n-start", type=int, help="starts per peer (default 5, quick 2)")
    ap.add_argument("--n-warm", type=int, help="warm 1+1 per peer (default 30, quick 5)")
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--skip", action="append", default=[], help="leave out a peer (by name; repeatable)")
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "peers.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "peers.png")
    args = ap.parse_args()
    n_start = args.n_start or (2 if args.quick else 5)
    n_warm = args.n_warm or (5 if args.quick else 30)

    from peers.adapters import (
        AutoGenPeer,
        KernelgwPeer,
        LlmSandboxPeer,
        SmolagentsPeer,
        StockKernelGateway,
        StockKernelGatewayPeer,
    )
    from peers.images import ensure_kernel_gateway_image

    started = now_iso()
    machine = machine_info(args.image)
    print(f"load average at the start: {machine['activity_start']}", flush=True)
    print(f"removed {remove_peer_leftovers()} leftover peer containers of an earlier run", flush=True)
    t_build = time.perf_counter()
    kg_image, kg_version = ensure_kernel_gateway_image(args.image)
    build_s = time.perf_counter() - t_build
    print(f"peer image {kg_image} (jupyter_kernel_gateway {kg_version}) ready in {build_s:.1f} s", flush=True)

    gw = Gateway("peers", image=args.image)
    stock = StockKernelGateway(kg_image)
    limits: dict[str, list[dict[str, str]]] = {}
    data: dict[str, Any] = {
        "benchmark": "peers",
        "date": started,
        "machine": machine,
        "args": vars(args) | {"n_start": n_start, "n_warm": n_warm},
        "peer_image": kg_image,
        "kernel_gateway_version": kg_version,
        "image_ready_s": round(build_s, 1),
    }
    try:
        gw.start()
        stock.start()
        makers: dict[str, Callable[[], Peer]] = {
            "kernelgw": lambda: KernelgwPeer(gw.url),
            "stock Kernel Gateway": lambda: StockKernelGatewayPeer(stock, kg_version),
            "AutoGen DockerJupyterCodeExecutor": lambda: AutoGenPeer(kg_image),
            "smolagents DockerExecutor": lambda: SmolagentsPeer(kg_image),
            "llm-sandbox": lambda: LlmSandboxPeer(args.image, interactive=False),
            "llm-sandbox interactive": lambda: LlmSandboxPeer(args.image, interactive=True),
        }
        makers = {k: v for k, v in makers.items() if k not in args.skip}
        probes = {name: make() for name, make in makers.items()}
        data["peers"] = {
            name: {"setup": p.setup, "version": p.version(), "stateful": p.stateful, "one_plus_one": p.one_plus_one}
            for name, p in probes.items()
        }
        for p in probes.values():
            if close := getattr(p, "close", None):
                close()
        time.sleep(2)  # the gateway's pool fills

        print(f"\n== start to first 1+1 (n {n_start} per peer, in rounds)", flush=True)
        starts = measure_starts(makers, n_start, limits)

        print(f"\n== warm 1+1 (n {n_warm} per peer, in rounds) and the {len(TURNS)}-turn trace", flush=True)
        open_peers: dict[str, Peer] = {}
        open_failures: dict[str, str] = {}
        try:
            for name, make in makers.items():
                peer = make()
                try:
                    peer.start()
                    open_peers[name] = peer
                except Exception as exc:
                    open_failures[name] = short(exc)
                    with contextlib.suppress(Exception):
                        peer.stop()
            for name, peer in open_peers.items():
                limits.setdefault(name, inspect_limits(peer.container_ids()))
            warm = measure_warm(open_peers, n_warm)
            trace = run_trace(open_peers)
            memory = {name: memory_mib(peer) for name, peer in open_peers.items()}
        finally:
            for peer in open_peers.values():
                with contextlib.suppress(Exception):
                    peer.stop()
                if close := getattr(peer, "close", None):
                    close()
    except Exception:
        traceback.print_exc()
        raise
    finally:
        stock.stop()
        gw.stop()
        left = remove_peer_leftovers()
        if left:
            print(f"removed {left} peer containers left after the run", flush=True)
    data["load_end"] = load()

    # ---------------------------------------------------------------- results
    start_rows, first_rows, warm_rows = [], [], []
    for name in makers:
        s = starts[name]
        extra = {
            "failures": s["failures"],
            "start_retries": s.get("start_retries", 0),
            "samples": [round(x, 1) for x in s["first"]],
        }
        if s["first"]:
            start_rows.append(
                summary(
                    f"{name}: start", s["start"], peer=name, **(extra | {"samples": [round(x, 1) for x in s["start"]]})
                )
            )
            first_rows.append(
                summary(name, s["first"], peer=name, close_p50_ms=summary("", s["stop"]).get("p50_ms"), **extra)
            )
        else:
            why = "; ".join(s["failures"][:2]) or "no sample"
            start_rows.append(failed_row(f"{name}: start", why, peer=name))
            first_rows.append(failed_row(name, why, peer=name))
        if name in open_failures:
            warm_rows.append(failed_row(name, open_failures[name], peer=name))
        else:
            w = warm[name]
            warm_rows.append(
                summary(name, w["ms"], peer=name, wrong=w["wrong"], samples=[round(x, 2) for x in w["ms"]])
            )
    data.update(start=start_rows, first=first_rows, warm=warm_rows, trace=trace, limits=limits, memory_mib=memory)
    data["trace_turns"] = [{"turn": i + 1, "title": t.title, "code": t.code} for i, t in enumerate(TURNS)]
    data["open_failures"] = open_failures

    print(f"\nload average: start {machine['activity_start'].get('loadavg')}, end {data['load_end']}")
    print_table("Start to first 1+1 (a new session each)", first_rows, REFERENCE, floor_label="kernelgw")
    print_table("Warm 1+1 on an open session", warm_rows, REFERENCE, floor_label="kernelgw")
    print("\nThe 10-turn trace (ok / failed: reason)\n")
    for name, turns in trace.items():
        passed = sum(t["ok"] for t in turns)
        total = sum(t["ms"] for t in turns)
        mem = memory.get(name)
        print(
            f"- {name}: {passed}/{len(turns)} turns right, {total:,.0f} ms in all; its container(s) then "
            + (f"{mem:,.0f} MiB (working set)" if mem is not None else "not measured")
        )
        for t in turns:
            if not t["ok"]:
                print(f"    turn {t['turn']} {t['title']}: {t['reason']}")
    print("\nLimits each peer's container ran under\n")
    print("| peer | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for name, rows in limits.items():
        for row in rows:
            print(f"| {name} | " + " | ".join(row[c] for c in COLUMNS) + " |")

    trace_rows = []
    for name, turns in trace.items():
        passed = sum(t["ok"] for t in turns)
        trace_rows.append(summary(f"{name} ({passed}/{len(turns)} right)", [sum(t["ms"] for t in turns)]))
    draw_bars(
        [
            ("start to first 1+1 (a new session)", first_rows),
            ("warm 1+1 (an open session)", warm_rows),
            (f"the {len(TURNS)}-turn trace, all turns (one run each)", trace_rows),
        ],
        args.chart,
        title=f"kernelgw and its peers, one run ({started[:16]} UTC, load {data['load_end'][0]})",
        floor_names=[REFERENCE],
    )
    data["activity_end"] = other_activity()
    write_json(args.json, data)


if __name__ == "__main__":
    main()
