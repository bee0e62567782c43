"""E2B's envd through E2B's SDK on kernelgw: a command and a file round trip,
each beside its floor on the same gateway and container.

Rows, interleaved in shuffled order every round so load drift hits all alike:
  - ``commands.run("true")`` through E2B's SDK, against the engine's own exec of
    ``true`` in the same container (docker-py's ``exec_run``: what any command
    costs at least here, with no gateway in the way);
  - a 10 MiB file written then read back through ``sandbox.files``, against the
    same bytes up and down through kernelgw's own SDK (``/v1``'s files API) on a
    session of the same gateway.

Run:  .venv/bin/python benchmarks/bench_e2b_envd.py [--rounds 20] [--json docs/bench/e2b_envd.json --chart docs/bench/e2b_envd.png]
A benchmark, not a test: numbers vary with the machine's load (printed with them).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

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
from bench_e2b import e2b_environment

ENGINE_EXEC = "engine: docker exec true (floor)"
E2B_COMMAND = 'E2B SDK: commands.run("true")'
OWN_FILES = "kernelgw SDK: 10 MiB up + down (floor)"
E2B_FILES = "E2B SDK: files.write + files.read 10 MiB"
FILE_BYTES = 10 * 1024 * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="3 rounds (a smoke run)")
    ap.add_argument("--json", type=Path, default=DOCS_BENCH / "e2b_envd.json")
    ap.add_argument("--chart", type=Path, default=DOCS_BENCH / "e2b_envd.png")
    args = ap.parse_args()
    if args.quick:
        args.rounds = 3

    from importlib.metadata import version

    import docker
    from e2b_code_interpreter import Sandbox

    from kernelgw.client import Client

    started = now_iso()
    payload = os.urandom(FILE_BYTES)
    samples: dict[str, list[float]] = {ENGINE_EXEC: [], E2B_COMMAND: [], OWN_FILES: [], E2B_FILES: []}
    engine = docker.from_env()
    with Gateway("e2benvd", image=args.image) as gw:
        e2b_environment(gw)
        client = Client(gw.url, api_key=None)
        own = client.create_session()
        sandbox = Sandbox.create()
        try:
            (container,) = engine.containers.list(
                filters={"label": [f"kernelgw.session={sandbox.sandbox_id}", "kernelgw.kernel"]}
            )  # the kernel's container, not the workspace's store
            sandbox.commands.run("true")  # the first exec of each path outside the samples
            container.exec_run(["true"])

            def engine_exec() -> None:
                t0 = time.perf_counter()
                result = container.exec_run(["true"])
                samples[ENGINE_EXEC].append((time.perf_counter() - t0) * 1000)
                assert result.exit_code == 0, result

            def e2b_command() -> None:
                t0 = time.perf_counter()
                result = sandbox.commands.run("true")
                samples[E2B_COMMAND].append((time.perf_counter() - t0) * 1000)
                assert result.exit_code == 0, result

            def own_files() -> None:
                t0 = time.perf_counter()
                own.upload(payload, "blob.bin")
                back = own.download("blob.bin")
                samples[OWN_FILES].append((time.perf_counter() - t0) * 1000)
                assert back == payload

            def e2b_files() -> None:
                t0 = time.perf_counter()
                sandbox.files.write("/home/user/blob.bin", payload)
                back = sandbox.files.read("/home/user/blob.bin", format="bytes")
                samples[E2B_FILES].append((time.perf_counter() - t0) * 1000)
                assert bytes(back) == payload

            steps = [engine_exec, e2b_command, own_files, e2b_files]
            for i in range(args.rounds):
                random.shuffle(steps)
                for step in steps:
                    step()
                print(f"round {i + 1}/{args.rounds}", flush=True)
        finally:
            own.delete(missing_ok=True)
            sandbox.kill()
            client.close()
            engine.close()
    activity = other_activity()
    command_rows = [summary(ENGINE_EXEC, samples[ENGINE_EXEC]), summary(E2B_COMMAND, samples[E2B_COMMAND])]
    file_rows = [summary(OWN_FILES, samples[OWN_FILES]), summary(E2B_FILES, samples[E2B_FILES])]
    print_table('commands.run("true") on a running sandbox', command_rows, floor=ENGINE_EXEC)
    print_table("A 10 MiB file written and read back", file_rows, floor=OWN_FILES)
    write_json(
        args.json,
        {
            "benchmark": "e2b_envd",
            "date": started,
            "machine": machine_info(args.image),
            "activity_end": activity,
            "sdk_version": version("e2b"),
            "rounds": args.rounds,
            "file_bytes": FILE_BYTES,
            "rows": command_rows + file_rows,
        },
    )
    draw_bars(
        [('commands.run("true")', command_rows), ("10 MiB up + down", file_rows)],
        args.chart,
        title="E2B's envd on kernelgw against its floors (p50 bars; p95 |, p99 x)",
        floor_names=(ENGINE_EXEC, OWN_FILES),
    )
    print(f"wrote {args.json} and {args.chart}")


if __name__ == "__main__":
    main()
