"""Write docs/benchmarks.md from the JSON results of the bench_*.py scripts.

Run by scripts/bench.sh after the benchmarks; by hand:
    .venv/bin/python benchmarks/report.py [--dir docs/bench] [--out docs/benchmarks.md]
Every number and every met/missed verdict in the page comes from the JSON files,
so a new run regenerates a consistent page.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DOCS_BENCH, REPO, table_lines

# targets of the "Performance" issue
WARM_START_P50_MS = 50.0
WS_OVER_FLOOR_MS = 1.0
IDLE_SESSIONS = 100
GATEWAY_RSS_MB = 300.0  # MB = 10^6 bytes
FLOOD_P50_MS = 1.0  # "not slowed": p50 at most this much worse under the flood ...
FLOOD_P95_RATIO = 1.25  # ... and p95 at most this many times the idle p95
# targets of the "Durable sessions" issue (bench_reattach, bench_ack, bench_crash keep their own copies
# in their JSON: goal_s / goal_ms / goals, which the verdicts below use when present)
REATTACH_GOAL_S = 2.0
REATTACH_SESSIONS = 20
ACK_OVER_RAW_MS = 1.0
CRASH_ROUNDS = 100


def load(d: Path, name: str) -> dict[str, Any] | None:
    p = d / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def row(rows: list[dict[str, Any]], startswith: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["name"].startswith(startswith)), None)


def rel(path: Path, out: Path) -> str:
    return os.path.relpath(path, out.parent)


def table(rows: list[dict[str, Any]], floor: str | None, label: str = "floor") -> str:
    return "\n".join(table_lines(rows, floor, floor_label=label))


def verdict(ok: bool | None) -> str:
    return {True: "**met**", False: "**missed**", None: "not measured"}[ok]


def targets(start: Any, exec_: Any, scale: Any, flood: Any, core: Any) -> tuple[list[str], list[str]]:
    """(summary table lines, explanation paragraphs)."""
    lines = ["| target | measured | verdict | by how much |", "|---|---|---|---|"]
    why: list[str] = []

    # 1. warm pool start
    if start:
        warm = row(start["rows"], "kernelgw warm pool")
        cold = row(start["rows"], "kernelgw cold container: create")
        first = next((r for r in start["rows"] if "warm" in r["name"] and "first" in r["name"]), None)
        cold_first = row(start["rows"], "kernelgw cold: create + first")
        later = next((r for r in start["rows"] if "later 1+1" in r["name"]), None)
        pool = start.get("pool", {})
        active = bool(pool.get("active"))
        ok = active and warm is not None and warm["p50_ms"] < WARM_START_P50_MS
        lines.append(
            f"| session start from the warm pool, p50 < {WARM_START_P50_MS:.0f} ms | "
            f"p50 {warm['p50_ms']:.1f} ms, p95 {warm['p95_ms']:.1f} ms (n={warm['n']}) | {verdict(ok)} | "
            f"{WARM_START_P50_MS - warm['p50_ms']:+.1f} ms of margin |"
        )
        if active:
            why.append(
                f"**Warm pool start.** {pool.get('sample_hits')}/{pool.get('samples')} timed creates were served from "
                f"the pool (`kernelgw_pool_hits` on `/metrics`; pool size {pool.get('size')}). A hit is a hand-over of "
                f"a kernel that is already running and answered `kernel_info`, so `POST /v1/sessions` costs "
                f"{warm['p50_ms']:.1f} ms at p50 instead of {cold['p50_ms']:.0f} ms for a cold container "
                f"({cold['p50_ms'] / warm['p50_ms']:.0f}x less). The first `1+1` right after a pooled create takes "
                f"{first['p50_ms'] - warm['p50_ms']:.1f} ms (create + first result: {first['p50_ms']:.1f} ms p50), more than "
                + (f"a later `1+1` ({later['p50_ms']:.1f} ms)" if later else "a later `1+1`")
                + "; after a cold create the first `1+1` takes "
                f"{cold_first['p50_ms'] - cold['p50_ms']:.1f} ms: every kernel's first cell is slower, and after a "
                f"hand-over the pool starts its replacement kernel at once, a container start competing for the same "
                f"{start['machine']['cores']} cores, which probably explains the rest. "
                f"Each sample waited until the pool was full again: this is the latency of a pool that keeps up with "
                f"demand; a burst larger than the pool gets cold starts (and raises the pool's target)."
            )
        else:
            why.append(
                "**Warm pool start.** No create was a pool hit (no `kernelgw_pool_hits` on `/metrics`): the "
                "gateway measured had no working pool, so the 'warm pool' rows are cold starts."
            )

    # 2. 1+1 over the WebSocket vs the raw floor
    if exec_:
        t = exec_["tables"]["1+1"]
        floor, ws = t[0], row(t, "kernelgw WebSocket")
        d = ws["p50_ms"] - floor["p50_ms"]
        ok = d <= WS_OVER_FLOOR_MS
        lines.append(
            f"| `1+1` over the WebSocket, p50 within {WS_OVER_FLOOR_MS:.0f} ms of raw jupyter_client | "
            f"{ws['p50_ms']:.2f} ms vs floor {floor['p50_ms']:.2f} ms (n={ws['n']}) | {verdict(ok)} | "
            f"{d:+.2f} ms over the floor ({WS_OVER_FLOOR_MS - d:+.2f} ms of margin) |"
        )
        cross = []
        if core:
            c_ws, c_raw = row(core["rows"], "1+1 kernelgw WebSocket"), row(core["rows"], "1+1 raw")
            cross.append(
                f"{c_ws['p50_ms'] - c_raw['p50_ms']:+.2f} ms in bench_core (blocks of {c_ws['n'] // 5} per "
                f"transport and round)"
            )
        if flood:
            f_ws, f_raw = row(flood["rows"], "A kernelgw WebSocket, B idle"), flood["rows"][0]
            cross.append(f"{f_ws['p50_ms'] - f_raw['p50_ms']:+.2f} ms in bench_flood's idle phases")
        why.append(
            f"**`1+1` over the WebSocket.** All four kernelgw-side transports were open at once and alternated "
            f"sample by sample (the order rotating), against one session. The WebSocket adds {d:+.2f} ms at p50 and "
            f"{ws['p95_ms'] - floor['p95_ms']:+.2f} ms at p95 to raw jupyter_client on the same kernel"
            + (f" (the same comparison elsewhere in this run: {'; '.join(cross)})" if cross else "")
            + ". What the gateway adds per execution: one JSON WebSocket frame in and four out (queued, busy, result, "
            "done), the mapping of each iopub message to an event, and the artifact scan of /workspace in the "
            "kernel (a `user_expressions` entry on the same request, no extra round trip). The floor itself is "
            "jupyter_client's asyncio client in Python, so it is a practical floor, not a physical one."
        )

    # 3. 100 idle sessions, gateway RSS
    if scale:
        idle = scale["idle"]
        rss_mb = idle["gateway_rss_mib"] * 1.048576
        ok = idle["alive"] >= IDLE_SESSIONS and rss_mb < GATEWAY_RSS_MB
        lines.append(
            f"| {IDLE_SESSIONS} idle sessions alive at once, gateway under {GATEWAY_RSS_MB:.0f} MB RSS | "
            f"{idle['alive']} alive; gateway {rss_mb:.0f} MB RSS | {verdict(ok)} | "
            f"{GATEWAY_RSS_MB - rss_mb:+.0f} MB of margin |"
        )
        rf = scale.get("replay_full")
        if rf:
            rf_mb = rf["gateway_rss_mib"] * 1.048576
            lines.append(
                f"| (the same {scale['sessions']} sessions after each printed {filled_lines(rf)} lines) | gateway "
                f"{rf_mb:.0f} MB RSS | {verdict(rf_mb < GATEWAY_RSS_MB)} | "
                f"{GATEWAY_RSS_MB - rf_mb:+.0f} MB |"
            )
        why.append(
            f"**{scale['sessions']} idle sessions.** All {idle['created']} sessions were created "
            f"({scale['args']['create_concurrency']} at a time, {idle['create_seconds']:.0f} s in all) and answered a "
            f"`1+1`, then idled. The gateway process grew from {idle['gateway_rss_mib_before']:.0f} to "
            f"{idle['gateway_rss_mib']:.0f} MiB RSS ({idle['gateway_rss_mib_per_session'] * 1024:.0f} KiB per "
            f"session: a kernel client with its ZMQ sockets, the replay buffer and the session's records); after the "
            f"concurrency test it was {scale['gateway_rss_mib_after_load']:.0f} MiB, peak (VmHWM) "
            f"{scale['gateway_vmhwm_mib']:.0f} MiB. The memory that limits density is the kernels': see Scale."
            + (
                f" The target is met for sessions that are idle since their start. After every session had also "
                f"printed {filled_lines(rf)} lines in cells of 200 (which fills each replay buffer, "
                f"{rf['events_per_session']} events kept for WebSocket clients that resume), the gateway held {rf['gateway_rss_mib']:.0f} MiB "
                f"({(rf['gateway_rss_mib'] - idle['gateway_rss_mib']) * 1024 / scale['sessions']:,.0f} KiB more per "
                f"session than when idle)"
                + (", over the target" if rf["gateway_rss_mib"] * 1.048576 >= GATEWAY_RSS_MB else "")
                + ". Large outputs cost the gateway more (see Findings)."
                if rf
                else ""
            )
        )

    # 4. output flood
    if flood:
        r = {x["name"]: x for x in flood["rows"]}
        wi, wf = r["A kernelgw WebSocket, B idle"], r["A kernelgw WebSocket, B flooding"]
        ri, rf = flood["rows"][0], r["A raw jupyter_client, B flooding"]
        d50, r95 = wf["p50_ms"] - wi["p50_ms"], wf["p95_ms"] / wi["p95_ms"]
        ok = d50 <= FLOOD_P50_MS and r95 <= FLOOD_P95_RATIO
        fl = flood["flood"]
        lines.append(
            f"| no execution slowed by another session's output flood (p50 +{FLOOD_P50_MS:.0f} ms, p95 "
            f"x{FLOOD_P95_RATIO} at most) | `1+1` p50 {wi['p50_ms']:.2f} -> {wf['p50_ms']:.2f} ms, p95 "
            f"{wi['p95_ms']:.2f} -> {wf['p95_ms']:.2f} ms | {verdict(ok)} | p50 {d50:+.2f} ms, p95 "
            f"x{r95:.2f}, p99 {wi['p99_ms']:.1f} -> {wf['p99_ms']:.1f} ms |"
        )
        gw_idle = wi["p95_ms"] - ri["p95_ms"]
        gw_flood = wf["p95_ms"] - rf["p95_ms"]
        why.append(
            f"**Output flood.** Session B printed {fl['mb_per_execution']} MB per cell, back to back "
            f"({fl['executions']} cells, {fl['bytes_received'] / 1e6:,.0f} MB delivered to B's WebSocket client, "
            f"{'complete, no truncation' if fl['complete'] else 'NOT complete'}, {fl['mb_per_s']:.0f} MB/s). "
            f"Session A's `1+1` over the WebSocket: p50 {wi['p50_ms']:.2f} -> {wf['p50_ms']:.2f} ms, p95 "
            f"{wi['p95_ms']:.2f} -> {wf['p95_ms']:.2f} ms, p99 {wi['p99_ms']:.1f} -> {wf['p99_ms']:.1f} ms. "
            f"The raw floor on A's kernel, which bypasses the gateway, moved too: p50 {ri['p50_ms']:.2f} -> "
            f"{rf['p50_ms']:.2f} ms, p95 {ri['p95_ms']:.2f} -> {rf['p95_ms']:.2f} ms: that part is the machine "
            f"(2 cores shared by B's kernel at its 1-CPU quota, the gateway relaying {fl['mb_per_s']:.0f} MB/s of "
            f"JSON, B's client decoding it, and A). The gateway's own share is the WebSocket-minus-raw difference: "
            f"at p50 {wi['p50_ms'] - ri['p50_ms']:+.2f} ms idle vs {wf['p50_ms'] - rf['p50_ms']:+.2f} ms flooding, "
            f"at p95 {gw_idle:+.2f} ms vs {gw_flood:+.2f} ms. "
            + _flood_cause(flood, ok)
            + "Verdict rule: met if A's p50 grows by at most "
            f"{FLOOD_P50_MS:.0f} ms and its p95 by at most {(FLOOD_P95_RATIO - 1) * 100:.0f}%."
        )
    return lines, why


def _findings(flood: Any, scale: Any, probe: Any) -> list[str]:
    out = []
    if flood and isinstance(flood.get("gateway_rss_mib"), dict):
        r = flood["gateway_rss_mib"]
        fl = flood["flood"]
        before = next((x["gateway_rss_mib_before"] for x in [scale.get("idle", {})] if x), None) if scale else None
        out.append(
            f"**The gateway's memory after large outputs.** After session B's {fl['executions']} flood cells "
            f"({fl['bytes_received'] / 1e6:,.0f} MB of output in {fl['stream_events']} messages of up to "
            f"{fl['max_event_bytes'] / 1e6:.0f} MB), the gateway's RSS was {r['after_flood']:,.0f} MiB; deleting B "
            f"brought it to {r['after_deleting_b']:,.0f} MiB and deleting A too to {r['after_deleting_both']:,.0f} "
            f"MiB" + (f" (a fresh gateway: about {before:.0f} MiB)" if before else "") + ". While a multi-MB "
            "message is relayed it exists several times at once (ZMQ frame, decoded content, event model, JSON "
            "for the watchers and the replay buffer, the execution's record, the history row), and the process "
            "gives memory back to the OS only partly and late after such peaks (the numbers above, 2 s apart). "
            "Against the RSS target this matters more than idle sessions do: one session printing large outputs "
            "can cost the gateway more than a hundred idle ones. A lower per-execution output cap (default 16 MiB; 64 MiB in this run) "
            "bounds it; splitting large messages into chunks would lower the peak."
        )
    if probe:
        g, raw = probe["gateway"], probe["raw"][-1]
        lost = raw["messages"] < raw["expected"] or not raw.get("idle_seen", False)
        gateway_lost = g["finished_with_output_lost"] or g["stuck"]
        if lost or gateway_lost:
            out.append(
                f"**A burst of many small outputs can lose iopub messages, and an execution can then hang.** "
                f"`benchmarks/probe_iopub_hwm.py`: a jupyter_client reading iopub 1 s late after a cell that printed "
                f"{raw['lines']} flushed lines received {raw['messages']} of {raw['expected']} messages"
                f"{'' if raw.get('idle_seen') else ' and no `idle` status'}: ZMQ PUB/SUB drops what exceeds the "
                f"high-water marks. Through the gateway, {g['sessions']} sessions at once each printing {g['lines']} "
                f"flushed lines: {g['finished']} executions finished ({g['finished_with_output_lost']} of them with "
                f"lines silently missing) and {g['stuck']} were still `busy` after {g['wait_s']:.0f} s."
            )
        else:
            out.append(
                f"**Bursts of small outputs no longer lose messages.** `benchmarks/probe_iopub_hwm.py`: a "
                f"jupyter_client reading iopub 1 s late after a cell that printed {raw['lines']} flushed lines got "
                f"all {raw['expected']} messages and the `idle` status, and through the gateway {g['sessions']} "
                f"sessions at once each printing {g['lines']} flushed lines all finished with every line "
                f"({g['finished']} of {g['sessions']}, none stuck). Earlier runs lost a third of such a burst: ZMQ's "
                f"default high-water marks (1000 messages on each side) drop silently on PUB/SUB. The gateway now "
                f"receives with a 100,000 HWM and the kernel (kernelgw_kernel.launcher) sends with the same."
            )
    return out


def _when(x: dict[str, Any]) -> str:
    m = x.get("machine") if isinstance(x.get("machine"), dict) else {}
    commit = m.get("kernelgw_commit", "?")
    dirty = m.get("kernelgw_uncommitted") or []
    start = (m.get("activity_start") or {}).get("loadavg")
    end = (x.get("activity_end") or {}).get("loadavg")
    pytest = max(
        (m.get("activity_start") or {}).get("pytest_processes", 0) or 0,
        (x.get("activity_end") or {}).get("pytest_processes", 0) or 0,
    )
    return (
        f"{x['date'][:16].replace('T', ' ')} UTC, commit {commit}"
        + (f" plus uncommitted changes in {len(dirty)} file(s) of kernelgw/" if dirty else "")
        + (f", load average {start[0]:.2f} at the start and {end[0]:.2f} at the end" if start and end else "")
        + (f", {pytest} pytest processes of other work running" if pytest else "")
    )


def durability(d: Path, out: Path, reattach: Any, ack: Any, crash: Any) -> list[str]:
    """The "Durability" section: restart and reattach, what acknowledged-means-stored
    costs, kill -9 rounds; every number and verdict from their JSON."""
    md: list[str] = []
    w = md.append
    w("## Durability\n")
    w(
        "A restarted gateway (SIGTERM with `on_shutdown=keep`, or kill -9) reattaches the kernel containers of its "
        "name; a cell is answered only after its history row is committed. Three scripts measure what that gives "
        "and costs; they run on the same 2-core machine as everything else, often beside other work, so each compares "
        "with a floor measured in the same run and stores the load average. Each script's date and commit are given "
        "below: they may come from another run than the sections above.\n"
    )
    lines = ["| goal | measured | verdict |", "|---|---|---|"]
    if reattach:
        s = reattach["summary"]
        goal_s, goal_n = s.get("goal_s", REATTACH_GOAL_S), s.get("goal_sessions", REATTACH_SESSIONS)
        kinds = s["by_kind"]
        lines.append(
            f"| restart -> first successful execute on a reattached session under {goal_s:g} s with {goal_n} "
            f"sessions | {reattach['sessions']} sessions: "
            + ", ".join(
                f"{k} p50 {v['first_s']['p50']:.2f} s (max {v['first_s']['max']:.2f}, n={v['n']})"
                for k, v in kinds.items()
            )
            + f" | {verdict(s['met'])} (worst {s['worst_first_s']:.2f} s, {s['worst_first_s'] - goal_s:+.2f} s) |"
        )
    if ack:
        goal = ack.get("goal_ms", ACK_OVER_RAW_MS)
        lines.append(
            f"| `1+1` over the WebSocket within {goal:g} ms of raw jupyter_client at p50 | "
            f"{ack['after_over_floor_p50_ms']:+.2f} ms over the floor (n={ack.get('samples_per_row', ack['rounds'])}; "
            "the tree before: "
            f"{ack['before_over_floor_p50_ms']:+.2f} ms) | {verdict(ack['after_over_floor_p50_ms'] <= goal)} |"
        )
    if crash:
        t, g = crash["totals"], crash.get("goals", {"lost": 0, "unmarked": 0, "leaked": 0})
        goal_rounds = crash.get("goal_rounds", CRASH_ROUNDS)
        loop_cell = crash.get("loop_cell", "1+1")
        variants = crash.get("variants") or [{"cell": loop_cell, "totals": t}]
        loop_rounds = sum(v["totals"]["rounds"] for v in variants if v["cell"] == loop_cell)
        if not all(t[k] <= v for k, v in g.items()):
            crash_verdict = verdict(False)
        elif loop_rounds >= goal_rounds:
            crash_verdict = verdict(True)
        else:  # nothing lost, but fewer rounds than the goal asks for
            crash_verdict = f"not measured in full: 0/0/0 in {loop_rounds} of {goal_rounds} rounds"
        lines.append(
            f"| kill -9 at random moments, {goal_rounds} rounds: 0 acknowledged cells lost, 0 cut-off cells left "
            f"unmarked, 0 containers leaked | "
            + "; ".join(
                f"`{v['cell']}`: {v['totals']['rounds']} rounds, {v['totals']['acknowledged']} acknowledged, "
                f"{v['totals']['lost']} lost"
                + (
                    f" ({v['totals']['from_journal']} written from the answer journal at a restart)"
                    if v["totals"].get("from_journal")
                    else ""
                )
                + f", {v['totals']['cut_off']} cut off and {v['totals']['unmarked']} left "
                f"unmarked, {v['totals']['leaked']} leaked"
                for v in variants
            )
            + f" | {crash_verdict} |"
        )
    md.extend(lines)
    w("")

    if reattach:
        s, n = reattach["summary"], reattach["sessions"]
        rs = reattach["restarts"]
        stops = [r["stop_s"] for r in rs if r["kind"] == "SIGTERM"]
        loads = [r["loadavg"][0] for r in rs]
        w("### Restart and reattach\n")
        w(
            f"`benchmarks/bench_reattach.py`, measured {_when(reattach)}. One gateway (SQLite history, no pool, "
            f"256 MB kernels) gets {n} sessions, each with `x = 42`; it is stopped with SIGTERM (on_shutdown=keep; "
            f"the stop itself took {min(stops, default=0):.2f}-{max(stops, default=0):.2f} s and is not counted) or "
            f"killed with SIGKILL, and started again. Seconds from the new process's spawn until `/healthz` answers "
            f"(uvicorn binds after the lifespan, which reattaches), the first `print(x)` answers 42, and all {n} have. "
            f"Plain restarts run `python -m kernelgw serve` and give the verdict; probed ones run the same CLI under a "
            f"wrapper that times the gateway's own start-up methods (nothing in kernelgw/ changed). 1-minute load "
            f"average at each restart: {min(loads):.2f}-{max(loads):.2f}.\n"
        )
        w(f"| restart | probe | sessions back | /healthz s | first `print(x)` s | all {n} answered s | load |")
        w("|---|---|---:|---:|---:|---:|---:|")
        for r in rs:
            w(
                f"| {r['kind']} | {'probed' if r['probed'] else 'plain'} | {r['sessions_listed']} | "
                f"{r['healthy_s']:.2f} | {r['first_s']:.2f} | {r['all_s']:.2f} | {r['loadavg'][0]:.2f} |"
            )
        w(f"\n![restart and reattach]({rel(d / 'reattach.png', out)})\n")
        bd = s.get("breakdown") or []
        if bd:
            first_p50 = statistics.median(r["first_s"] for r in rs if r["probed"])
            w(
                f"Where the time goes: median of the {s['breakdown_from']} probed restarts, steps in order (they tile "
                f"the time from spawn to the last answer; the first answer came at {first_p50:.2f} s).\n"
            )
            w("| step | p50 s | max s |")
            w("|---|---:|---:|")
            for b in bd:
                w(f"| {b['step']} | {b['p50_s']:.3f} | {b['max_s']:.3f} |")
            before_first = [b for b in bd if not b["step"].startswith("the other sessions")]
            top = sorted(before_first, key=lambda b: -b["p50_s"])[:3]
            reattach_steps = sum(
                b["p50_s"]
                for b in bd
                if b["step"].startswith(("open_sessions", "Docker list", "sessions reattach", "flush", "reap_except"))
            )
            w(
                f"\nVerdict rule: every plain restart's first answer under {s.get('goal_s', REATTACH_GOAL_S):g} s "
                f"with {s.get('goal_sessions', REATTACH_SESSIONS)} sessions. Largest steps before the first answer: "
                + ", ".join(f"{b['step']} {b['p50_s']:.2f} s ({b['p50_s'] / first_p50:.0%})" for b in top)
                + f"; everything the reattachment itself does (open_sessions, list_kernels, the sessions, flush, "
                f"reap_except) {reattach_steps:.2f} s ({reattach_steps / first_p50:.0%}).\n"
            )
            probed = [r["phases"] for r in rs if r["probed"] and "sessions" in r.get("phases", {})]
            if probed:
                ss = [p["sessions"] for p in probed]
                st = [p["store"] for p in probed]
                w(
                    f"- Each session's reattach (ZMQ connect, `kernel_info` on the control channel until a reply and "
                    f"an iopub message arrive): p50 {statistics.median(x['each_p50_s'] for x in ss) * 1000:.0f} ms, "
                    f"max {max(x['each_max_s'] for x in ss) * 1000:.0f} ms; all {ss[0]['n']} run concurrently. "
                    f"iopub waits that timed out (0.2 s each): {sum(x['iopub_timeouts'] for x in ss)}; control "
                    f"replies that timed out: {sum(x['control_timeouts'] for x in ss)}; sessions that failed: "
                    f"{sum(x['failed'] for x in ss)}."
                )
                if "reattach_reads_s" in st[0]:
                    reads = (
                        "- open_sessions reads every session's latest cells (its replay buffer) and lineage on one "
                        "connection, with one lineage and one chunk-size query for all: "
                        f"{statistics.median(x['reattach_reads_s'] for x in st) * 1000:.0f} ms at p50."
                    )
                else:  # a run from before queries.reattach_reads
                    reads = (
                        f"- open_sessions reads each session's latest cells one query at a time to refill its replay "
                        f"buffer: {st[0]['latest_events_calls']} queries, "
                        f"{statistics.median(x['latest_events_total_s'] for x in st) * 1000:.0f} ms at p50 in all."
                    )
                w(reads)
        fl = reattach.get("floors_s", {})
        ri = reattach.get("route_imports_s", {})
        if fl:
            w(
                "- Floors in the same run (fresh interpreters, no gateway): "
                + ", ".join(f"`{k}` p50 {statistics.median(v):.2f} s" for k, v in fl.items() if v)
                + "."
            )
        if ri:
            inst, blk = statistics.median(ri["as installed"]), statistics.median(ri["rfc3987_syntax blocked"])
            w(
                f"- The route modules `create_app` imports (kernelgw.server.history, routes, ws, jupyter, files, "
                f"packages, web), after serve's own imports: {inst:.2f} s as installed, {blk:.2f} s with "
                f"`rfc3987_syntax` blocked (p50 of {len(ri['as installed'])} fresh interpreters each)."
                + (
                    " The difference is `kernelgw.server.notebook`'s module-level `import nbformat` (see the next "
                    "point)."
                    if inst - blk > 0.5
                    else ""
                )
            )
            nb_inst, nb_blk = ri.get("import nbformat, as installed"), ri.get("import nbformat, rfc3987_syntax blocked")
            if nb_inst and nb_blk:
                nb_i, nb_b = statistics.median(nb_inst), statistics.median(nb_blk)
                w(
                    f"- `import nbformat` after serve's imports: {nb_i:.2f} s as installed, {nb_b:.2f} s with "
                    "`rfc3987_syntax` blocked."
                    + (
                        " nbformat imports its validator, which imports jsonschema, whose format checkers import "
                        "`rfc3987_syntax` when it is installed (jsonschema's `format-nongpl` extra, which "
                        "`jupyter-events` asks for: it comes with jupyter_server, in the test extra here, and with "
                        "any JupyterLab in the same environment); that module compiles some 40 lark grammars at "
                        "import. Until commit 2d70fd6 every gateway start paid it in `create_app`; then "
                        "`kernelgw.server.notebook` imported nbformat in a warm-up thread after the reattach, whose "
                        "1.3-1.8 s of GIL-holding CPU competed with the reattached sessions' first cells. Since "
                        "2026-11-27 the gateway keeps `rfc3987_syntax` out of its process (it only checks `iri` "
                        "formats, which no notebook schema uses): the 'blocked' figure is what a gateway pays now."
                        if nb_i - nb_b > 0.5
                        else ""
                    )
                )
        it = reattach.get("importtime") or []
        if it:
            w(
                "- `python -X importtime` of serve's and create_app's imports, self time by top-level package (ms, "
                "inflated by the measurement): "
                + ", ".join(f"{r['package']} {r['self_ms']:.0f}" for r in it[:10])
                + (f"; {it[-1]['package']} {it[-1]['self_ms']:.0f}" if it else "")
                + "."
            )
        w("")

    if ack:
        w("### What acknowledged-means-stored costs\n")
        w(
            f"`benchmarks/bench_ack.py`, measured {_when(ack)}. Two gateways at once: one from the tree before the "
            f"durable-sessions work (`git archive {ack.get('before_commit') or '?'}`, run from that directory), one "
            f"from this tree; one session each, SQLite history. `1+1` over each WebSocket and raw jupyter_client to "
            f"this tree's kernel (the floor), one sample of each per round in shuffled order, {ack['rounds']} rounds "
            f"after {ack['warmup']} warm-up rounds. 1-minute load average during the rounds: "
            f"{min(ack['loadavg_1min_during']):.2f}-{max(ack['loadavg_1min_during']):.2f}.\n"
        )
        w(table(ack["rows"], ack["floor"]))
        w(
            f"\nThis tree minus the tree before: p50 {ack['after_over_before_p50_ms']:+.2f} ms, p95 "
            f"{ack['after_over_before_p95_ms']:+.2f} ms. Goal (within {ack.get('goal_ms', ACK_OVER_RAW_MS):g} ms of the "
            f"floor at p50): {verdict(ack['after_over_floor_p50_ms'] <= ack.get('goal_ms', ACK_OVER_RAW_MS))}; the "
            f"tree before was {ack['before_over_floor_p50_ms']:+.2f} ms over the same floor in the same rounds. "
            "Both gateways run the same kernel image, so a change in the kernel moves both: since 2026-11-27 "
            "(afternoon) the kernel answers the gateway's two expressions of every cell without IPython's display "
            "formatter (`images/python/kernelgw_kernel/expressions.py`, about 0.2 ms of kernel time a cell), and "
            "the tree before, 38171e0, went from +0.80 to +1.11 ms (six runs that morning, the image before) to "
            "+0.06 to +0.66 ms over the floor.\n"
        )
        w(f"![acknowledged means stored]({rel(d / 'ack.png', out)})\n")
        blocks = load(d, "ack_blocks")
        if blocks:
            args = blocks["args"]
            w(
                f"The same comparison as issue 15 describes its held-out runs (`--idle-sessions "
                f"{args.get('idle_sessions')} --block {args.get('block')} --rounds {blocks['rounds']}`), measured "
                f"{_when(blocks)}: samples in blocks of {args.get('block')} of one row after another, with "
                f"{args.get('idle_sessions')} more sessions idle on each gateway. This tree was "
                f"{blocks['after_over_floor_p50_ms']:+.2f} ms over the floor at p50 (the tree before: "
                f"{blocks['before_over_floor_p50_ms']:+.2f} ms). Goal (within "
                f"{blocks.get('goal_ms', ACK_OVER_RAW_MS):g} ms): "
                f"{verdict(blocks['after_over_floor_p50_ms'] <= blocks.get('goal_ms', ACK_OVER_RAW_MS))}.\n"
            )
            w(table(blocks["rows"], blocks["floor"]))
            w("")
        store = ack.get("store_write_latency") or []
        if store:
            waited = next((r for r in store if r.get("waited") and r.get("kind") == "execution of session"), None)
            w(
                "History rows, time from queued to committed, as each gateway's store counted them (a `-c` wrapper "
                "around the CLI writes them out when the store closes; warm-up rounds included). A small cell's end "
                "row is answered once it is in the answer journal (`kernelgw.storage.journal`), so nobody waits for "
                "its commit; rows nobody waits on linger up to 20 ms to share a commit. Where an answer waits for a "
                "commit it is listed as such.\n"
            )
            w(table(store, None))
            if waited and waited.get("n"):
                w(
                    f"\nThe commit the answer waits for took {waited['p50_ms']:.2f} ms at p50 "
                    f"({waited['p95_ms']:.2f} ms at p95) from its queueing; the WebSocket `1+1` of this tree was "
                    f"{ack['after_over_before_p50_ms']:+.2f} ms slower than the tree before at p50 (other changes "
                    "between the trees are in that difference too).\n"
                )
            else:
                w("")

    if crash:
        t = crash["totals"]
        loop_cell = crash.get("loop_cell", "1+1")
        variants = crash.get("variants") or [{"cell": loop_cell, "totals": t}]
        w("### Kill -9 rounds\n")
        w(
            f"`benchmarks/bench_crash.py` (the loop is `tests/support/crash_loop.py`), measured {_when(crash)}. Each "
            "round starts `kernelgw serve` (SQLite, no pool), posts cells over REST one after another and SIGKILLs "
            "the gateway a random 0-20 ms after a random one of the first 1-8 requests was sent; the next round's "
            "gateway reattaches the session. A last gateway reads the history: every cell answered 200 must be there "
            "with the status it was answered with (else lost), no cell may be left `running` (unmarked), and after it "
            "stops with `on_shutdown=stop` no container of the name may remain (leaked). "
            f"Seed {crash['seed']}; {crash['seconds'] / 60:.1f} minutes in all ({crash['seconds_per_round']:.1f} s "
            "per round)."
            + (
                f" **Fewer rounds than asked: {t['rounds']} of {crash['rounds_asked']}, {crash['stopped_early']}.**"
                if crash.get("stopped_early")
                else ""
            )
            + "\n"
        )
        journal = any("from_journal" in v["totals"] for v in variants)
        w(
            "| cell | kill after the send | rounds | requests sent | acknowledged | lost | "
            + ("written in from the journal | " if journal else "")
            + "cut off (marked dead) | left running | containers leaked |"
        )
        w("|---|---|---:|---:|---:|---:|" + ("---:|" if journal else "") + "---:|---:|---:|")
        for v in variants:
            vt, k = v["totals"], v.get("kill_after_send_s") or [0.0, 0.02]
            w(
                f"| `{v['cell']}` | {k[0] * 1000:.0f}-{k[1] * 1000:.0f} ms | {vt['rounds']} | {vt['sent']} | "
                f"{vt['acknowledged']} | {vt['lost']} | "
                + (f"{vt.get('from_journal', 0)} | " if journal else "")
                + f"{vt['cut_off']} | {vt['unmarked']} | {vt['leaked']} |"
            )
        w(
            f"\nThe goal's rounds are the loop's own (`{loop_cell}`). Such a cell usually ends before its `running` "
            "row is written: the writer lets rows nobody waits on linger up to 20 ms (`LINGER_S`) to share a commit, "
            "and skips the row when the cell's end comes first, while the loop kills at most 20 ms after a send. So "
            "those kills hardly ever find a stored `running` row, and 'left running' is tested only vacuously there. "
            "The second variant changes only the poster (in the benchmark, not the loop): each cell sleeps and the "
            "loop is told of a request only some time after it was sent, so the kill lands inside a cell whose "
            "`running` row is stored; 'cut off' counts rows a later gateway stored `dead` with the reason 'the "
            "gateway stopped while this cell ran'. A request sent but not acknowledged (the kill came first) may or "
            "may not be in the history; only acknowledged ones count."
            + (
                " 'Written in from the journal' counts acknowledged cells whose row was not committed when the kill "
                "came: the next gateway wrote them in from the answer journal at its start."
                if journal
                else ""
            )
            + "\n"
        )
    return md


def _flood_cause(flood: dict[str, Any], ok: bool) -> str:
    fl, cpu = flood["flood"], flood.get("cpu_cores")
    parts = []
    if cpu:
        i, f = cpu["idle"], cpu["flood"]
        parts.append(
            f"CPU in cores (of {flood['machine']['cores']}), A idle-phase vs flood-phase: gateway process "
            f"{i['gateway']:.2f} vs {f['gateway']:.2f}, B's kernel {i.get('container:B', 0):.2f} vs "
            f"{f.get('container:B', 0):.2f}, A's kernel {i.get('container:A', 0):.2f} vs "
            f"{f.get('container:A', 0):.2f}, whole machine {i['machine']:.2f} vs {f['machine']:.2f}. "
        )
    if fl.get("stream_events"):
        parts.append(
            f"B's output reached the gateway as {fl['stream_events']} stream messages of "
            f"{fl['mean_event_bytes'] / 1e6:.1f} MB on average (max {fl['max_event_bytes'] / 1e6:.1f} MB: ipykernel "
            f"batches a tight print loop per flush interval). "
        )
    if not ok:
        parts.append(
            "A's cells never queue behind B's (each session has its own queue and fan-out), and the gateway is far "
            "from saturated on average; but it is one Python process with one event loop, and each multi-MB message "
            "is decoded, mapped to one event, re-encoded and written to B's socket in one piece (and queued for the "
            "history store). While that runs, A's few-byte events wait behind it, which shows in the tail more "
            "than in the median. Ways to close it: split "
            "large stream messages into bounded chunks before they are re-encoded, or move decoding/encoding of "
            "big payloads off the event loop. "
        )
    return "".join(parts)


POOL_WARM_UP = [
    "### The pool's warm-up cell (2026-11-26)\n",
    "The pool is on by default now (`pool_size` 2), and a pooled kernel runs a silent warm-up cell before "
    "hand-over (issue 15, item 0: create plus first result within 2x of a later `1+1`). Measured by hand with "
    "`bench_start.py --skip-llm-sandbox --n 6 --n-warm 20` (REST), twice in a row on the same machine (load "
    "average about 1), the second time with the warm-up turned off by hand; not part of `scripts/bench.sh`:\n",
    "| warm pool (n=20)                     | create + first 1+1, p50 | a later 1+1 on the same session, p50 | ratio |",
    "|--------------------------------------|------------------------:|-------------------------------------:|------:|",
    "| no warm-up (the tree before)         |                33.9 ms |                              14.1 ms | 2.40x |",
    "| silent warm-up cell (this tree)      |                22.3 ms |                              14.1 ms | 1.58x |",
    "",
    "In-process (ipykernel's InProcessKernelManager, no sockets) the first `run_cell` costs about 29 ms against "
    "0.7 ms later; after one silent cell that formats a result, about 1.5-2.4 ms. The warm-up leaves no trace: "
    "tests/integration/test_pool.py compares names, `In`, `Out`, `_` and IPython's counter with a cold kernel.\n",
]


def pool_section(d: Path, out: Path, pool: dict[str, Any] | None) -> list[str]:
    if not pool:
        return []
    rows = pool["rows"]
    lines = [
        "## The warm pool under sustained demand (bench_pool.py)\n",
        f"`benchmarks/bench_pool.py` ({_when(pool)}): a gateway with the default pool (`pool_size` 2) gets one "
        f"`POST /v1/sessions` every 1, 0.5 or 0.25 s ({pool['creates']} creates each; every session runs `1+1` and "
        "is deleted), with the workspace store on (the default) and off. A create the pool cannot serve is a cold "
        "start.\n",
        table(rows, None),
        "",
    ]
    lines += [f"- {r['name']}: {r['pool_hits']} of {r['creates']} served by the pool" for r in rows]
    lines += [
        f"\n![pool]({rel(d / 'pool.png', out)})\n",
        "- Goal (issue 15, item 0): with `pool_size` 2 and one create every 0.5 s, the pool keeps up (a held-out "
        "run got 4.3 ms at p50). These sessions write no file, so they never get a workspace store (it starts with "
        "a session's first file): store on and off cost the same here, and the rows differ by the machine's noise. "
        "One create every 0.5 s is near what two cores refill (a kernel start is about 0.7 s of mostly CPU work): "
        "p50 stays at a pool hit, the slowest few are cold starts. Of three runs on 2026-11-26 the gateway without "
        "a store got 40, 33 and 35 of 40 at 0.5 s; the first version of the store (started with every kernel) got "
        "25 of 40, which is why it now waits for a file. At 0.25 s the store's gateway is slower still (each "
        "session also creates and removes its two volumes).\n",
    ]
    return lines


def memory_section(d: Path, out: Path, memory: dict[str, Any] | None) -> list[str]:
    if not memory:
        return []
    results, verdicts = memory["results"], memory["verdicts"]
    names = list(results)
    keys = [k for k in results[names[0]] if k.endswith("_mb")]
    lines = [
        "## Memory around large outputs (bench_memory.py)\n",
        f"`benchmarks/bench_memory.py` ({_when(memory)}): one gateway, one session, one WebSocket client reading "
        "everything; the gateway's RSS every 20 ms. Five cells each print one 50 MB line (the idle baseline before, "
        "the peak, right after and 10 s later), then one cell prints 100 MB in flushed 1 MB prints (the peak growth "
        "over the RSS before it). Run with the output cap raised so that everything flows, and with the default "
        "cap (16 MiB: the rest of each output is cut and replaced by a `truncated` event).\n",
        "| MB | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for key in keys:
        lines.append(
            f"| {key.removesuffix('_mb').replace('_', ' ')} | " + " | ".join(str(results[n][key]) for n in names) + " |"
        )
    for n in names:
        v = verdicts[n]
        lines.append(
            f"\n- {n}: 10 s after the 5 x 50 MB, {results[n]['after_10s_over_idle_mb']:+} MB over idle (goal within "
            f"50 MB: {verdict(v['after_ok'])}); the 100 MB stream's peak growth {results[n]['big_peak_growth_mb']} MB "
            f"(goal under 100 MB: {verdict(v['peak_ok'])}; {results[n]['big_delivered_bytes']:,} bytes delivered)."
        )
    lines += [
        f"\n![memory]({rel(d / 'memory.png', out)})\n",
        "- Found and fixed on 2026-11-26: each session's kernel link remembered its last 64 ended cells whole (to "
        "report the kernel's late messages for them), output included, so up to 64 x the output cap stayed in "
        "memory per session: +529 MB over idle 10 s after 5 x 50 MB before the fix. A long cell's output-so-far "
        "row also queued a growing copy of all its events at every state poll; now at most one is queued and it is "
        "joined when written.\n",
        "- Found and fixed on 2026-11-27: what stayed after the outputs was not live. tracemalloc found 90 MB of "
        "Python objects in the whole gateway (38 MB of them imported modules); glibc's malloc kept what the "
        "output's messages, strings and events had used, and `malloc_trim(0)` in the gateway process gave it "
        "back (286 -> 161 MB, idle 131). The gateway now trims once a burst of kernel output (16 MiB or more) is "
        "over, and once more 3 s later, in a thread (`runtime/allocator.py`). An output event's model is let go "
        "once it is serialised (the text was held twice until the cell ended), and the Python kernel sends stream "
        "text in 256 Ki-character slices, so no single message is larger than that.\n",
        "- Since 2026-11-27 a cell's output is stored as it comes, in append-only chunks of about 256 KiB "
        "(`kgw_execution_chunks`), and a chunk's events are let go once it is committed: 10 s after the outputs the "
        "gateway is back within 10 MB of idle, with the cap at its default or raised. What remains of the 100 MB "
        "stream's peak with the cap raised is the chunks the history's writer has not committed yet (it falls "
        "behind a 50 MB/s stream on two cores) and the WebSocket's queues. A REST `/execute` keeps its cell's whole "
        "output (up to the cap) until it answers: the answer carries it.\n",
    ]
    return lines


def isolation_section(d: Path, out: Path, iso: dict[str, Any] | None) -> list[str]:
    if not iso:
        return []
    goal = iso["goal"]
    lines = [
        "## One session's flood and four bystanders (bench_isolation.py)\n",
        f"`benchmarks/bench_isolation.py` ({_when(iso)}): one gateway with its default settings (16 MiB output cap, "
        f"64 MiB largest message), {iso['bystanders']} bystander sessions each running a `1+1` every 100 ms over "
        "its own WebSocket, all at once, and one flooding session whose driver (another process, niced: it stands "
        "for a client elsewhere) runs flood cell after flood cell: a print loop at full speed (50 MB of lines per "
        "cell), 10,000 display messages per cell, and one 100 MB line per cell. A fifth bystander runs the same "
        "`1+1` straight to its kernel with jupyter_client: the floor, what the machine alone does to a `1+1` while "
        "the flood's kernel and client take their share. A quiet phase precedes every flood phase, over "
        f"{iso['rounds']} rounds ({iso['n_per_bystander_per_phase']} `1+1` per bystander per phase). Goal (issue 15): "
        f"the bystanders' p95 within {goal['p95_ratio']}x and p99 within {goal['p99_ratio']}x of the quiet phases'.\n",
        table(iso["rows"], None),
        "",
        table(iso["floor_rows"], None),
        "",
        "| flood | p95 / quiet | p99 / quiet | goal | floor p95 / quiet | floor p99 / quiet | flood cells |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for kind, v in iso["verdicts"].items():
        lines.append(
            f"| {kind} | {v['p95_ratio']:.2f}x | {v['p99_ratio']:.2f}x | {verdict(v['met'])} "
            f"| {v['floor_p95_ratio']:.2f}x | {v['floor_p99_ratio']:.2f}x | {v['flood']['executions']} |"
        )
    cores = iso.get("cpu_cores") or {}
    if cores:
        lines += ["", "Cores used on average in each phase (of 2):", ""]
        lines.append("| phase | gateway | flooding kernel | bystanders' kernels | machine |")
        lines.append("|---|---:|---:|---:|---:|")
        for phase, c in cores.items():
            kernels = [k for k in c if k.startswith("container:")]
            flood_k = kernels[-1] if kernels else None
            by = sum(c[k] for k in kernels[:-1])
            lines.append(
                f"| {phase} | {c.get('gateway', 0):.2f} | {c.get(flood_k, 0) if flood_k else 0:.2f} | {by:.2f} "
                f"| {c.get('machine', 0):.2f} |"
            )
    lines += [
        f"\n![isolation]({rel(d / 'isolation.png', out)})\n",
        "- What the gateway does about a flood (2026-11-27): the Python kernel sends stream text in slices of at most "
        "256 Ki characters; the gateway reads 64 messages or 256 KiB at a time and gives one session's output at "
        "most a quarter of the event loop once a 25 ms burst is spent, while another session's output is being read "
        "(`runtime/loop_share.py`; a Jupyter client's connection is charged to its session's share too); output past "
        "a cell's cap is checked but not decoded; the history's writer commits the small rows answers wait for "
        "before the rest of their batch, stores a cell's output in chunks of about 256 KiB as it comes (no "
        "transaction over about 512 KiB, and the answers queued meanwhile commit between two), and no longer "
        "checkpoints SQLite's WAL inside its commits. Measured inside the gateway during a print flood before the writer changes (quick runs, "
        "4 bystanders): the event loop's lag stayed at p95 1.0 ms, p99 4.7 ms, while a bystander's wait for its "
        "history commit reached p95 121 ms; after them, p95 17 ms.\n",
        "- What changed on 2026-11-27 (second session): a flood now waits for its reader. The Python kernel's iopub "
        "never drops and blocks past a 32-message queue, and a cell's `print` or `display` waits once that queue is "
        "full (`images/python/kernelgw_kernel/backpressure.py`); while another session has had output within the "
        "last second, the gateway reads a session's output at most at 2 MiB/s and 100 output messages/s after a "
        "one-second burst (`runtime/output_rate.py`; since that afternoon only streams and displays count as "
        "messages: a loop of small cells, four status, input and result messages each, was paced too). Before it, the flooding kernel took 0.78 (print) to 0.87 "
        "(display) of a core whatever the gateway did, and the floor itself went 2.17x and 9.39x at p95; the "
        "'flooding kernel' column above shows what it takes now. Alone, a session's output is read at full speed. "
        "Other runs the same hour: at 4 MiB/s and 100 messages/s print 1.24x/1.47x, display 1.14x/1.33x, line "
        "1.13x/1.23x (p95/p99 over quiet); at 4 MiB/s and 200 messages/s the display flood's kernel took 0.15 of "
        "a core and its bystanders' p95 was 1.28x.\n",
    ]
    return lines


def jupyter_section(d: Path, out: Path, jupyter: dict[str, Any] | None) -> list[str]:
    if not jupyter:
        return []
    rows = jupyter["rows"]
    v1, channels = row(rows, "kernelgw /v1"), row(rows, "kernelgw Jupyter")
    goal = jupyter.get("goal_ms", 1.0)
    lines = [
        "## Jupyter channels (bench_jupyter.py)\n",
        f"`benchmarks/bench_jupyter.py` ({_when(jupyter)}): `1+1` on one kernelgw session over raw jupyter_client "
        "to its kernel's sockets (floor), the /v1 WebSocket and the Jupyter channels WebSocket (JSON frames, until "
        f"the reply and the idle status); and a stock Jupyter Kernel Gateway {jupyter.get('kernel_gateway_version')} "
        "(no sandbox) in a container of the same kernel image on the host's network, its own kernel, the same "
        "client code; samples shuffled in rounds.\n",
        table(rows, rows[0]["name"]),
        f"\n![Jupyter channels]({rel(d / 'jupyter.png', out)})\n",
    ]
    if v1 and channels:
        delta = channels["p50_ms"] - v1["p50_ms"]
        lines.append(
            f"- Goal (issue 13): the channels within {goal:g} ms of the /v1 WebSocket at p50: {delta:+.2f} ms, "
            f"{verdict(delta <= goal)}."
        )
    lines.append(
        "- A stock Kernel Gateway's constant ~37 ms over the floor (measured 2026-11-26, p50 to p99 within 5 ms, "
        "with and without docker-proxy) is the signature of Nagle's algorithm meeting delayed ACKs on a socket that "
        "writes several small frames per answer; not investigated further, so read it as what a client of that "
        "server sees on this machine, not as the cost of its design.\n"
    )
    return lines


def e2b_section(d: Path, out: Path, e2b: dict[str, Any] | None) -> list[str]:
    if not e2b:
        return []
    rows = e2b["rows"]
    own, theirs = row(rows, "kernelgw SDK: create"), row(rows, "E2B SDK: Sandbox.create")
    own_warm, their_warm = row(rows, "kernelgw SDK: warm"), row(rows, "E2B SDK: warm")
    start_rows = [r for r in (own, theirs) if r]
    warm_rows = [r for r in (own_warm, their_warm) if r]
    lines = [
        "## E2B's SDK on kernelgw (bench_e2b.py)\n",
        f"`benchmarks/bench_e2b.py` ({_when(e2b)}): E2B's `e2b-code-interpreter` {e2b.get('sdk_version', '?')} "
        "through the `/e2b` face against kernelgw's own Python SDK on the same gateway and kernels "
        f"(pool_size {e2b.get('pool_size')}, the pool refilled before each create), {e2b.get('rounds')} rounds of "
        "shuffled steps.\n",
        table(start_rows, start_rows[0]["name"] if start_rows else None),
        "",
        table(warm_rows, warm_rows[0]["name"] if warm_rows else None),
    ]
    bundle_rows = [r for r in rows if "code-interpreter image" in r["name"]]
    js_rows = sorted((r for r in rows if "JavaScript" in r["name"]), key=lambda r: "floor" not in r["name"])
    if own and bundle_rows:
        lines += [
            "",
            f"The rows above create from `base` (the Python image). On the code-interpreter image "
            f"(`{e2b.get('code_interpreter_image')}`, every language of E2B's code interpreter, which an unmapped "
            "`code-interpreter-v1` runs where the engine has it), from a pool of that image, and its first JavaScript "
            "cell (the Deno context starts then) against the next one:\n",
            table([own, *bundle_rows], own["name"]),
            "",
            table(js_rows, js_rows[0]["name"] if js_rows else None),
        ]
    lines.append(f"\n![E2B's SDK on kernelgw]({rel(d / 'e2b.png', out)})\n")
    if own and theirs and own.get("p50_ms") and theirs.get("p50_ms"):
        ratio = theirs["p50_ms"] / own["p50_ms"]
        lines.append(
            "- Goal (issue 29): on a warm pool, E2B's create + first `run_code` within 2x of kernelgw's own path: "
            f"{ratio:.2f}x at p50, {verdict(ratio <= 2.0)}. Where the difference goes (the E2B path makes two "
            "requests, create then a streamed `/execute`, through a bigger SDK) was not broken down."
        )
        lines.append(
            "- E2B states 80-200 ms for its cloud's sandbox start (their figure, not measured here); the whole "
            f"create + first `run_code` here took {theirs['p50_ms']:.0f} ms at p50 and {theirs['p99_ms']:.0f} ms at "
            "p99, on one machine with no network between client and sandbox host, which E2B's cloud always has."
        )
    if own_warm and their_warm and own_warm.get("p50_ms") and their_warm.get("p50_ms"):
        lines.append(
            f"- Warm `run_code` against kernelgw's own execute on a running session: "
            f"{their_warm['p50_ms'] / own_warm['p50_ms']:.2f}x at p50.\n"
        )
    return lines


def languages_section(d: Path, out: Path, lang: dict[str, Any] | None) -> list[str]:
    if not lang:
        return []
    rows = lang["rows"]
    kinds = (("create (cold)", "create"), ("first cell", "first cell"), ("warm cell", "warm cell"))
    lines = [
        "## Languages (bench_languages.py)\n",
        f"`benchmarks/bench_languages.py` ({_when(lang)}): one gateway offers every kernel; per kernel "
        f"{lang['rounds']} sessions, each created cold (no pool), then its first trivial cell and "
        f"{lang['warm']} more (`1+1`, `echo $((1+1))` in Bash; in Go and C++ a whole program compiled and run), "
        "and the kernel container's memory after them (working set). Python is the floor."
        + (" **A `--quick` run: few samples per kernel, percentiles are rough.**" if lang.get("quick") else "")
        + "\n",
        "| kernel | image MB (+ on Python's) | idle kernel MB | create p50 ms | first cell p50 ms | warm cell p50 ms "
        "| warm p95 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    by_kernel: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        for suffix, key in kinds:
            if r["name"].endswith(suffix):
                by_kernel.setdefault(r["kernel"], {})[key] = r
    for kernel, got in by_kernel.items():
        c, f, w_ = got["create"], got["first cell"], got["warm cell"]
        lines.append(
            f"| `{kernel}` | {c['image_mb']} (+{c['adds_mb']}) | {c['memory_mb']} | {c['p50_ms']:.0f} | "
            f"{f['p50_ms']:.1f} | {w_['p50_ms']:.1f} | {w_['p95_ms']:.1f} |"
        )
    lines += [
        f"\n![languages]({rel(d / 'languages.png', out)})\n",
        "- Every image is built on the Python image, so the layers are shared: a language costs what it adds. "
        "Go's and C++'s warm cells are a compile and a run each (their kernels keep no state); the others "
        "evaluate in a running interpreter. Deno and Java reach the gateway through the shim's TCP relay, the "
        "others through its ipc relay; Python has no shim.\n",
        "- Python's warm `1+1` over REST was about 12-14 ms at p50 on this machine on 2026-11-26 at both this "
        "tree and the round's start (7630f8a, run by hand the same hour, in-process gateway), against 5.3 ms in "
        "the security benchmark's earlier run: the machine, not the languages work. Its p95 is the first cells of "
        "a new gateway's first session (100-300 ms each for about ten cells, at both commits; not investigated "
        "yet).\n",
        "- Cold starts of R (IRkernel loads its packages) and Java (a JVM, with a class-data archive made at build "
        "time) are the slow ones; Deno starts faster than ipykernel. Java's warm cell is JShell compiling the "
        "snippet; Go and C++ compile with their caches prepared at build time (Go's standard library without cgo; "
        "C++'s precompiled headers for `<iostream>` and `<bits/stdc++.h>`).\n",
    ]
    interrupts = [r for r in rows if r["name"].endswith(": interrupt")]
    if interrupts:
        lines += [
            "### Interrupt\n",
            "In each session, after its trivial cells, an endless cell that prints `looping` first is interrupted "
            "(`POST .../interrupt`) once that line reached a WebSocket watcher: the time from the interrupt to the "
            "cell's answer (`interrupted`).\n",
            table(interrupts, "python3: interrupt", "Python"),
            "",
        ]
    lines += languages_oom(lang)
    return lines


def languages_oom(lang: dict[str, Any]) -> list[str]:
    """The out-of-memory rows of bench_languages (``<kernel>: memory bomb`` and
    ``<kernel>: after the bomb``): two tables against Python's, how each bomb ended,
    and every kernel that did not come back by itself, named."""
    rows = lang["rows"]
    bombs = [r for r in rows if r["name"].endswith(": memory bomb")]
    after = [r for r in rows if ": after the bomb" in r["name"]]
    if not bombs:
        return []
    after_floor = next((r["name"] for r in after if r.get("kernel") == "python3"), None)
    lines = [
        "### Out of memory\n",
        f"Per round, a session of its own (`memory_mb` {lang.get('bomb_memory_mb')}, `auto_replay`: the session "
        "restarts a kernel that died under a cell by itself; without it the session stays `dead` until "
        "`POST .../restart`) runs the memory bomb of the promise suite (`tests/support/language_cells.py`), then a "
        "cell that prints `said`. The bomb's time runs from the request to its `done`; with `auto_replay` the "
        "gateway restarts the kernel before it answers, so a restart is in it (the engine's out-of-memory event "
        "splits it below). Recovery is from that `done` to the next cell's `ok`.\n",
        table(bombs, "python3: memory bomb", "Python"),
        "",
        table(after, after_floor, "Python"),
        "",
        "| kernel | how the bomb's cell ended | engine's out-of-memory kill, p50 ms after the request "
        "| kill to the cell's end, p50 ms |",
        "|---|---|---|---|",
    ]
    for r in bombs:
        killed = r.get("killed_p50_ms")
        to_end = f"{r['p50_ms'] - killed:.0f}" if killed is not None and r.get("n") else ""
        kill_text = "no out-of-memory event" if killed is None else f"{killed:.0f}"
        lines.append(f"| `{r['kernel']}` | {r.get('outcome') or 'did not end'} | {kill_text} | {to_end} |")
    stuck = [r for r in after if not r.get("n") or "did not recover" in r["name"]]
    lines.append("")
    if stuck:
        for r in stuck:
            why = r.get("error") or "; ".join(r.get("not_recovered") or [])
            lines.append(f"- **`{r['kernel']}` did not recover by itself**: {why}")
    else:
        lines.append("- Every kernel's session ran the next cell by itself after its memory bomb.")
    kept = [f"`{r['kernel']}` ({r['outcome']})" for r in bombs if (r.get("outcome") or "").startswith("error")]
    if kept:
        lines.append(
            "- A bomb's cell that ended `error` did not lose its kernel: " + ", ".join(kept) + ". `state kept`: the "
            "language caught it (its interpreter lives on); `no state`: a whole program per cell, that program died."
        )
    lines.append("")
    return lines


def workers_section(d: Path, out: Path, workers: dict[str, Any] | None) -> list[str]:
    if not workers:
        return []
    rows = workers["rows"]
    args = workers.get("args", {})
    cores = (workers.get("machine") or {}).get("cores")
    lines = [
        "## Every core: worker processes (bench_workers.py)\n",
        f"`benchmarks/bench_workers.py` ({_when(workers)}): one gateway started as `kernelgw serve --workers N` "
        f"(no pool, SQLite) on this {cores}-core machine; {args.get('sessions')} sessions, each driven back to back "
        "by its own client, half over REST (the keep-alive connection that created the session, so it reaches the "
        "owner) and half over the /v1 WebSocket (a connection of its own, which lands on any worker and is relayed "
        f"by the sibling when that is not the owner), {args.get('seconds')} s per cell and configuration over "
        f"{args.get('rounds', 1)} gateway starts each, alternated ABBA. CPU is what each part used "
        "during the run, per execution and in cores (the gateway: the supervisor and its workers, from /proc; the "
        "kernels: their containers' cgroups; the client: this benchmark's process).\n",
    ]
    from bench_workers import summary_lines  # the table bench_workers.py prints

    lines += summary_lines(rows)
    lines += [
        "",
        f"![workers]({rel(d / 'workers.png', out)})\n",
        "- A worker is a whole gateway: a second one helps when the gateway's own process is the bottleneck (one "
        "core busy decoding and relaying), not when the kernels or other work already take the cores. On a "
        "2-core machine the kernels, the client and the gateway share the same two cores, so the ceiling is low; "
        "the gateway-cores column shows how far one process was from a full core. Sessions spread over the workers "
        "by connection (SO_REUSEPORT hashing), not by load; a WebSocket or REST connection that lands on a "
        "non-owner costs a relay hop (CPU on both workers).\n",
    ]
    singles = [r for r in rows if r["workers"] == 1]
    many = [r for r in rows if r["workers"] > 1]
    if singles and many and all("gateway_cpu_ms_per_exec" in r for r in rows):
        by_cell = {r["cell"]: r for r in singles}
        ratios = ", ".join(f"{r['per_s'] / by_cell[r['cell']]['per_s']:.2f}x ({r['cell']})" for r in many)
        extra = [r["gateway_cpu_ms_per_exec"] - by_cell[r["cell"]]["gateway_cpu_ms_per_exec"] for r in many]
        lines.append(
            f"- This run: one worker used at most {max(r['gateway_cores'] for r in singles):.2f} of a core, so the "
            f"gateway was not what limited throughput; {many[0]['workers']} workers gave {ratios} of one worker's "
            f"executions per second and spent {min(extra):+.2f} to {max(extra):+.2f} ms of gateway CPU per "
            "execution (not broken down here; the candidates are the relays of WebSocket connections that landed on a "
            "non-owner and each process's own heartbeats and timers).\n"
        )
    one = next((r for r in rows if r["workers"] == 1 and r["cell"] == "1+1"), None)
    if one and one.get("gateway_cpu_ms_per_exec") and one.get("kernel_cpu_ms_per_exec"):
        g, k = one["gateway_cpu_ms_per_exec"], one["kernel_cpu_ms_per_exec"]
        lines.append(
            f"- Arithmetic from the 1-worker `1+1` row, not a measurement: the gateway spent {g:.2f} ms of CPU per "
            f"execution, so one gateway process tops out near {1000 / g:.0f} executions per second however many "
            f"cores the host has; the kernels spent {k:.2f} ms each, which {cores} cores serve up to about "
            f"{(cores or 1) * 1000 / k:.0f} per second. On a host with many cores the kernels' ceiling rises with "
            "the cores and the single process's does not: that is what the workers lift.\n"
        )
    return lines


PEER_NOTES = {
    "kernelgw": "the reference: a gateway with its defaults (warm pool of 2), sessions over /v1 (REST create, "
    "cells over the session's WebSocket). Its container starts as root with every capability dropped but the "
    "four `setpriv` needs, and `setpriv` drops to uid 61000 with an empty bounding set before the kernel runs "
    "(the table's last word on capabilities is the kernel process's own).",
    "stock Kernel Gateway": "the floor for a Jupyter-based service: `jupyter kernelgateway` in one container "
    "started once (its start is not in the numbers: a session is a kernel on it), host network, nothing else "
    "set. Round trips of ~40-50 ms in its tail are the Nagle/delayed-ACK signature that bench_jupyter saw on "
    "every one of its round trips (a constant ~37 ms there); this client sets TCP_NODELAY, the server's side "
    "does not, and here only some round trips pay it.",
    "AutoGen DockerJupyterCodeExecutor": "a DockerJupyterServer (a Kernel Gateway container, one per executor, "
    "as its docs show) with `custom_image_name`, and the executor on it. Its server waits for the container to "
    "be running, not for the gateway in it to listen, so the executor's first request can meet a reset "
    "connection: the adapter retries and counts these ({retries} in this run's starts). Outputs come back as "
    "one string (stdout and values joined) plus PNG files; an error only as text (`ERROR: KeyError: ...`), its "
    "name parsed from it.",
    "smolagents DockerExecutor": "what `CodeAgent(executor_type='docker')` makes: a Kernel Gateway container "
    "per executor (`image_name`, `build_new_image=False`), a new WebSocket per run. It keeps stdout, the "
    "result's text/plain and errors; it drops display_data, so a chart cannot come back.",
    "llm-sandbox": "ArtifactSandboxSession (stateless: each run is a new `python` in the same container; plots "
    "captured from `plt.show()`), set up as in bench_start/bench_exec (`skip_environment_setup`, kernelgw's "
    "limits as runtime_configs). Its plot capture prints `Python plot detection setup complete` into every "
    "run's output; the adapter removes that line before the checks.",
    "llm-sandbox interactive": "InteractiveSandboxSession (an IPython runner, stateful), its venv path linked to "
    "/opt/kernel (its own setup cannot run offline). It returns text only: a figure has to be saved and copied "
    "out, and the last expression's value does not come back.",
}


def peers_section(d: Path, out: Path, peers: dict[str, Any] | None) -> list[str]:
    if not peers:
        return []
    names = list(peers["peers"])
    lines = [
        "## Peers (bench_peers.py)\n",
        f"`benchmarks/bench_peers.py` ({_when(peers)}): kernelgw and the systems a user would pick instead, "
        "each from its PyPI package, all on this machine in one run and on the same kernel image "
        f"(`{peers['machine'].get('image')}`; the Kernel-Gateway-based peers on `{peers['peer_image']}`, built "
        "offline on top of it: jupyter_kernel_gateway "
        f"{peers['kernel_gateway_version']} added). Peers are interleaved in rounds, each round in a rotated "
        f"order; {peers['args']['n_start']} starts and {peers['args']['n_warm']} warm runs per peer. Run it with "
        "the peers' venv: `PY=$(bash scripts/ensure-peers.sh) && $PY benchmarks/bench_peers.py`.\n",
        "Start to first `1+1` (open a session the way the peer's users do, run `1+1`, time to the answer; "
        "then close, not timed):\n",
        table(peers["first"], "kernelgw", "kernelgw"),
        "\nWarm `1+1` on an open session (a script-based peer prints it: `print(1+1)`):\n",
        table(peers["warm"], "kernelgw", "kernelgw"),
        f"\n![peers]({rel(d / 'peers.png', out)})\n",
        "A 10-turn data-analysis trace in one session per peer (benchmarks/peers/trace.py), turn by turn across "
        "peers; every turn's output is checked (the exact text; a PNG by its signature; the 1 MB print by its "
        "length; the error by its name). Turns 5-7 need nothing from earlier turns; the others use turn 1's "
        "DataFrame. ms per turn, ✗ = wrong or missing (reasons below):\n",
        "| turn | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    trace = peers["trace"]
    for i, t in enumerate(peers["trace_turns"]):
        cells = []
        for n in names:
            got = trace.get(n)
            if not got:
                cells.append("not run")
                continue
            r = got[i]
            cells.append(f"{'✓' if r['ok'] else '✗'} {r['ms']:,.0f}")
        lines.append(f"| {t['turn']}. {t['title']} | " + " | ".join(cells) + " |")
    totals = []
    for n in names:
        got = trace.get(n) or []
        totals.append(f"**{sum(r['ok'] for r in got)}/{len(got)}**, {sum(r['ms'] for r in got):,.0f} ms")
    lines.append("| right, time in all | " + " | ".join(totals) + " |")
    mem = peers.get("memory_mib") or {}
    if mem:
        cells = [f"{mem[n]:,.0f}" if mem.get(n) is not None else "" for n in names]
        lines.append("| its container(s) after the trace, MiB (working set) | " + " | ".join(cells) + " |")
    lines.append("")
    for n in names:
        for r in trace.get(n) or []:
            if not r["ok"]:
                lines.append(f"- {n}, turn {r['turn']} ({r['title']}): {r['reason']}")
    for n, why in (peers.get("open_failures") or {}).items():
        lines.append(f"- {n}: could not open a session for the warm runs and the trace: {why}")
    cols = ("network", "memory", "cpus", "pids", "read-only root", "code runs as", "capabilities", "no-new-privs")
    lines += [
        "\nThe limits each peer's container ran under (read with `docker inspect` while it ran):\n",
        "| peer | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for n, rows in peers["limits"].items():
        for r in rows:
            lines.append(f"| {n} | " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    lines.append("\nHow each peer was set up (versions from this run):\n")
    retries = sum(r.get("start_retries", 0) for r in peers["first"] if r["name"].startswith("AutoGen"))
    for n in names:
        info = peers["peers"][n]
        note = PEER_NOTES.get(n, "").format(retries=retries)
        lines.append(f"- **{n}** ({info.get('version')}): {note}")
    lines.append(
        "\n- The Kernel-Gateway-based peers run on Docker's defaults (no memory, CPU or pids limit, a writable "
        "root, Docker's default capabilities, the bridge network or the host's: code in them can reach the "
        "network). Their code runs as uid 61000 here only because the peer image inherits our image's USER: "
        "smolagents' own image (python:3.12-bullseye) runs it as root, AutoGen's (docker-stacks) as uid 1000. "
        "Adding limits is left to their users; llm-sandbox applies what it is given (here kernelgw's network, "
        "memory, CPU and pids limits) but runs the code as root with a writable root file system.\n"
        "- Memory after the trace: kernelgw's row is the session's kernel container alone (the gateway is one "
        "host process shared by all sessions); the Kernel-Gateway-based peers' containers hold a Kernel Gateway "
        "server and one kernel each (the stock one serves every session from one container); llm-sandbox's "
        "hold its runner (interactive) or only `sleep` between runs (stateless: each run's python exits).\n"
        "- Not compared: isolation itself (the table says what is applied, not what it "
        "is worth). The warm `1+1` of every Jupyter-based peer here goes through this script's own synchronous "
        "client (TCP_NODELAY set), kernelgw's too, so they are comparable with each other, not with the "
        "asyncio clients of the other sections.\n"
    )
    return lines


def e2b_envd_section(d: Path, out: Path, envd: dict[str, Any] | None) -> list[str]:
    if not envd:
        return []
    rows = envd["rows"]
    floor_exec, command = row(rows, "engine: docker exec"), row(rows, "E2B SDK: commands.run")
    floor_files, files = row(rows, "kernelgw SDK: 10 MiB"), row(rows, "E2B SDK: files.write")
    command_rows = [r for r in (floor_exec, command) if r]
    file_rows = [r for r in (floor_files, files) if r]
    lines = [
        "## E2B's envd on kernelgw: commands and files (bench_e2b_envd.py)\n",
        f"`benchmarks/bench_e2b_envd.py` ({_when(envd)}): E2B's `e2b` {envd.get('sdk_version', '?')} through the "
        "`/e2b` face, each row beside its floor on the same gateway and container, "
        f"{envd.get('rounds')} rounds of shuffled steps.\n",
        table(command_rows, command_rows[0]["name"] if command_rows else None),
        "",
        table(file_rows, file_rows[0]["name"] if file_rows else None),
        f"\n![E2B's envd on kernelgw]({rel(d / 'e2b_envd.png', out)})\n",
    ]
    if floor_exec and command and floor_exec.get("p50_ms"):
        lines.append(
            f'- `commands.run("true")`: {command["p50_ms"] / floor_exec["p50_ms"]:.2f}x the engine\'s own exec of '
            "`true` in the same container at p50: what the gateway, the Connect stream and the SDK add to an exec "
            "that any command here pays."
        )
    if floor_files and files and floor_files.get("p50_ms"):
        lines.append(
            f"- A 10 MiB file written and read back through `sandbox.files`: "
            f"{files['p50_ms'] / floor_files['p50_ms']:.2f}x the same bytes through kernelgw's own files API at p50.\n"
        )
    return lines


def continuity_section(d: Path, out: Path, cont: dict[str, Any] | None) -> list[str]:
    if not cont:
        return []
    life, replay, fork = cont["lifecycle"], cont["replay"], cont["fork"]
    first, alone = row(replay, "20 cells, first run"), row(replay, "replay alone")
    lines = [
        "## Session continuity (bench_continuity.py)\n",
        f"`benchmarks/bench_continuity.py` ({_when(cont)}), gateways without a pool (cold starts). What keeping a "
        "session's files across its kernels costs (`persistent_workspace`: a store container and two tmpfs "
        "volumes per session, started beside the kernel), interleaved in rounds with a gateway that keeps them in "
        "the kernel's container; then a "
        f"{cont['analysis_cells']}-cell pandas analysis of an uploaded {cont['csv_bytes'] / 2**20:.1f} MB CSV "
        '(read, clean, group, join, a least-squares fit), restarted with `{"replay": true}`, and forked '
        '(`{"from": id}`) with more files in its workspace each time; last, pause and resume of a session '
        "holding nothing and of one holding a 100 MiB DataFrame.\n",
        table(life, life[0]["name"], "off"),
        "",
        table(replay, replay[0]["name"], "first run"),
        "",
        table(fork, None),
        f"\n![session continuity]({rel(d / 'continuity.png', out)})\n",
    ]
    lines.append(
        "- With the store on, a session's store starts with its first file (here the lifecycle's cell writes one): "
        "`create` never waits for it; the `restart` row does, because it comes right after that first cell, and a "
        "fork's copy includes starting the new session's store.\n"
    )
    if first and alone:
        lines.append(
            f"- A replay runs the cells at {alone['p50_ms'] / first['p50_ms']:.2f}x their first run; the restart "
            "around it (a new container and kernel) is most of the rest of the request."
        )
    replays = [r for r in fork if r["name"].endswith(": replay") and r.get("n")]
    copies = [r for r in fork if r["name"].endswith(": copy") and r.get("n")]
    if replays and copies:
        lines.append(
            "- A fork is a cold session start, a copy (tar in each container, streamed through the gateway) and "
            f"the replay. The copy grows with the files: {copies[-1]['name'].split(':')[0][6:]} took "
            f"{copies[-1]['p50_ms']:.0f} ms at p50. The replay is the same cells each time: "
            f"{min(r['p50_ms'] for r in replays):.0f} to {max(r['p50_ms'] for r in replays):.0f} ms at p50 "
            "across the sizes (more files in the session is more of its memory in tmpfs pages)."
        )
    pause = cont.get("pause") or []
    if pause:
        lines += ["", table(pause, None), ""]
        p0, r0 = row(pause, "pause, an empty"), row(pause, "resume, an empty")
        p1, r1 = row(pause, "pause, a 100 MB"), row(pause, "resume, a 100 MB")
        if p0 and r0 and p1 and r1:
            per_pause = (p1["p50_ms"] - p0["p50_ms"]) / 1000
            per_resume = (r1["p50_ms"] - r0["p50_ms"]) / 1000
            lines.append(
                f"- Pause costs {p0['p50_ms'] / 1000:.2f} s plus about {per_pause:.2f} s per 100 MB of variables "
                f"(about {per_pause * 10.24:.0f} s per GiB), resume {r0['p50_ms'] / 1000:.2f} s (a cold kernel "
                f"start is most of it) plus about {per_resume:.2f} s per 100 MB, at p50. E2B publishes about 4 s "
                "per GiB to pause and about 1 s to resume, for a memory snapshot of the whole sandbox; kernelgw "
                "pickles the variables in the kernel and moves them through the gateway's disk, so it pays per "
                "byte of state twice (pickle and tar), and only what pickles comes back without a replay."
            )
    lines += [
        "- A fork rebuilds state by replay instead of restoring memory, so it costs what the cells cost, "
        "whatever the size of the state.\n",
    ]
    return lines


SLOW_TURN_MS = 50
"""A turn more than this over the floor at p50 is named in the agent section."""


def agent_overhead(agent: dict[str, Any]) -> str:
    """What kernelgw adds per turn of the agent trace, from the per-turn p50s."""
    per_turn = agent["per_turn"]
    floor = next((n for n in per_turn if "floor" in n), None)
    ours = next((n for n in per_turn if n.startswith("kernelgw")), None)
    if floor is None or ours is None:
        return ""
    extra = {
        t["name"]: per_turn[ours][t["name"]]["p50_ms"] - per_turn[floor][t["name"]]["p50_ms"] for t in agent["turns"]
    }
    slow = {name: ms for name, ms in extra.items() if ms > SLOW_TURN_MS}
    usual = [ms for name, ms in extra.items() if name not in slow] or [0.0]
    text = (
        "The trace is dominated by the turns' own work (generating the CSV, the plot). "
        f"kernelgw adds {min(usual):+.0f} to {max(usual):+.0f} ms per turn at p50 over the floor"
        + (" except " + ", ".join(f"{name} ({ms:+.0f} ms)" for name, ms in slow.items()) if slow else "")
        + "."
    )
    after_first_file = agent["turns"][1]["name"] if len(agent["turns"]) > 1 else None  # the first turn writes the CSV
    if after_first_file in slow:
        text += (
            f" The {after_first_file} turn is the first cell after the session's first file (the CSV): before it "
            "runs, the session's "
            "workspace store starts, the small container that keeps /workspace and the installed packages past "
            "the kernel's container (`persistent_workspace`, on by default), so that a kernel killed in the next "
            "cell cannot take the files with it. It is started once per session, on its first file, and costs a "
            "container start on this machine; a session that never writes a file never pays it. The store starts "
            "right after the cell's `done`, so an agent that thinks between turns (a model call takes seconds) "
            "does not wait for it; this trace sends its turns back to back."
        )
    return text


def filled_lines(replay_full: dict[str, Any]) -> int:
    """Lines each session printed to fill its replay buffer (one event per line
    before the gateway merged lines that arrive together)."""
    return int(replay_full.get("lines_per_session", replay_full["events_per_session"]))


def machine_of(result: dict[str, Any]) -> dict[str, Any]:
    """What a script's results say of the machine (bench_core keeps it under
    ``machine_info``, with a one-line ``machine``)."""
    m = result["machine"]
    return m if isinstance(m, dict) else result.get("machine_info", {})


def provenance(result: dict[str, Any]) -> tuple[str, str, str]:
    """(script, date, kernelgw commit) of one script's results."""
    name = str(result.get("benchmark", "core")).removeprefix("bench_")
    commit = machine_of(result).get("kernelgw_commit") or "an unknown commit"
    return name, str(result["date"])[:16].replace("T", " "), str(commit)


