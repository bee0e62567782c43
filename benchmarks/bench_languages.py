"""Every kernel (language): image size, cold start, first cell, warm trivial cell, idle memory, interrupt,
recovery after an out-of-memory kill.

One gateway offers all kernels (``KERNELGW_KERNELS``). Per kernel, ROUNDS times:
``POST /v1/sessions {"kernel": name}`` (cold start: a new container, the kernel
up and answering ``kernel_info``), the first trivial cell, then WARM more trivial
cells (the language's ``1+1``; for Go and C++ a whole program compiled and run),
and the kernel container's memory after them; then an endless cell that prints
``looping`` first (``ENDLESS``) is interrupted (``POST .../interrupt``) once that
line reached a /v1 WebSocket watcher: the time from the interrupt to the cell's
answer (the latency tests/integration/languages no longer bound). Then, in a session of its own
(``memory_mb`` ``BOMB_MEMORY_MB``, ``auto_replay``: the session restarts a kernel that died under a
cell by itself), the promise suite's memory bomb of the language: the time from the request to the
bomb cell's ``done`` (``dead``, ``state_lost``; with ``auto_replay`` the gateway restarts the kernel
before it answers, so this includes the restart; the engine's out-of-memory event, when there is
one, splits it), and from that ``done`` to the first following cell (it prints ``said``) answering
``ok``. A kernel that does not come back by itself is a row that says so. Python's row is the floor
the others are compared with. Image size is what the image adds to the Python image
it is built on (shared layers are not counted twice).

Run:  .venv/bin/python benchmarks/bench_languages.py [--quick] [--kernels deno,ruby]
A benchmark, not a test: numbers vary with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import docker
import httpx
from websockets.sync.client import connect as ws_connect

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from _common import (  # noqa: E402
    DEFAULT_IMAGE,
    DOCS_BENCH,
    Gateway,
    container_memory,
    draw_bars,
    failed_row,
    machine_info,
    now_iso,
    print_table,
    summary,
    write_json,
)

from kernelgw.kernels import PROFILES  # noqa: E402
from tests.support.language_cells import BOMB_MEMORY_MB, MEMORY_BOMBS, SAID, SAY  # noqa: E402

TRIVIAL = {
    "python3": "1+1",
    "deno": "1+1",
    "ir": "1+1",
    "bash": "echo $((1+1))",
    "java": "1+1",
    "go": 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println(1 + 1) }\n',
    "cpp": '#include <cstdio>\nint main() { std::printf("%d\\n", 1 + 1); }\n',
    "ruby": "1+1",
}
"""The language's ``1+1``: a value where the kernel shows one, a program where a cell is one."""

ENDLESS = {
    "python3": "print('looping', flush=True)\nwhile True:\n    pass",
    "deno": 'console.log("looping"); while (true) {}',
    "ir": "cat('looping\\n')\nwhile (TRUE) {}",
    "bash": "echo looping; while true; do :; done",
    # one statement: JShell compiles each statement of a cell on its own
    "java": 'for (long i = 0; ; i++) { if (i == 0) System.out.println("looping"); }',
    "go": 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("looping")\n\tfor {\n\t}\n}\n',
    "cpp": '#include <cstdio>\nint main() {\n    std::printf("looping\\n");\n    std::fflush(stdout);\n    for (;;) {}\n}\n',
    "ruby": "puts 'looping'\nloop {}",
}
"""An endless cell that prints ``looping`` once it runs (past any compilation)."""


def image_mb(client: docker.DockerClient, tag: str, base: str) -> tuple[float, float]:
    """(the image's size, what it adds to ``base``) in MB."""
    size = client.images.get(tag).attrs["Size"]
    base_size = client.images.get(base).attrs["Size"]
    return size / 1e6, (size - base_size) / 1e6


def execute(client: httpx.Client, sid: str, code: str) -> float:
    t0 = time.perf_counter()
    r = client.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    dt = (time.perf_counter() - t0) * 1000
    r.raise_for_status()
    done = r.json()["events"][-1]
    if done["status"] != "ok":
        raise RuntimeError(f"{code!r}: {done}")
    return dt


