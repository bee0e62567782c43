"""Every core: aggregate executions per second of one gateway run as 1 and as N
worker processes (`kernelgw serve --workers N`) on this machine.

For each configuration, a fresh ``kernelgw serve --workers N`` (SQLite, no warm
pool, ``on_shutdown=stop``); ``--sessions`` sessions, each driven by its own
client as fast as it answers: half over REST (``POST .../execute`` on the
client's keep-alive connection, which also created the session: the session
lives on the worker that connection landed on), half over the /v1 WebSocket
(a connection of its own, landing on any worker: the sibling relays it).
Two phases per configuration: ``1+1``, then a CPU-light cell that prints
(``sum(i * i for i in range(3000))`` and a 200-byte line), ``--seconds`` each
in all, over ``--rounds`` fresh gateways per configuration started in ABBA
order (load drift on a shared machine hits both configurations alike).
Counted: executions completed per second (all clients together), each
client's round trips, the REST answers that were forwarded
(``x-kernelgw-via``), and the CPU time the gateway's processes, the kernels'
containers and this client spent.

Everything shares the machine's cores (gateway processes, kernels, this
client), so a second worker buys what the cores have left: the table says
where the CPU went.

Run:  .venv/bin/python benchmarks/bench_workers.py [--seconds 10] [--workers 1,2] [--json docs/bench/workers.json]
A benchmark, not a test: numbers vary with the machine's load (printed with them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    Gateway,
    WsConn,
    machine_info,
    now_iso,
    other_activity,
    pct,
    write_json,
)

CELLS = {
    "1+1": "1+1",
    "light cell": "s = sum(i * i for i in range(3000)); print('x' * 200); s",
}


@dataclass
class Phase:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"REST": [], "WebSocket": []})
    forwarded: int = 0
    rest_answers: int = 0
    errors: int = 0


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from the state on (the name may hold spaces)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (the supervisor and its workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = {pid}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None and int(fields[1]) == pid:
            pids.add(int(entry))
    total = 0
    for p in pids:
        if (fields := _stat(p)) is not None:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def kernels_cpu_s(names: list[str]) -> float:
    """CPU seconds of the containers of these gateway names (cgroup v1 or v2)."""
    import docker

    total_ns = 0
    dc = docker.from_env()
    try:
        for name in names:
            for c in dc.containers.list(filters={"label": f"kernelgw.gateway={name}"}):
                for path in (
                    f"/sys/fs/cgroup/cpu,cpuacct/docker/{c.id}/cpuacct.usage",
                    f"/sys/fs/cgroup/cpuacct/docker/{c.id}/cpuacct.usage",
                ):
                    with contextlib.suppress(OSError, ValueError):
                        total_ns += int(Path(path).read_text())
                        break
                else:
                    with contextlib.suppress(OSError, ValueError, IndexError):
                        stat = Path(f"/sys/fs/cgroup/system.slice/docker-{c.id}.scope/cpu.stat").read_text()
                        total_ns += int(stat.split()[1]) * 1000
    finally:
        dc.close()
    return total_ns / 1e9


async def drive(seconds: float, code: str, phase: Phase, clients: list[Any]) -> None:
    """Every client runs ``code`` on its session back to back for ``seconds``."""
    stop = time.monotonic() + seconds

    async def rest(client: httpx.AsyncClient, sid: str) -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            r = await client.post(f"/v1/sessions/{sid}/execute", json={"code": code})
            ms = (time.perf_counter() - t0) * 1000
            if r.status_code != 200 or r.json()["status"] != "ok":
                phase.errors += 1
                continue
            phase.latencies["REST"].append(ms)
            phase.rest_answers += 1
            phase.forwarded += "x-kernelgw-via" in r.headers

    async def ws(conn: WsConn) -> None:
        while time.monotonic() < stop:
            ms, events = await conn.execute(code)
            if events[-1].get("status") != "ok":
                phase.errors += 1
                continue
            phase.latencies["WebSocket"].append(ms)

    tasks = []
    for kind, handle, sid in clients:
        tasks.append(rest(handle, sid) if kind == "REST" else ws(handle))
    await asyncio.gather(*tasks)


async def measure(gw: Gateway, n_sessions: int, seconds: float, names: list[str]) -> dict[str, Any]:
    base = gw.url
    http_clients = [httpx.AsyncClient(base_url=base, timeout=120) for _ in range(n_sessions)]
    ws_conns: list[WsConn] = []
    owners: list[str] = []
    sids: list[str] = []
    results: dict[str, Any] = {}
    try:
        created = await asyncio.gather(*(c.post("/v1/sessions", json={}) for c in http_clients))
        for r in created:
            r.raise_for_status()
            sids.append(r.json()["id"])
            owners.append(r.headers.get("x-kernelgw-gateway", names[0]))
        clients: list[Any] = []
        for i, (client, sid) in enumerate(zip(http_clients, sids, strict=True)):
            if i % 2 == 0:
                clients.append(("REST", client, sid))
            else:
                conn = await WsConn(gw.ws_url(sid)).__aenter__()
                ws_conns.append(conn)
                clients.append(("WebSocket", conn, sid))
        await drive(1.0, "1+1", Phase(), clients)  # warm every path
        for label, code in CELLS.items():
            phase = Phase()
            load_before = os.getloadavg()[0]
            cpu_gw, cpu_k, cpu_me = tree_cpu_s(gw.pid), kernels_cpu_s(names), time.process_time()
            t0 = time.monotonic()
            await drive(seconds, code, phase, clients)
            wall = time.monotonic() - t0
            cpu_gw = tree_cpu_s(gw.pid) - cpu_gw
            cpu_k = kernels_cpu_s(names) - cpu_k
            cpu_me = time.process_time() - cpu_me
            results[label] = {
                "rest_ms": phase.latencies["REST"],
                "ws_ms": phase.latencies["WebSocket"],
                "rest_forwarded": phase.forwarded,
                "rest_answers": phase.rest_answers,
                "errors": phase.errors,
                "wall_s": wall,
                "cpu_gateway_s": cpu_gw,
                "cpu_kernels_s": cpu_k,
                "cpu_client_s": cpu_me,
                "load_1min_before": load_before,
                "load_1min_after": os.getloadavg()[0],
            }
        results["sessions_per_worker"] = {n: owners.count(n) for n in names}
    finally:
        for conn in ws_conns:
            with contextlib.suppress(Exception):
                await conn.__aexit__(None, None, None)
        for client, sid in zip(http_clients, sids, strict=False):
            with contextlib.suppress(Exception):
                await client.delete(f"/v1/sessions/{sid}")
        for client in http_clients:
            await client.aclose()
    return results


def combine(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from a configuration's rounds: counts and CPU summed, latencies pooled."""
    rest = [ms for p in parts for ms in p["rest_ms"]]
    ws = [ms for p in parts for ms in p["ws_ms"]]
    both = rest + ws
    total = {k: sum(p[k] for p in parts) for k in ("rest_forwarded", "rest_answers", "errors", "wall_s")}
    cpu = {k: sum(p[k] for p in parts) for k in ("cpu_gateway_s", "cpu_kernels_s", "cpu_client_s")}
    wall, done = total["wall_s"], max(len(both), 1)
    return {
        "executions": len(both),
        "per_s": len(both) / wall,
        "rest_per_s": len(rest) / wall,
        "ws_per_s": len(ws) / wall,
        "p50_ms": pct(both, 50),
        "p95_ms": pct(both, 95),
        "rest_p50_ms": pct(rest, 50),
        "ws_p50_ms": pct(ws, 50),
        **total,
        **cpu,
        "gateway_cores": cpu["cpu_gateway_s"] / wall,
        "client_cores": cpu["cpu_client_s"] / wall,
        "gateway_cpu_ms_per_exec": 1000 * cpu["cpu_gateway_s"] / done,
        "kernel_cpu_ms_per_exec": 1000 * cpu["cpu_kernels_s"] / done,
        "load_1min_before": min(p["load_1min_before"] for p in parts),
        "load_1min_after": max(p["load_1min_after"] for p in parts),
        "rounds": len(parts),
    }