def hours_between(first: str, last: str) -> float:
    return (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds() / 3600


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=DOCS_BENCH, help="where the JSON results and charts are")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    args = ap.parse_args()
    d, out = args.dir, args.out
    core, start, exec_, scale, flood, agent = (load(d, n) for n in ("core", "start", "exec", "scale", "flood", "agent"))
    present = [x for x in (start, exec_, scale, flood, agent, core) if x]
    if not present:
        sys.exit(f"no results in {d}")
    m = machine_of(present[0])
    dates = sorted([x["date"] for x in present] + [x["finished"] for x in present if x.get("finished")])
    llmsb = next((x.get("llm_sandbox_version") for x in present if x.get("llm_sandbox_version")), None)
    quick = any(x.get("args", {}).get("quick") for x in present)

    md: list[str] = []
    w = md.append
    w("# Benchmarks\n")
    runs = [provenance(x) for x in present]
    one_run = len({commit for _, _, commit in runs}) == 1 and hours_between(dates[0], dates[-1]) < 3
    if one_run:
        w(
            f"Measured {dates[0][:16].replace('T', ' ')} to {dates[-1][:16].replace('T', ' ')} UTC, all in one run "
            f"of `scripts/bench.sh{' --quick' if quick else ''}` on one machine:\n"
        )
    else:
        each = "; ".join(f"{name} {when} UTC at {commit}" for name, when, commit in sorted(runs, key=lambda r: r[1]))
        w(
            f"Measured {dates[0][:16].replace('T', ' ')} to {dates[-1][:16].replace('T', ' ')} UTC on one machine by "
            "the scripts of `scripts/bench.sh`, not all in one run: each script's results were refreshed when the "
            f"code it measures changed. The sections up to Findings come from {each}; the later sections give "
            "their own date and commit.\n"
        )
    w(
        f"- machine: {m.get('cores')} cores ({m.get('cpu')}), {m.get('ram_gib')} GiB RAM, {m.get('os')}, "
        f"Linux kernel {m.get('kernel')}"
    )
    w(
        f"- Docker {m.get('docker_version')}, runtime {m.get('docker_runtime')}, cgroup v{m.get('cgroup_version')}, "
        f"{m.get('storage_driver')}"
    )
    w(
        f"- image `{m.get('image')}` ({m.get('image_id')}, {m.get('image_size_mb')} MB), Python {m.get('python')} "
        f"on the host"
    )
    if one_run:
        commit = m.get("kernelgw_commit")
        dirty = m.get("kernelgw_uncommitted") or []
        w(
            f"- kernelgw at commit {commit}"
            + (f" plus uncommitted changes in {', '.join(f'`{p}`' for p in dirty)}" if dirty else "")
        )
    w(f"- llm-sandbox {llmsb} from PyPI (the `bench` extra), Docker backend, the same image\n")
    if quick:
        w("**This is a `--quick` run: small n, percentiles are rough.**\n")
    busy = []
    for x in present:
        for when in ("activity_start", "activity_end"):
            a = (x["machine"].get(when) if isinstance(x["machine"], dict) else None) or x.get(when) or {}
            if a.get("pytest_processes") or a.get("other_containers"):
                busy.append(
                    f"{x.get('benchmark', 'core')} ({when[9:]}: {a.get('pytest_processes')} pytest "
                    f"processes, {a.get('other_containers')} other containers)"
                )
    if busy:
        w(
            "**Other work ran on the machine during part of this run** (numbers of those scripts are less "
            "reliable): " + "; ".join(busy) + ".\n"
        )
    w(
        "Every script starts its own gateway (`python -m kernelgw serve`, a separate process, as in production) "
        "and removes everything it started. Rows that are compared with each other were measured interleaved "
        "(in rounds, or sample by sample) so that drift in the machine's load hits them alike. p50/p95/p99 are "
        "linear-interpolated percentiles; with n below 100, p99 is close to the maximum. The 'floor' is the fastest "
        "way to get the same result without kernelgw: raw `jupyter_client` on the same kernel's sockets. Reproduce "
        "with `scripts/bench.sh` (about 25 minutes, 10 of them the kill -9 rounds; `--quick` for a smoke run); each script also runs alone "
        "(`.venv/bin/python benchmarks/bench_X.py --help`).\n"
    )

    w("## Targets\n")
    tl, why = targets(start, exec_, scale, flood, core)
    md.extend(tl)
    w("")
    for p in why:
        w(p + "\n")

    findings = _findings(flood, scale, load(d, "probe_iopub_hwm"))
    if findings:
        w("## Findings for the gateway (found while benchmarking)\n")
        for f_ in findings:
            w(f"- {f_}")
        w("")

    reattach, ack, crash = (load(d, n) for n in ("reattach", "ack", "crash"))
    if reattach or ack or crash:
        md.extend(durability(d, out, reattach, ack, crash))

    if start:
        w("## Session start\n")
        w(
            f"`benchmarks/bench_start.py`. Time until a sandbox can run code, then until the first `1+1` result. "
            f"Reference row (ratio column): `{start['reference']}`, the one-container-per-snippet pattern of most "
            f"tutorials, which pays this on every snippet. kernelgw rows are `POST /v1/sessions` (and a blocking "
            f"`POST .../execute`); the warm pool is `KERNELGW_POOL_SIZE={start['pool']['size']}`.\n"
        )
        w(table(start["rows"], start["reference"], "ref"))
        w(f"\n![session start]({rel(d / 'start.png', out)})\n")
        w("Teardown (not part of the start):\n")
        w(table(start["teardown"], None))
        w("")
        for note in start.get("llm_sandbox_default_setup", []):
            w(f"- {note['name']}: {note['ms'] / 1000:.1f} s, {note['outcome']}")
        w("")
        w(
            "llm-sandbox 'open' returns once its container runs (no interpreter is started until `run`); "
            "kernelgw's create returns once the kernel has answered `kernel_info`, so 'open + first run' is the "
            "comparable pair.\n"
        )
        md.extend(POOL_WARM_UP)

    if exec_:
        w("## Execute round trip\n")
        w(
            "`benchmarks/bench_exec.py`. One session each, started beforehand; each timing ends when the caller "
            "holds the whole result. kernelgw rows and the floor alternate sample by sample; the llm-sandbox rows "
            "run in the same rounds. Code: "
            + "; ".join(f"{k}: `{v['kernel'].splitlines()[-1]}`" for k, v in exec_["code"].items())
            + " (the PNG cell draws a 6x4 in line chart at 100 dpi).\n"
        )
        for wl, rows in exec_["tables"].items():
            size = rows[1].get("output_bytes") or 0
            w(f"**{wl}**" + (f" (output on the client: about {size:,} bytes)\n" if size > 100 else "\n"))
            w(table(rows, exec_["floor"]))
            w("")
        w(f"![execute round trip]({rel(d / 'exec.png', out)})\n")
        w(
            "- llm-sandbox `run` writes the code to a file in the container (a `docker exec mkdir` plus an archive "
            "upload) and runs `python file.py` with `docker exec`: a new interpreter per call, and nothing survives "
            "between calls but files. Its PNG row uses `ArtifactSandboxSession` (which wraps `plt.show()` to save "
            "figures and reads them back) with `clear_plots=True`.\n"
            "- llm-sandbox interactive `run` copies a command file into the container and polls for the result "
            "file with `docker exec test -f` every 0.1 s (its runner polls its command directory at the same "
            "interval), then copies the result out: the polling sets its floor. Its PNG is saved to a file and "
            "copied out with `copy_from_runtime`.\n"
        )

    if agent:
        w("## A data-analysis agent trace (10 turns)\n")
        w(
            f"`benchmarks/bench_agent.py`, {agent['reps']} repetitions, systems interleaved. Turns: "
            + ", ".join(t["name"] for t in agent["turns"])
            + ". Stateful systems send each turn's code once; the stateless llm-sandbox `run` must re-import pandas and "
            "re-build what earlier turns made (load, clean, aggregate, pivot) in every turn. Every system ends with "
            f"the same summary line: `{agent['final_summary']}`. kernelgw's start is a cold container (no pool).\n"
        )
        w(table(agent["rows"], agent["floor"]))
        w("\n" + agent_overhead(agent) + " With 5 repetitions, p95/p99 are close to the maximum.\n")
        w("Per turn, p50 ms:\n")
        names = list(agent["per_turn"])
        w("| turn | " + " | ".join(names) + " |")
        w("|---|" + "---:|" * len(names))
        for t in agent["turns"]:
            w(
                f"| {t['name']} | "
                + " | ".join(f"{agent['per_turn'][n][t['name']]['p50_ms']:.0f}" for n in names)
                + " |"
            )
        w(f"\n![agent trace]({rel(d / 'agent.png', out)})\n")

    if scale:
        idle, tp = scale["idle"], scale["throughput"]
        cm = idle["container_mib"]
        w("## Scale\n")
        w(
            f"`benchmarks/bench_scale.py`: one gateway with `KERNELGW_MAX_SESSIONS={scale['sessions'] + 10}`, "
            f"`KERNELGW_MEMORY_MB={scale['memory_mb']}` (memory limit per session), no pool, on "
            f"{m.get('cores')} cores / {m.get('ram_gib')} GiB.\n"
        )
        w(
            f"- {idle['alive']} of {scale['sessions']} sessions alive and idle at once, created "
            f"{scale['args']['create_concurrency']} at a time in {idle['create_seconds']:.0f} s; all deleted in "
            f"{scale['delete_seconds']:.1f} s, {scale['leftover_containers']} containers left."
        )
        w(
            f"- Gateway RSS: {idle['gateway_rss_mib_before']:.0f} MiB before, {idle['gateway_rss_mib']:.0f} MiB with "
            f"{scale['sessions']} sessions ({idle['gateway_rss_mib_per_session'] * 1024:.0f} KiB per session), "
            f"{scale['gateway_rss_mib_after_load']:.0f} MiB after the concurrency test (peak "
            f"{scale['gateway_vmhwm_mib']:.0f} MiB)."
        )
        w(
            f"- Per idle kernel container ({idle['cgroup_source']}): working set {cm['working_set']['mean_mib']:.1f} "
            f"MiB mean (max {cm['working_set']['max_mib']:.1f}), of which anonymous {cm['rss']['mean_mib']:.1f} MiB; "
            f"cgroup usage {cm['usage']['mean_mib']:.1f} MiB; tmpfs {cm['shmem']['mean_mib']:.2f} MiB."
        )
        w(
            f"- Outside the cgroup: the containerd-shim of each container, {idle['shim_pss_mib_per_container']:.1f} MiB "
            f"PSS. Docker daemons: "
            + ", ".join(
                f"{k} {idle['daemons_rss_mib_before'].get(k, 0):.0f} -> {v:.0f} MiB"
                for k, v in idle["daemons_rss_mib"].items()
            )
            + "."
        )
        w(
            f"- **{idle['per_session_mib']:.1f} MiB per idle session** (working set + shim + gateway share) = "
            f"**{idle['sessions_per_gib']:.1f} sessions per GiB**; by the host's MemAvailable drop "
            f"({idle['host_memavailable_drop_mib_per_session']:.1f} MiB per session) "
            f"{idle['sessions_per_gib_host'] or 0:.1f} per GiB. An idle session costs memory only: a busy one uses "
            f"what its code allocates, up to its limit."
        )
        w(
            f"- Throughput of `1+1` over WebSockets: {tp['alone_exec_per_s']:.0f} executions/s with one session, "
            f"{tp['concurrent_exec_per_s']:.0f}/s with {scale['busy']} sessions at once "
            f"({tp['concurrent_exec_per_s'] / tp['alone_exec_per_s']:.1f}x; the other "
            f"{scale['sessions'] - scale['busy']} idle), client in one asyncio process on the same 2 cores.\n"
        )
        w(table(scale["rows"], scale["rows"][0]["name"]))
        w(f"\n![scale]({rel(d / 'scale.png', out)})\n")

    if flood:
        w("## Output flood isolation\n")
        w(
            f"`benchmarks/bench_flood.py`: `1+1` in session A (WebSocket and raw floor alternating) while session B "
            f"prints {flood['flood']['mb_per_execution']} MB per cell back to back to a WebSocket reader in another "
            f"process; baseline and flood phases alternate over {flood.get('rounds')} rounds of {flood.get('n_per_phase_round')} samples per transport. The gateway's "
            f"output cap was raised to 64 MiB so that all of B's output flows through it.\n"
        )
        w(table(flood["rows"], flood["floor"]))
        w(f"\n![flood]({rel(d / 'flood.png', out)})\n")
    md.extend(isolation_section(d, out, load(d, "isolation")))

    security = load(d, "security")
    if security:
        w("## What security costs (bench_security.py)\n")
        w(
            "`benchmarks/bench_security.py`: four gateways in their own processes (open; an API key on every "
            "request; a key plus a code policy denying imports, calls and shell escapes; kernels under gVisor), "
            "`1+1` over REST and the WebSocket on each, interleaved in rounds, and cold session starts on runc and "
            "runsc. Floors: the open gateway, and runc.\n"
        )
        w(table(security["rest"], "REST 1+1, open", "open"))
        w("")
        w(table(security["websocket"], "WS 1+1, open", "open"))
        w("")
        w(table(security["start"], "session start, runc", "runc"))
        w(f"\n![security]({rel(d / 'security.png', out)})\n")

    if core:
        w("## Core (bench_core.py)\n")
        w(
            "The original core benchmark (transports in blocks per round), kept for continuity with the first release's numbers in benchmark-headlines.md.\n"
        )
        w(table(core["rows"], row(core["rows"], "1+1 raw")["name"]))
        w(f"\n![core]({rel(d / 'core.png', out)})\n")

    md.extend(pool_section(d, out, load(d, "pool")))
    md.extend(memory_section(d, out, load(d, "memory")))
    md.extend(jupyter_section(d, out, load(d, "jupyter")))
    md.extend(e2b_section(d, out, load(d, "e2b")))
    md.extend(e2b_envd_section(d, out, load(d, "e2b_envd")))
    md.extend(continuity_section(d, out, load(d, "continuity")))
    md.extend(languages_section(d, out, load(d, "languages")))
    md.extend(workers_section(d, out, load(d, "workers")))
    md.extend(peers_section(d, out, load(d, "peers")))

    w("## Fairness and caveats\n")
    w(
        "- **Isolation differs.** kernelgw sessions run with network none, a read-only root file system, tmpfs "
        "`/tmp` and `/workspace`, uid 1000, `cap_drop=ALL`, `no-new-privileges`, memory (no swap), CPU and pids "
        "limits, tini as PID 1. The llm-sandbox containers got network none, the same memory/CPU/pids limits and "
        "tini (`init`, so that `close` does not wait Docker's 10 s stop timeout), but run as root with a writable "
        "root file system and default capabilities: llm-sandbox writes its code files into `/sandbox` and runs as "
        "root by default. `docker run` rows use `--network none` and nothing else. Stricter settings cost kernelgw "
        "a little at container start (tmpfs mounts), if anything."
    )
    w(
        "- **llm-sandbox needed configuration to work offline here.** Its default environment setup makes a venv "
        "(`python -m venv --system-site-packages`) and runs `pip install --upgrade pip`; without network pip fails "
        "after its retries, and the venv sits on the image's base interpreter, which cannot see the packages in "
        "`/opt/kernel` (see the Session start notes for the measured outcome). So the stateless rows use "
        "`skip_environment_setup=True` (documented for pre-built images), which runs `python` from the image's PATH "
        "(`/opt/kernel/bin/python`). Its interactive mode needs that venv for `pip install ipython` and its runner; "
        "it fails offline with the default setup, so the benchmark skips the setup and points the venv path at "
        "`/opt/kernel` with a symlink (one `docker exec`, included in the timings); pip then finds IPython already "
        "installed. Image `CMD` is replaced by `sleep infinity` (our image's CMD starts a Jupyter kernel). "
        "`MPLBACKEND=Agg` is set for llm-sandbox."
    )
    w(
        "- **Same machine for everything.** The clients, the gateway, the Docker engine and the kernels share 2 "
        "cores; concurrency and flood results include that contention (the raw floor shows how much)."
    )
    w(
        "- **What the floor is.** Raw jupyter_client is a Python asyncio client, the same library the gateway uses "
        "to talk to kernels; a leaner client could go lower. The floor never pays for other transports' messages "
        "(queued iopub messages are drained before each timed sample)."
    )
    w(
        "- **kernelgw's REST rows** use httpx's AsyncClient (keep-alive); the SDK rows use the sync SDK "
        "(`Client.run`, httpx sync), which also parses every event into pydantic models."
    )
    w(
        "- **Memory.** Container memory comes from the cgroup (page cache of files the kernel read counts as "
        "usage; inactive file pages are excluded from the working set, as `docker stats` does). The host "
        "MemAvailable drop is a cross-check that includes everything (shims, engine bookkeeping, page cache), and "
        "is noisier."
    )
    w(
        "- **Not measured:** gVisor (`runsc`), other llm-sandbox backends (Podman, Kubernetes), llm-sandbox's own "
        "container pool, many gateways.\n"
    )

    out.write_text("\n".join(md))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