def interrupt_ms(gw: Gateway, client: httpx.Client, sid: str, kernel: str) -> float:
    """Run ``ENDLESS[kernel]``; once its line reached a /v1 watcher, interrupt it:
    the milliseconds from the interrupt to the cell's answer (``interrupted``)."""
    answer: dict[str, Any] = {}

    def run_it() -> None:
        answer.update(client.post(f"/v1/sessions/{sid}/execute", json={"code": ENDLESS[kernel]}).json())

    worker = threading.Thread(target=run_it)
    with ws_connect(gw.ws_url(sid), open_timeout=60) as watcher:
        worker.start()
        seen = ""
        while "looping" not in seen:
            event = json.loads(watcher.recv(timeout=120))
            if event["type"] == "stream":
                seen += event["text"]
    t0 = time.perf_counter()
    client.post(f"/v1/sessions/{sid}/interrupt").raise_for_status()
    worker.join(120)
    dt = (time.perf_counter() - t0) * 1000
    done = answer["events"][-1]
    if done["status"] != "interrupted":
        raise RuntimeError(f"{kernel}: the endless cell ended {done}")
    return dt


BOMB_TIMEOUT_S = 120
"""A memory bomb's cell timeout: the promise suite's."""


def bomb_outcome(done: dict[str, Any], keeps_state: bool = True) -> str:
    """How a memory bomb's cell ended, in a few words: ``dead, state lost, restarted``
    is Python's with ``auto_replay``; Java catches an ``OutOfMemoryError`` (``error,
    state kept``); in Go and C++ (``keeps_state`` false: a whole program per cell)
    the cell's program dies (``error, no state``)."""
    status, reason = done["status"], done.get("reason") or ""
    words = [f"{status} (out-of-memory)" if reason.startswith("out-of-memory") else status]
    if status in ("dead", "error", "timeout"):
        words.append("state lost" if done.get("state_lost") else "state kept" if keeps_state else "no state")
    if status == "dead":
        words.append("restarted" if "the kernel was restarted" in reason else "not restarted")
    return ", ".join(words)


def oom_kill_s(sid: str, since: float, until: float) -> float | None:
    """When the engine reported the first out-of-memory kill in the session's
    container between ``since`` and ``until`` (wall clock, seconds); None: no report."""
    dc = docker.from_env()
    try:
        events = dc.events(
            since=f"{since:.3f}",
            until=f"{until:.3f}",
            filters={"type": "container", "event": "oom", "label": f"kernelgw.session={sid}"},
            decode=True,
        )
        times = [e["timeNano"] / 1e9 for e in events]
    finally:
        dc.close()
    return min(times) if times else None


def oom_recovery(client: httpx.Client, kernel: str) -> dict[str, Any]:
    """One memory bomb (``MEMORY_BOMBS[kernel]``) in a new session of ``BOMB_MEMORY_MB``
    with ``auto_replay``, then ``SAY[kernel]``: ``bomb_ms`` (the request to the bomb's
    ``done``), ``killed_ms`` (the request to the engine's out-of-memory event, or None),
    ``outcome`` (`bomb_outcome`), and ``recover_ms`` (that ``done`` to the next cell's
    ``ok`` answer) or, when the next cell did not run, ``not_recovered`` (how it ended)."""
    r = client.post("/v1/sessions", json={"kernel": kernel, "memory_mb": BOMB_MEMORY_MB, "auto_replay": True})
    r.raise_for_status()
    sid = r.json()["id"]
    try:
        wall0, t0 = time.time(), time.perf_counter()
        r = client.post(f"/v1/sessions/{sid}/execute", json={"code": MEMORY_BOMBS[kernel], "timeout": BOMB_TIMEOUT_S})
        t1, wall1 = time.perf_counter(), time.time()
        r.raise_for_status()
        done = r.json()["events"][-1]
        r = client.post(f"/v1/sessions/{sid}/execute", json={"code": SAY[kernel], "timeout": 60})
        t2 = time.perf_counter()
        r.raise_for_status()
        events = r.json()["events"]
    finally:
        client.delete(f"/v1/sessions/{sid}")
    killed = oom_kill_s(sid, wall0, wall1)
    out: dict[str, Any] = {
        "bomb_ms": (t1 - t0) * 1000,
        "killed_ms": None if killed is None else (killed - wall0) * 1000,
        "outcome": bomb_outcome(done, PROFILES[kernel].keeps_state),
        "reason": done.get("reason"),
    }
    said = "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == "stdout")
    if events[-1]["status"] == "ok" and said == SAID:
        out["recover_ms"] = (t2 - t1) * 1000
    else:
        end = events[-1]
        out["not_recovered"] = f"the next cell ended {end['status']} ({end.get('reason')}), printed {said!r}"
    return out