def wait_for_workers(gw: Gateway, n: int, timeout: float = 90) -> None:
    if n == 1:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if f"with {n} worker processes" in gw.log_path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{n} workers did not come up; see {gw.log_path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="per cell and configuration, over all rounds")
    ap.add_argument("--rounds", type=int, default=2, help="gateway starts per configuration, in ABBA order")
    ap.add_argument("--sessions", type=int, default=8, help="sessions, one client each (half REST, half WebSocket)")
    ap.add_argument("--workers", default="1,2", help="the configurations, e.g. 1,2")
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--json", type=Path, default=None, help="also write the result here (e.g. docs/bench/workers.json)")
    ap.add_argument("--chart", type=Path, default=None, help="also draw executions per second here")
    ap.add_argument("--quick", action="store_true", help="3 s per cell (a smoke run)")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.rounds = min(args.seconds, 3.0), 1
    machine = machine_info(args.image)
    configs = [int(x) for x in args.workers.split(",")]
    rows: list[dict[str, Any]] = []
    load_before = other_activity()
    # ABBA...: the configurations alternate round by round, so the machine's load drift hits them alike
    order = [n for r in range(args.rounds) for n in (configs if r % 2 == 0 else configs[::-1])]
    per_round_s = args.seconds / args.rounds
    raw: dict[tuple[int, str], list[dict[str, Any]]] = {}
    spread: dict[int, dict[str, int]] = {}
    for k, n in enumerate(order):
        name = f"wk{n}{k}{os.getpid()}"
        env = {
            "KERNELGW_WORKERS": str(n),
            "KERNELGW_POOL_SIZE": "0",
            "KERNELGW_ON_SHUTDOWN": "stop",
            "KERNELGW_CLUSTER_HEARTBEAT_S": "1",
            "KERNELGW_LOG_FORMAT": "text",
        }
        gw = Gateway(name, image=args.image, env=env)
        gateway_name = gw.env["KERNELGW_GATEWAY_NAME"]
        names = [gateway_name] + [f"{gateway_name}-w{i}" for i in range(1, n)]
        try:
            with gw:
                wait_for_workers(gw, n)
                result = asyncio.run(measure(gw, args.sessions, per_round_s, names))
        finally:
            remove_containers(names)
        for cell in CELLS:
            raw.setdefault((n, cell), []).append(result[cell])
            done = len(result[cell]["rest_ms"]) + len(result[cell]["ws_ms"])
            print(
                f"round {k + 1}/{len(order)}: workers={n} {cell}: {done / result[cell]['wall_s']:.1f} exec/s",
                flush=True,
            )
        for i, w in enumerate(names):
            spread.setdefault(n, {}).setdefault(f"w{i}", 0)
            spread[n][f"w{i}"] += result["sessions_per_worker"].get(w, 0)
    for n in configs:
        for cell in CELLS:
            r = combine(raw[(n, cell)])
            r |= {"workers": n, "cell": cell, "sessions_per_worker": spread[n]}
            rows.append(r)
            print(
                f"workers={n} {cell:>10}: {r['per_s']:7.1f} exec/s (REST {r['rest_per_s']:.1f}, WebSocket "
                f"{r['ws_per_s']:.1f}), p50 {r['p50_ms']:.2f} ms, p95 {r['p95_ms']:.2f} ms, REST forwarded "
                f"{r['rest_forwarded']}/{r['rest_answers']}, errors {r['errors']}; CPU: gateway "
                f"{r['gateway_cores']:.2f} cores, kernels {r['cpu_kernels_s'] / r['wall_s']:.2f}, client "
                f"{r['client_cores']:.2f}; sessions per worker over the rounds {r['sessions_per_worker']}",
                flush=True,
            )
    load_after = other_activity()
    print_summary(rows)
    result_doc: dict[str, Any] = {
        "benchmark": "workers",
        "date": now_iso(),
        "machine": machine,
        "args": vars(args)
        | {"json": str(args.json) if args.json else None, "chart": str(args.chart) if args.chart else None},
        "load": {"before": load_before, "after": load_after},
        "rows": rows,
    }
    if args.json:
        write_json(args.json, result_doc)
    if args.chart:
        draw(rows, configs, args.chart)


