"""Probe (not a benchmark): does a burst of many small outputs lose iopub messages?

ZMQ PUB/SUB drops messages for a subscriber that falls more than its high-water
marks behind (SNDHWM + RCVHWM, 1000 + 1000 messages by default; neither ipykernel
nor jupyter_client changes them). If the dropped messages include the final
`status: idle`, an execution that waits for it never finishes (until its timeout).

  1. raw: jupyter_client on a session's kernel reads iopub 1 s late after cells
     printing N flushed lines (one message each): how many messages arrive, is idle seen?
  2. gateway: K sessions at once each run a cell printing N flushed lines over REST;
     how many finish within --wait seconds, and in what state are the others?

Run:  .venv/bin/python benchmarks/probe_iopub_hwm.py [--sessions 8] [--lines 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    DEFAULT_IMAGE,
    Gateway,
    RawKernel,
    machine_info,
    now_iso,
    session_container,
    write_json,
)

CODE = "import sys\nfor i in range({n}):\n    print('line', i)\n    sys.stdout.flush()\n"


async def raw_probe(conn: Path, n: int, late_s: float) -> dict[str, object]:
    async with RawKernel(conn) as raw:
        kc = raw.kc
        msg_id = kc.execute(CODE.format(n=n))
        await kc.get_shell_msg(timeout=60)  # execute_reply: the cell has finished
        await asyncio.sleep(late_s)  # a subscriber that is behind
        got, idle = 0, False
        while True:
            try:
                m = await kc.get_iopub_msg(timeout=2)
            except queue.Empty:
                break
            if m["parent_header"].get("msg_id") == msg_id:
                got += 1
                idle = idle or (m["header"]["msg_type"] == "status" and m["content"]["execution_state"] == "idle")
        print(f"  raw: {n} lines, reader {late_s:.0f} s late: {got} of {n + 3} iopub messages, idle seen: {idle}")
        return {"lines": n, "late_s": late_s, "messages": got, "expected": n + 3, "idle_seen": idle}


async def gateway_probe(url: str, ids: list[str], n: int, wait: float) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=url, timeout=wait) as client:

        async def one(sid: str) -> str:
            t0 = time.perf_counter()
            try:
                r = await client.post(f"/v1/sessions/{sid}/execute", json={"code": CODE.format(n=n)})
                body = r.json()
                lines = sum(e["text"].count("\n") for e in body["events"] if e["type"] == "stream")
                return f"{body['status']} in {time.perf_counter() - t0:.1f} s, {lines} of {n} lines" + (
                    "" if lines == n else " (OUTPUT LOST)"
                )
            except httpx.ReadTimeout:
                info = (await client.get(f"/v1/sessions/{sid}")).json()
                return (
                    f"NOT FINISHED after {wait:.0f} s: state {info['state']}, queue {info['queue_length']}, "
                    f"last_seq {info['last_seq']}"
                )

        results = await asyncio.gather(*(one(s) for s in ids))
    for sid, res in zip(ids, results, strict=True):
        print(f"  gateway: session {sid[:8]}: {res}")
    stuck = sum("NOT FINISHED" in r for r in results)
    lost = sum("OUTPUT LOST" in r for r in results)
    print(
        f"  gateway: {len(ids) - stuck} of {len(ids)} executions finished ({lost} of them with lines missing), "
        f"{stuck} stuck"
    )
    return {
        "sessions": len(ids),
        "lines": n,
        "wait_s": wait,
        "finished": len(ids) - stuck,
        "finished_with_output_lost": lost,
        "stuck": stuck,
        "results": results,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--lines", type=int, default=3000)
    ap.add_argument("--wait", type=float, default=30.0)
    ap.add_argument("--image", default=DEFAULT_IMAGE)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--quick", action="store_true", help="accepted for bench.sh; changes nothing")
    ap.add_argument("--chart", type=Path, help="accepted for bench.sh; no chart")
    args = ap.parse_args()
    with Gateway("hwm", image=args.image, env={"KERNELGW_MAX_SESSIONS": str(args.sessions + 2)}) as gw:
        ids = [httpx.post(f"{gw.url}/v1/sessions", json={}, timeout=120).json()["id"] for _ in range(args.sessions)]
        _, conn = session_container(ids[0])
        print("1. raw jupyter_client, reading late:")
        raw = [asyncio.run(raw_probe(conn, n, 1.0)) for n in (500, args.lines)]
        print(f"2. {args.sessions} sessions at once, {args.lines} flushed lines each, over the gateway:")
        gateway = asyncio.run(gateway_probe(gw.url, ids, args.lines, args.wait))
        # Delete the sessions: stuck executions end with them, and the gateway's graceful
        # shutdown (which waits for in-flight requests) is not held up until their timeout.
        t0 = time.perf_counter()
        for sid in ids:
            httpx.delete(f"{gw.url}/v1/sessions/{sid}", timeout=120)
        gateway["delete_all_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "probe_iopub_hwm",
                "date": now_iso(),
                "machine": machine_info(args.image),
                "raw": raw,
                "gateway": gateway,
            },
        )


if __name__ == "__main__":
    main()