def oom_rows(bombs: list[dict[str, Any]], errors: list[str], *, kernel: str, **extra: Any) -> list[dict[str, Any]]:
    """The two rows of a kernel's memory bombs: ``<kernel>: memory bomb`` (request to its
    ``done``) and ``<kernel>: after the bomb`` (that ``done`` to the next ``ok``). Rounds
    that failed or did not recover are named in the row, never dropped silently: with
    no sample the row is a `failed_row` that says why; with some, its name counts them."""
    outcomes = sorted({b["outcome"] for b in bombs})
    killed = [b["killed_ms"] for b in bombs if b["killed_ms"] is not None]
    info = {
        "kernel": kernel,
        **extra,
        "outcome": " / ".join(outcomes) if outcomes else None,
        "killed_p50_ms": statistics.median(killed) if killed else None,
        "reason": next((b["reason"] for b in bombs if b["reason"]), None),
        "oom_events": len(killed),
        "rounds_failed": len(errors),
    }
    bomb_name, after_name = f"{kernel}: memory bomb", f"{kernel}: after the bomb"
    if bombs:
        bomb_row = summary(bomb_name, [b["bomb_ms"] for b in bombs], **info)
    else:
        bomb_row = failed_row(bomb_name, "; ".join(errors) or "no round ran", **info)
    recovered = [b["recover_ms"] for b in bombs if "recover_ms" in b]
    stuck = [b["not_recovered"] for b in bombs if "not_recovered" in b]
    missing = len(errors) + len(stuck)
    if not recovered:
        why = stuck[0] if stuck else "; ".join(errors) or "no round ran"
        after_row = failed_row(after_name, f"did not recover by itself in {missing} of {missing} rounds: {why}", **info)
    else:
        if missing:
            after_name += f" ({missing} of {missing + len(recovered)} rounds did not recover)"
        after_row = summary(after_name, recovered, not_recovered=stuck, **info)
    return [bomb_row, after_row]


