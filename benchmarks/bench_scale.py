"""Scale: 100 idle sessions at once, 20 sessions executing concurrently, sessions per GiB.

One gateway (KERNELGW_MAX_SESSIONS raised, KERNELGW_MEMORY_MB=256 per session, no
pool) in its own process:
  1. create N sessions (default 100), C at a time, over REST; run `1+1` in each
     (all alive and answering), let them idle a few seconds, then measure
     - each container's memory from its cgroup (v1: memory.usage_in_bytes and
       memory.stat; the working set is usage minus inactive file pages, as
       `docker stats` shows it)
     - the gateway's RSS (/proc/<pid>/status VmRSS; VmHWM for its peak)
     - containerd-shim PSS per container and MemAvailable of the host (what a
       session really costs the machine, beyond its cgroup)
  2. 20 of those sessions (the rest stay idle) each run `1+1` over their own
     WebSocket in a loop for D seconds: throughput (executions/s) and latency
     p50/p95/p99; the floor is one session alone doing the same
  3. every session prints 2000 lines, one stream event each, so that every
     replay buffer (KERNELGW_REPLAY_BUFFER, 2000 events) is full: the gateway's RSS
     with N sessions that have been used, not just idle
  4. delete them all.
The clients are one asyncio process on the same 2-core machine as the gateway and
the kernels: at 20-way concurrency everything competes for the same cores.

Run:  .venv/bin/python benchmarks/bench_scale.py [--quick] [--sessions 100] [--json docs/bench/scale.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
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
    WsConn,
    container_memory,
    machine_info,
    meminfo_kib,
    now_iso,
    pct,
    print_table,
    proc_status_kib,
    summary,
    write_json,
)

MiB = 2**20
# one stream event per line: each print is flushed on its own
FILL_CODE = "import sys\nfor i in range({n}):\n    print('line', i)\n    sys.stdout.flush()\n"
FLOOR = "1+1 WebSocket, 1 session alone (floor)"


def pss_kib(pid: int) -> int:
    """Proportional set size: shared pages (the shim binary's text) split among their users."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return proc_status_kib(pid)
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return proc_status_kib(pid)


def shim_pss_kib(container_ids: set[str]) -> dict[str, int]:
    """PSS of the containerd-shim of each container (Docker 20.10: one shim per container)."""
    out: dict[str, int] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not cmd or b"containerd-shim" not in cmd[0]:
            continue
        args = [a.decode(errors="replace") for a in cmd]
        cid = args[args.index("-id") + 1] if "-id" in args else None
        if cid in container_ids:
            out[cid] = pss_kib(int(pid))
    return out


def daemon_rss_kib() -> dict[str, int]:
    out: dict[str, int] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if comm in ("dockerd", "containerd"):
                out[comm] = out.get(comm, 0) + proc_status_kib(int(pid))
    return out


async def create_all(url: str, n: int, concurrency: int) -> tuple[list[str], list[float], float]:
    sem = asyncio.Semaphore(concurrency)
    ids: list[str] = []
    lat: list[float] = []

    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def one() -> None:
            async with sem:
                t0 = time.perf_counter()
                r = await client.post("/v1/sessions", json={})
                r.raise_for_status()
                lat.append((time.perf_counter() - t0) * 1000)
                ids.append(r.json()["id"])

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return ids, lat, time.perf_counter() - t0


def last_seqs(url: str, ids: list[str]) -> list[int]:
    """Each session's last published sequence number (its event count)."""
    sessions = {s["id"]: s for s in httpx.get(f"{url}/v1/sessions", timeout=60).json()["sessions"]}
    return [int(sessions[sid]["last_seq"]) for sid in ids]


async def ping_all(
    url: str, ids: list[str], concurrency: int, code: str = "1+1", stdout: str | None = None
) -> list[float]:
    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def one(sid: str) -> None:
            async with sem:
                t0 = time.perf_counter()
                r = await client.post(f"/v1/sessions/{sid}/execute", json={"code": code})
                r.raise_for_status()
                body = r.json()
                assert body["status"] == "ok", body["status"]
                if stdout is not None:
                    got = "".join(e["text"] for e in body["events"] if e["type"] == "stream" and e["name"] == "stdout")
                    assert got == stdout, f"output lost: {len(got)} of {len(stdout)} characters"
                lat.append((time.perf_counter() - t0) * 1000)

        await asyncio.gather(*(one(s) for s in ids))
    return lat


async def delete_all(url: str, ids: list[str], concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def one(sid: str) -> None:
            async with sem:
                (await client.delete(f"/v1/sessions/{sid}")).raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(one(s) for s in ids))
        return time.perf_counter() - t0


async def hammer(ws_urls: list[str], seconds: float, code: str = "1+1") -> tuple[list[float], int, float]:
    """Each URL: one WebSocket running `code` back to back until the deadline."""
    lat: list[float] = []
    conns = [WsConn(u) for u in ws_urls]
    for c in conns:
        await c.__aenter__()
    try:
        for c in conns:  # warm-up
            await c.execute(code)
        deadline = time.perf_counter() + seconds

        async def loop(c: WsConn) -> int:
            k = 0
            while time.perf_counter() < deadline:
                ms, events = await c.execute(code)
                assert events[-1]["status"] == "ok"
                lat.append(ms)
                k += 1
            return k

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(loop(c) for c in conns))
        elapsed = time.perf_counter() - t0
    finally:
        for c in conns:
            await c.__aexit__(None, None, None)
    return lat, sum(counts), elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="20 idle sessions, 5 busy, short runs")
    ap.add_argument("--sessions", type=int, help="idle sessions at once (default 100, quick 20)")
    ap.add_argument("--busy", type=int, help="sessions executing concurrently (default 20, quick 5)")
    ap.add_argument("--seconds", type=float, help="duration of each throughput run (default 15, quick 4)")
    ap.add_argument("--create-concurrency", type=int, default=4)
    ap.add_argument("--memory-mb", type=int, default=256, help="per-session memory limit")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds idle before measuring memory")
    ap.add_argument("--replay-buffer", type=int, default=2000, help="KERNELGW_REPLAY_BUFFER (the default)")
    ap.add_argument("--skip-replay-fill", action="store_true", help="skip filling every replay buffer")
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "scale.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "scale.png")
    args = ap.parse_args()
    n = args.sessions or (20 if args.quick else 100)
    busy = min(n, args.busy or (5 if args.quick else 20))
    seconds = args.seconds or (4.0 if args.quick else 15.0)
    machine = machine_info(args.image)

    env = {
        "KERNELGW_MAX_SESSIONS": str(n + 10),
        "KERNELGW_MEMORY_MB": str(args.memory_mb),
        "KERNELGW_POOL_SIZE": "0",
        "KERNELGW_REPLAY_BUFFER": str(args.replay_buffer),
    }
    res: dict[str, Any] = {
        "benchmark": "scale",
        "date": now_iso(),
        "machine": machine,
        "sessions": n,
        "busy": busy,
        "memory_mb": args.memory_mb,
        "args": vars(args) | {"json": str(args.json), "chart": str(args.chart)},
    }
    with Gateway("scale", image=args.image, env=env) as gw:
        # warm the gateway's code paths (imports, first session) so the baseline is a fair one
        ids, _, _ = asyncio.run(create_all(gw.url, 1, 1))
        asyncio.run(ping_all(gw.url, ids, 1))
        asyncio.run(delete_all(gw.url, ids, 1))
        time.sleep(2)
        rss0 = gw.rss_kib()
        avail0 = meminfo_kib("MemAvailable")
        daemons0 = daemon_rss_kib()

        print(f"creating {n} sessions, {args.create_concurrency} at a time...", flush=True)
        ids, create_lat, create_s = asyncio.run(create_all(gw.url, n, args.create_concurrency))
        ping_lat = asyncio.run(ping_all(gw.url, ids, 4))
        listed = httpx.get(f"{gw.url}/v1/sessions", timeout=60).json()["sessions"]
        alive = sum(1 for s in listed if s["state"] == "idle")
        print(
            f"{len(ids)} created in {create_s:.1f} s; {alive} idle and answering; settling {args.settle} s", flush=True
        )
        time.sleep(args.settle)

        containers = {c.labels["kernelgw.session"]: c.id for c in gw.containers()}
        mem = [container_memory(containers[s]) for s in ids]
        shims = shim_pss_kib(set(containers.values()))
        rss1 = gw.rss_kib()
        avail1 = meminfo_kib("MemAvailable")
        daemons1 = daemon_rss_kib()

        def stats(key: str) -> dict[str, float]:
            vals = [m[key] / MiB for m in mem]
            return {"mean_mib": sum(vals) / len(vals), "p50_mib": pct(vals, 50), "max_mib": max(vals)}

        per_container = {k: stats(k) for k in ("usage", "working_set", "rss", "shmem")}
        shim_mean = sum(shims.values()) / 1024 / max(1, len(shims))
        gw_per_session = (rss1 - rss0) / 1024 / n
        host_per_session = (avail0 - avail1) / 1024 / n
        per_session_ws = per_container["working_set"]["mean_mib"] + shim_mean + gw_per_session
        res["idle"] = {
            "created": len(ids),
            "alive": alive,
            "create_seconds": create_s,
            "gateway_rss_mib_before": rss0 / 1024,
            "gateway_rss_mib": rss1 / 1024,
            "gateway_rss_mib_per_session": gw_per_session,
            "container_mib": per_container,
            "cgroup_source": mem[0].get("source"),
            "shim_pss_mib_per_container": shim_mean,
            "shims_found": len(shims),
            "daemons_rss_mib_before": {k: v / 1024 for k, v in daemons0.items()},
            "daemons_rss_mib": {k: v / 1024 for k, v in daemons1.items()},
            "host_memavailable_drop_mib_per_session": host_per_session,
            "per_session_mib": per_session_ws,
            "sessions_per_gib": 1024 / per_session_ws,
            "sessions_per_gib_host": 1024 / host_per_session if host_per_session > 0 else None,
        }

        # ---- throughput: one alone (floor), then `busy` at once; twice, interleaved
        urls = [gw.ws_url(s) for s in ids[:busy]]
        alone: list[float] = []
        many: list[float] = []
        alone_rate, many_rate = [], []
        for _ in range(2):
            lat, count, el = asyncio.run(hammer(urls[:1], seconds / 2))
            alone += lat
            alone_rate.append(count / el)
            lat, count, el = asyncio.run(hammer(urls, seconds))
            many += lat
            many_rate.append(count / el)
        res["throughput"] = {
            "alone_exec_per_s": sum(alone_rate) / len(alone_rate),
            "concurrent_exec_per_s": sum(many_rate) / len(many_rate),
            "seconds": seconds,
        }
        res["gateway_rss_mib_after_load"] = gw.rss_kib() / 1024
        res["gateway_vmhwm_mib"] = proc_status_kib(gw.pid, "VmHWM") / 1024

        # ---- every session's replay buffer full (KERNELGW_REPLAY_BUFFER events each, small ones):
        # the most a gateway keeps per session for resuming WebSocket clients
        if not args.skip_replay_fill:
            print(f"filling {n} replay buffers ({args.replay_buffer} events each)...", flush=True)
            t0 = time.perf_counter()
            # in cells of 200 flushed lines, until every session has published as many
            # events as its buffer holds (the gateway merges lines that arrive together
            # into one stream event, so a cell makes from a few to 203 events)
            lines = "".join(f"line {i}\n" for i in range(200))
            cells = 0
            while cells < args.replay_buffer and min(last_seqs(gw.url, ids)) < args.replay_buffer:
                asyncio.run(ping_all(gw.url, ids, 4, code=FILL_CODE.format(n=200), stdout=lines))
                cells += 1
            time.sleep(2)
            res["replay_full"] = {
                "events_per_session": args.replay_buffer,
                "lines_per_session": cells * 200,
                "seconds": time.perf_counter() - t0,
                "gateway_rss_mib": gw.rss_kib() / 1024,
                "last_seq_min": min(last_seqs(gw.url, ids)),
            }
            res["gateway_vmhwm_mib"] = proc_status_kib(gw.pid, "VmHWM") / 1024

        print(f"deleting {n} sessions...", flush=True)
        res["delete_seconds"] = asyncio.run(delete_all(gw.url, ids, 8))
        res["leftover_containers"] = len(gw.containers())

    res["rows"] = [
        summary(FLOOR, alone),
        summary(f"1+1 WebSocket, {busy} sessions concurrently", many),
        summary(f"create, {args.create_concurrency} at a time ({n} sessions)", create_lat),
        summary(f"first 1+1 REST in each, 4 at a time ({n} sessions)", ping_lat),
    ]
    report(res)
    if args.json:
        write_json(args.json, res)
    if args.chart:
        chart(res, args.chart)


