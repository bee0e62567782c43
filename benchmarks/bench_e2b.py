"""E2B's SDK against kernelgw's /e2b face, beside kernelgw's own SDK on the same
gateway and kernels (the floor).

Rows, interleaved in shuffled order every round so load drift hits all alike:
  - create + first ``1+1``: kernelgw's SDK (``create_session`` + ``run``) and E2B's
    (``Sandbox.create()`` + ``run_code``), each create served by the warm pool
    (the benchmark waits for the pool to refill between rounds, as a gateway with
    spare capacity would be);
  - warm ``1+1`` on a running session: ``session.run`` against ``sandbox.run_code``;
  - where the engine has the code-interpreter image (every E2B language, which an
    unmapped ``code-interpreter-v1`` runs), its create + first ``1+1`` from a pool
    of that image, and the first JavaScript cell of such a sandbox (its Deno
    context starts then), against the next JavaScript cell (the floor).
The Python rows create from ``base`` (the Python image), so the E2B and
kernelgw paths run the same kernels whatever images the engine has.
Goal (issue 29): on a warm pool, E2B's create + first ``run_code`` within 2x of
kernelgw's own path. E2B states 80-200 ms for its cloud's sandbox start; that
figure is theirs (published), not measured here.

Run:  .venv/bin/python benchmarks/bench_e2b.py [--rounds 30] [--json docs/bench/e2b.json --chart docs/bench/e2b.png]
A benchmark, not a test: numbers vary with the machine's load (printed with them).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    DOCS_BENCH,
    Gateway,
    draw_bars,
    machine_info,
    now_iso,
    other_activity,
    print_table,
    summary,
    write_json,
)

OWN_START = "kernelgw SDK: create + first 1+1 (floor)"
E2B_START = "E2B SDK: Sandbox.create + first run_code"
OWN_WARM = "kernelgw SDK: warm 1+1 (floor)"
E2B_WARM = "E2B SDK: warm run_code"
BUNDLE_START = "E2B SDK: create + first run_code, code-interpreter image"
JS_FIRST = "E2B SDK: first JavaScript cell (its context starts)"
JS_NEXT = "E2B SDK: next JavaScript cell (floor)"
BUNDLE = "kernelgw/code-interpreter:latest"
POOL = 2
WARM_PER_ROUND = 10


def e2b_environment(gw: Gateway) -> None:
    """What an E2B user sets to move to kernelgw (authentication is off on this
    loopback gateway: any key is accepted, but the SDK wants one)."""
    os.environ.update(
        E2B_API_URL=f"{gw.url}/e2b",
        E2B_SANDBOX_URL=f"{gw.url}/e2b",
        E2B_API_KEY="kgw_bench",
        E2B_HTTP_VERSION="1.1",
    )


def has_image(tag: str) -> bool:
    import docker

    client = docker.from_env()
    try:
        return bool(client.images.list(name=tag))
    finally:
        client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="5 rounds (a smoke run)")
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "e2b.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "e2b.png")
    args = ap.parse_args()
    if args.quick:
        args.rounds = 5

    from importlib.metadata import version

    from e2b_code_interpreter import Sandbox

    from kernelgw.client import Client

    started = now_iso()
    samples: dict[str, list[float]] = {OWN_START: [], E2B_START: [], OWN_WARM: [], E2B_WARM: []}
    bundle = has_image(BUNDLE)
    env = {"KERNELGW_POOL_SIZE": str(POOL)}
    if bundle:
        samples |= {BUNDLE_START: [], JS_FIRST: [], JS_NEXT: []}
        env["KERNELGW_POOL_PROFILES"] = json.dumps([{"image": BUNDLE, "size": POOL}])
    pools = POOL * (2 if bundle else 1)
    with Gateway("e2b", image=args.image, env=env) as gw:
        e2b_environment(gw)
        client = Client(gw.url, api_key=None)

        def own_start() -> None:
            gw.wait_pool_ready(pools)
            t0 = time.perf_counter()
            session = client.create_session()
            result = session.run("1+1")
            samples[OWN_START].append((time.perf_counter() - t0) * 1000)
            assert result.status == "ok", result
            session.delete()

        def first_run(name: str, **create: Any) -> Any:
            """A sandbox created from a refilled pool and its first ``1+1``, timed as ``name``."""
            gw.wait_pool_ready(pools)
            t0 = time.perf_counter()
            sandbox = Sandbox.create(**create)
            execution = sandbox.run_code("1+1")
            samples[name].append((time.perf_counter() - t0) * 1000)
            assert execution.text == "2", execution
            return sandbox

        def e2b_start() -> None:
            first_run(E2B_START, template="base").kill()

        def bundle_start() -> None:
            """The E2B default on the code-interpreter image, then its first and
            second JavaScript cells."""
            sandbox = first_run(BUNDLE_START)
            for name in (JS_FIRST, JS_NEXT):
                t0 = time.perf_counter()
                execution = sandbox.run_code("1+1", language="js")
                samples[name].append((time.perf_counter() - t0) * 1000)
                assert execution.text == "2", execution
            sandbox.kill()

        own = client.create_session()
        sandbox = Sandbox.create(template="base", timeout=3600)  # lives through every round
        try:
            own.run("1+1")
            sandbox.run_code("1+1")

            def own_warm() -> None:
                for _ in range(WARM_PER_ROUND):
                    t0 = time.perf_counter()
                    own.run("1+1")
                    samples[OWN_WARM].append((time.perf_counter() - t0) * 1000)

            def e2b_warm() -> None:
                for _ in range(WARM_PER_ROUND):
                    t0 = time.perf_counter()
                    sandbox.run_code("1+1")
                    samples[E2B_WARM].append((time.perf_counter() - t0) * 1000)

            steps = [own_start, e2b_start, own_warm, e2b_warm, *([bundle_start] if bundle else [])]
            for i in range(args.rounds):
                random.shuffle(steps)
                for step in steps:
                    step()
                print(f"round {i + 1}/{args.rounds}", flush=True)
        finally:
            own.delete(missing_ok=True)
            sandbox.kill()
            client.close()
    activity = other_activity()
    start_rows = [summary(OWN_START, samples[OWN_START]), summary(E2B_START, samples[E2B_START])]
    warm_rows = [summary(OWN_WARM, samples[OWN_WARM]), summary(E2B_WARM, samples[E2B_WARM])]
    print_table(f"Create + first 1+1 on a warm pool (pool_size={POOL})", start_rows, floor=OWN_START)
    print_table("Warm 1+1 on a running session", warm_rows, floor=OWN_WARM)
    bundle_rows = []
    if bundle:
        bundle_rows = [summary(OWN_START, samples[OWN_START]), summary(BUNDLE_START, samples[BUNDLE_START])]
        print_table(
            f"Create + first 1+1 on the code-interpreter image (its pool of {POOL})", bundle_rows, floor=OWN_START
        )
        js_rows = [summary(JS_NEXT, samples[JS_NEXT]), summary(JS_FIRST, samples[JS_FIRST])]
        print_table("JavaScript in a code-interpreter sandbox", js_rows, floor=JS_NEXT)
        bundle_rows = bundle_rows[1:] + js_rows
    else:
        print(f"{BUNDLE} is not built: no code-interpreter rows (kernelgw image build --kernel code-interpreter)")
    ratio = start_rows[1]["p50_ms"] / start_rows[0]["p50_ms"]
    print(f"E2B create + first run_code / kernelgw's own, p50: {ratio:.2f}x (goal: at most 2x)")
    print("E2B's published cloud start: 80-200 ms (their figure, not measured here)")
    write_json(
        args.json,
        {
            "benchmark": "e2b",
            "date": started,
            "machine": machine_info(args.image),
            "activity_end": activity,
            "sdk_version": version("e2b-code-interpreter"),
            "rounds": args.rounds,
            "pool_size": POOL,
            "start_ratio_p50": ratio,
            "code_interpreter_image": BUNDLE if bundle else None,
            "rows": start_rows + warm_rows + bundle_rows,
        },
    )
    groups = [("create + first 1+1 (warm pool)", start_rows), ("warm 1+1", warm_rows)]
    if bundle:
        groups += [("code-interpreter image", [start_rows[0], *bundle_rows])]
    draw_bars(
        groups,
        args.chart,
        title="E2B's SDK on kernelgw against kernelgw's own SDK (p50 bars; p95 |, p99 x)",
        floor_names=(OWN_START, OWN_WARM, JS_NEXT),
    )
    print(f"wrote {args.json} and {args.chart}")


if __name__ == "__main__":
    main()
