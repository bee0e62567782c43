"""Every kernel (language): image size, cold start, first cell, warm trivial cell, idle memory, interrupt.

One gateway offers all kernels (``KERNELGW_KERNELS``). Per kernel, ROUNDS times:
``POST /v1/sessions {"kernel": name}`` (cold start: a new container, the kernel
up and answering ``kernel_info``), the first trivial cell, then WARM more trivial
cells (the language's ``1+1``; for Go and C++ a whole program compiled and run),
and the kernel container's memory after them; then an endless cell that prints
``looping`` first (``ENDLESS``) is interrupted (``POST .../interrupt``) once that
line reached a /v1 WebSocket watcher: the time from the interrupt to the cell's
answer (the latency tests/integration/languages no longer bound). Python's row is the floor the
others are compared with. Image size is what the image adds to the Python image
it is built on (shared layers are not counted twice).

Run:  .venv/bin/python benchmarks/bench_languages.py [--quick] [--kernels deno,ruby]
A benchmark, not a test: numbers vary with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import docker
import httpx
from websockets.sync.client import connect as ws_connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    DOCS_BENCH,
    Gateway,
    container_memory,
    draw_bars,
    machine_info,
    now_iso,
    print_table,
    summary,
    write_json,
)

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


def measure(gw: Gateway, kernel: str, rounds: int, warm: int) -> dict[str, Any]:
    cold: list[float] = []
    first: list[float] = []
    later: list[float] = []
    memory: list[float] = []
    interrupts: list[float] = []
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
    return {
        "cold": cold,
        "first": first,
        "warm": later,
        "interrupt": interrupts,
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
    print_table("Create a session (cold: no pool)", cold_rows, floor="python3: create (cold)")
    print_table("First trivial cell", first_rows, floor="python3: first cell")
    print_table("Warm trivial cell (Go, C++: compile and run)", warm_rows, floor="python3: warm cell")
    print_table("Interrupt of a running loop, to the cell's answer", interrupt_rows, floor="python3: interrupt")
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
            "machine": machine_info(args.image),
            "rounds": rounds,
            "warm": warm,
            "rows": cold_rows + first_rows + warm_rows + interrupt_rows,
        },
    )
    draw_bars(
        [("create (cold)", cold_rows), ("first cell", first_rows), ("warm cell", warm_rows)],
        args.chart,
        title="Kernels by language (p50 bars; p95 |, p99 x)",
    )
    print(f"wrote {args.json} and {args.chart}")


if __name__ == "__main__":
    main()