def report(res: dict[str, Any]) -> None:
    idle, tp = res["idle"], res["throughput"]
    print_table(f"Scale latencies ({res['date']})", res["rows"], FLOOR)
    cm = idle["container_mib"]
    print(f"""
{idle["alive"]}/{res["sessions"]} sessions idle and answering at once (created in {idle["create_seconds"]:.1f} s)
gateway RSS: {idle["gateway_rss_mib_before"]:.1f} MiB before, {idle["gateway_rss_mib"]:.1f} MiB with {res["sessions"]} sessions \
({idle["gateway_rss_mib_per_session"]:.2f} MiB per session); {res["gateway_rss_mib_after_load"]:.1f} MiB after the load \
test, peak (VmHWM) {res["gateway_vmhwm_mib"]:.1f} MiB
container memory per session ({idle["cgroup_source"]}, MiB): working set mean {cm["working_set"]["mean_mib"]:.1f} \
(p50 {cm["working_set"]["p50_mib"]:.1f}, max {cm["working_set"]["max_mib"]:.1f}); cgroup usage mean \
{cm["usage"]["mean_mib"]:.1f}; anonymous (rss) {cm["rss"]["mean_mib"]:.1f}; tmpfs/shmem {cm["shmem"]["mean_mib"]:.2f}
containerd-shim PSS per container: {idle["shim_pss_mib_per_container"]:.1f} MiB ({idle["shims_found"]} found)
host MemAvailable drop per session: {idle["host_memavailable_drop_mib_per_session"]:.1f} MiB
per session (working set + shim + gateway share): {idle["per_session_mib"]:.1f} MiB -> \
{idle["sessions_per_gib"]:.1f} sessions per GiB (by MemAvailable drop: {idle["sessions_per_gib_host"] or 0:.1f})
throughput: {tp["alone_exec_per_s"]:.0f} executions/s alone, {tp["concurrent_exec_per_s"]:.0f} executions/s with \
{res["busy"]} sessions concurrently
delete {res["sessions"]} sessions: {res["delete_seconds"]:.1f} s; leftover containers: {res["leftover_containers"]}""")
    if res.get("replay_full"):
        rf = res["replay_full"]
        print(
            f"every replay buffer full ({rf['events_per_session']} small events per session, last_seq >= "
            f"{rf['last_seq_min']}): gateway RSS {rf['gateway_rss_mib']:.1f} MiB ({rf['seconds']:.0f} s to fill)"
        )