def remove_containers(names: list[str]) -> None:
    """Nothing of the benchmark's gateways outlives it (``on_shutdown=stop`` already removed them)."""
    import docker

    dc = docker.from_env()
    try:
        for name in names:
            label = {"label": f"kernelgw.gateway={name}"}
            for c in dc.containers.list(all=True, filters=label):
                with contextlib.suppress(Exception):
                    c.remove(force=True, v=True)
            for v in dc.volumes.list(filters=label):
                with contextlib.suppress(Exception):
                    v.remove(force=True)
    finally:
        dc.close()


COLUMNS = (
    ("workers", "{workers}"),
    ("cell", "{cell}"),
    ("exec/s", "{per_s:.1f}"),
    ("vs first", "{ratio:.2f}x"),
    ("p50 ms", "{p50_ms:.1f}"),
    ("p95 ms", "{p95_ms:.1f}"),
    ("gateway CPU ms/exec", "{gateway_cpu_ms_per_exec:.2f}"),
    ("kernel CPU ms/exec", "{kernel_cpu_ms_per_exec:.2f}"),
    ("gateway cores", "{gateway_cores:.2f}"),
    ("client cores", "{client_cores:.2f}"),
    ("load 1 min (lowest-highest)", "{load_1min_before:.2f}-{load_1min_after:.2f}"),
)


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of the rows (also docs/benchmarks.md's, through report.py)."""
    first = rows[0]["workers"] if rows else 1
    base = {r["cell"]: r["per_s"] for r in rows if r["workers"] == first}
    lines = ["| " + " | ".join(c for c, _ in COLUMNS) + " |", "|" + "|".join("---:" for _ in COLUMNS) + "|"]
    for r in rows:
        values = r | {"ratio": r["per_s"] / base[r["cell"]] if base.get(r["cell"]) else float("nan")}
        lines.append("| " + " | ".join(f.format(**values) for _, f in COLUMNS) + " |")
    return lines


def print_summary(rows: list[dict[str, Any]]) -> None:
    print(f"\naggregate executions per second, {os.cpu_count()} cores ({now_iso()})\n")
    print("\n".join(summary_lines(rows)))


def draw(rows: list[dict[str, Any]], configs: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(configs)
    for j, n in enumerate(configs):
        mine = [r for r in rows if r["workers"] == n]
        xs = [i + j * width for i in range(len(mine))]
        ax.bar(xs, [r["per_s"] for r in mine], width, label=f"{n} worker{'s' if n > 1 else ''}")
    ax.set_xticks([i + width * (len(configs) - 1) / 2 for i in range(len(CELLS))], list(CELLS))
    ax.set_ylabel("executions per second (all clients)")
    ax.set_title(f"kernelgw serve --workers N on {os.cpu_count()} cores")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