def measure(gw: Gateway, kernel: str, rounds: int, warm: int) -> dict[str, Any]:
    cold: list[float] = []
    first: list[float] = []
    later: list[float] = []
    memory: list[float] = []
    interrupts: list[float] = []
    bombs: list[dict[str, Any]] = []
    bomb_errors: list[str] = []
    with httpx.Client(base_url=gw.url, timeout=300) as client:
        for _ in range(rounds):
            t0 = time.perf_counter()
            r = client.post("/v1/sessions", json={"kernel": kernel})
            r.raise_for_status()
            cold.append((time.perf_counter() - t0) * 1000)
            sid = r.json()["id"]
            try:
                first.append(execute(client, sid, TRIVIAL[kernel]))
                later.extend(execute(client, sid, TRIVIAL[kernel]) for _ in range(warm))
                (container,) = [c for c in gw.containers() if c.labels.get("kernelgw.session") == sid]
                memory.append(container_memory(container.id)["working_set"] / 1e6)
                interrupts.append(interrupt_ms(gw, client, sid, kernel))
            finally:
                client.delete(f"/v1/sessions/{sid}")
            try:
                bombs.append(oom_recovery(client, kernel))
            except Exception as exc:  # the row says so; the other kernels still run
                bomb_errors.append(f"{type(exc).__name__}: {exc}")
    return {
        "cold": cold,
        "first": first,
        "warm": later,
        "interrupt": interrupts,
        "bombs": bombs,
        "bomb_errors": bomb_errors,
        "memory_mb": sorted(memory)[len(memory) // 2],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default=DEFAULT_IMAGE, help="the Python kernel image (the others are built on it)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--kernels", default=",".join(TRIVIAL), help="comma-separated kernel names")
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "languages.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "languages.png")
    args = ap.parse_args()
    kernels = [k for k in args.kernels.split(",") if k]
    rounds, warm = (2, 5) if args.quick else (5, 20)
    started = now_iso()
    machine = machine_info(args.image)  # before the run: its activity_start is the load at the start
    dc = docker.from_env()
    sizes = {}
    for kernel in kernels:
        tag = args.image if kernel == "python3" else f"kernelgw/{kernel}:latest"
        sizes[kernel] = image_mb(dc, tag, args.image)
    dc.close()

    cold_rows: list[dict[str, Any]] = []
    first_rows: list[dict[str, Any]] = []
    warm_rows: list[dict[str, Any]] = []
    interrupt_rows: list[dict[str, Any]] = []
    bomb_rows: list[dict[str, Any]] = []
    after_rows: list[dict[str, Any]] = []
    env = {"KERNELGW_KERNELS": json.dumps(kernels), "KERNELGW_POOL_SIZE": "0", "KERNELGW_MEMORY_MB": "1024"}
    with Gateway("lang", image=args.image, env=env) as gw:
        for kernel in kernels:
            print(f"{kernel}: {rounds} sessions, {warm} warm cells each", flush=True)
            m = measure(gw, kernel, rounds, warm)
            size, added = sizes[kernel]
            extra = {
                "kernel": kernel,
                "image_mb": round(size),
                "adds_mb": round(added),
                "memory_mb": round(m["memory_mb"]),
            }
            cold_rows.append(summary(f"{kernel}: create (cold)", m["cold"], **extra))
            first_rows.append(summary(f"{kernel}: first cell", m["first"], **extra))
            warm_rows.append(summary(f"{kernel}: warm cell", m["warm"], **extra))
            interrupt_rows.append(summary(f"{kernel}: interrupt", m["interrupt"], **extra))
            bomb_row, after_row = oom_rows(m["bombs"], m["bomb_errors"], **extra)
            bomb_rows.append(bomb_row)
            after_rows.append(after_row)
    print_table("Create a session (cold: no pool)", cold_rows, floor="python3: create (cold)")
    print_table("First trivial cell", first_rows, floor="python3: first cell")
    print_table("Warm trivial cell (Go, C++: compile and run)", warm_rows, floor="python3: warm cell")
    print_table("Interrupt of a running loop, to the cell's answer", interrupt_rows, floor="python3: interrupt")
    print_table(
        f"Memory bomb (memory_mb {BOMB_MEMORY_MB}, auto_replay): the request to the cell's end (a restart included)",
        bomb_rows,
        floor="python3: memory bomb",
    )
    print_table(
        "After the memory bomb: its end to the next cell's ok (the session restarts its kernel by itself)",
        after_rows,
        floor=next((r["name"] for r in after_rows if r["kernel"] == "python3"), None),
    )
    print("\nHow the memory bomb ended (the engine's out-of-memory kill, p50 from the request):")
    for r in bomb_rows:
        killed = "no out-of-memory event" if r["killed_p50_ms"] is None else f"killed at {r['killed_p50_ms']:.0f} ms"
        print(f"  {r['kernel']:8} {r['outcome']}; {killed}")
    print("\nImage and memory:")
    for r in cold_rows:
        print(
            f"  {r['kernel']:8} image {r['image_mb']:5d} MB (+{r['adds_mb']} MB on Python's), idle kernel {r['memory_mb']} MB"
        )
    write_json(
        args.json,
        {
            "benchmark": "languages",
            "date": started,
            "machine": machine,
            "rounds": rounds,
            "warm": warm,
            "quick": args.quick,
            "bomb_memory_mb": BOMB_MEMORY_MB,
            "rows": cold_rows + first_rows + warm_rows + interrupt_rows + bomb_rows + after_rows,
        },
    )
    draw_bars(
        [
            ("create (cold)", cold_rows),
            ("first cell", first_rows),
            ("warm cell", warm_rows),
            ("interrupt of a running loop, to the cell's answer", interrupt_rows),
            (f"memory bomb (memory_mb {BOMB_MEMORY_MB}): request to the cell's end, a restart included", bomb_rows),
            ("after the bomb: its end to the next cell's ok", after_rows),
        ],
        args.chart,
        title="Kernels by language (p50 bars; p95 |, p99 x)",
    )
    print(f"wrote {args.json} and {args.chart}")


if __name__ == "__main__":
    main()