def chart(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    idle, tp = res["idle"], res["throughput"]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(12, 4.4), gridspec_kw={"width_ratios": [1.3, 1, 1]})
    parts = [
        ("container\nworking set", idle["container_mib"]["working_set"]["mean_mib"]),
        ("containerd-shim", idle["shim_pss_mib_per_container"]),
        ("gateway share", idle["gateway_rss_mib_per_session"]),
    ]
    left = 0.0
    colors = ["#3572A5", "#9bbbd4", "#e69f00"]
    for (label, v), col in zip(parts, colors, strict=True):
        a1.barh(0, v, left=left, color=col, label=f"{label.replace(chr(10), ' ')}: {v:.1f} MiB")
        left += v
    a1.barh(
        1,
        idle["host_memavailable_drop_mib_per_session"],
        color="#888888",
        label=f"host MemAvailable drop: {idle['host_memavailable_drop_mib_per_session']:.1f} MiB",
    )
    a1.set_yticks([0, 1], ["accounted", "host view"])
    a1.set_xlabel("MiB per idle session")
    a1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    a1.set_title(
        f"{idle['alive']} idle sessions: {idle['sessions_per_gib']:.1f} per GiB; "
        f"gateway {idle['gateway_rss_mib']:.0f} MiB RSS",
        fontsize=9,
    )
    rates = [tp["alone_exec_per_s"], tp["concurrent_exec_per_s"]]
    a2.bar(["1 session", f"{res['busy']} sessions"], rates, color=["#888888", "#3572A5"])
    for i, v in enumerate(rates):
        a2.text(i, v, f"{v:.0f}/s", ha="center", va="bottom", fontsize=8)
    a2.set_ylabel("executions of 1+1 per second")
    a2.set_title("throughput", fontsize=9)
    rows = res["rows"][:2]
    x = range(len(rows))
    for key, marker in (("p50_ms", "o"), ("p95_ms", "s"), ("p99_ms", "^")):
        a3.plot(list(x), [r[key] for r in rows], marker=marker, label=key[:3])
    a3.set_xticks(list(x), ["1 session", f"{res['busy']} sessions"])
    a3.set_ylabel("ms per execution")
    a3.set_ylim(0, None)
    a3.legend(fontsize=7)
    a3.set_title("1+1 latency", fontsize=9)
    fig.suptitle(
        f"Scale, {res['date'][:10]}, {res['machine']['cores']} cores, {res['machine']['ram_gib']} GiB, "
        f"{res['memory_mb']} MB limit per session",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
