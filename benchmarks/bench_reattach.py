"""Restart -> first successful execute on a reattached session, with N sessions.

A real ``kernelgw serve`` (own name, runtime and data dirs, SQLite history) gets
N sessions with state (``x = 42``), is stopped (SIGTERM, on_shutdown=keep) or
killed (SIGKILL), and started again; timed from the new process's spawn to:
/healthz answering (start-up includes the reattachment: uvicorn binds after the
lifespan), the first ``print(x)`` answering 42, all N answered. Goal: the first
execute within 2 s of the restart with 20 sessions.

Restarts come in rounds of four: SIGTERM and SIGKILL, each once as plain
``python -m kernelgw serve`` (these rows give the verdict) and once under a
probe: the same CLI started by a ``python -c`` wrapper (PROBE below) that wraps
the start-up steps of the gateway's own classes with timers (interpreter start,
imports, app, instance lock, store start, open_sessions, Docker list_kernels,
each session's reattach with its ZMQ connect and kernel_info, flush,
reap_except, uvicorn bind, the first cell sent). Nothing in kernelgw/ changes;
the probed restarts show where the time goes and, next to the plain ones, that
the probe costs little. Also in the same run: ``python -c pass`` and the bare
imports of ``serve`` as floors, and one ``python -X importtime`` of those
imports, summed by top-level package. kernelgw's own .pyc files are written
before timing (``--bytecode compile``, the default), as any install has them: a
checkout run with PYTHONDONTWRITEBYTECODE=1 would compile ~100 modules from
source at every start (``--bytecode as-is`` times that).

    .venv/bin/python benchmarks/bench_reattach.py [--sessions 20] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_IMAGE, DOCS_BENCH, REPO, free_port, machine_info, now_iso, other_activity, write_json

GOAL_S = 2.0
GOAL_SESSIONS = 20

# The imports `kernelgw serve` makes before it builds the app (kernelgw.cli.main, then
# serve()'s own, after it pauses the cyclic collector as serve() does): timed bare,
# without starting anything, as a floor.
SERVE_IMPORTS = (
    "import kernelgw.cli.main, gc; gc.disable(); "
    "import uvicorn, kernelgw.logs, kernelgw.config, kernelgw.server.app, kernelgw.server.serving"
)
# ... and the route modules create_app imports when it is called.
APP_IMPORTS = (
    "import kernelgw.server.auth, kernelgw.server.v1.history, kernelgw.server.v1.routes, kernelgw.server.v1.ws, "
    "kernelgw.server.jupyter.channels, kernelgw.server.jupyter.rest, kernelgw.server.v1.files, "
    "kernelgw.server.v1.packages, kernelgw.server.web"
)
# Seconds to import the route modules after serve's imports; with BLOCK_RFC3987, as in an
# install without jsonschema's optional rfc3987-syntax (it compiles ~40 lark grammars on import).
ROUTES_TIMER = (
    SERVE_IMPORTS + "; import time; t = time.perf_counter(); " + APP_IMPORTS + "; print(time.perf_counter() - t)"
)
BLOCK_RFC3987 = "import sys; sys.modules['rfc3987_syntax'] = None; "
# ... and nbformat (notebook export/import), which create_app imported until 2d70fd6
NBFORMAT_TIMER = (
    SERVE_IMPORTS
    + "; import time; t = time.perf_counter(); import nbformat, nbformat.v4; print(time.perf_counter() - t)"
)

# Runs in the gateway's process instead of `python -m kernelgw serve`: times the
# start-up steps by wrapping the gateway's own methods, then runs the same CLI.
# Every record: {"name", "t0", "t1" (time.time()), ...}; one JSON line each.
PROBE = r"""
import time as _t
T0 = _t.time()
import functools, inspect, json, os, queue, sys
_out = open(os.environ["KGWB_TRACE"], "a", buffering=1)
_serving = [False]
def mark(name, t0, t1=None, **kw):
    _out.write(json.dumps({"name": name, "t0": t0, "t1": t0 if t1 is None else t1, **kw}) + "\n")
mark("interpreter ready", T0)
import kernelgw.cli.main as cli
import gc
gc.disable()  # as serve() does before its imports (its server resumes it once listening)
T1 = _t.time(); mark("import kernelgw.cli.main", T0, T1)
import uvicorn, uvicorn.lifespan.on, kernelgw.logs, kernelgw.config, kernelgw.server.app, kernelgw.server.serving
T2 = _t.time(); mark("import serve modules", T1, T2)
import jupyter_client.asynchronous.client as jac
import kernelgw.runtime.backends.docker as kdocker, kernelgw.runtime.manager as kman, kernelgw.runtime.session as ksess
import kernelgw.runtime.kernel_link as klink, kernelgw.runtime.ownership as kown, kernelgw.server.authenticator as kauth
import kernelgw.storage.store as kstore, kernelgw.storage.database as kdb, kernelgw.storage.queries as kq
import kernelgw.storage.cleanup as kclean
import kernelgw.server.app as kapp
T3 = _t.time(); mark("import (probe's extra)", T2, T3)

def wrap(owner, attr, label, key=None, startup_only=False, only_errors=False, first_only=False):
    orig = getattr(owner, attr)
    done = [False]
    def record(t, err, a, k):
        if (startup_only and _serving[0]) or (only_errors and err is None) or (first_only and done[0]):
            return
        done[0] = True
        extra = key(*a, **k) if key else {}
        if err is not None:
            extra["error"] = err
        mark(label, t, _t.time(), **extra)
    if inspect.iscoroutinefunction(orig):
        async def w(*a, **k):
            t, err = _t.time(), None
            try:
                return await orig(*a, **k)
            except BaseException as e:
                err = type(e).__name__
                raise
            finally:
                record(t, err, a, k)
    else:
        def w(*a, **k):
            t, err = _t.time(), None
            try:
                return orig(*a, **k)
            except BaseException as e:
                err = type(e).__name__
                raise
            finally:
                record(t, err, a, k)
    functools.update_wrapper(w, orig)
    setattr(owner, attr, w)

sid = lambda self, *a, **k: {"sid": self.session_id}
wrap(kapp, "create_app", "create_app")
wrap(kapp, "create_backend", "create_backend")
wrap(uvicorn.Config, "load", "uvicorn Config.load")
wrap(uvicorn.lifespan.on.LifespanOn, "startup", "lifespan")
wrap(kown.InstanceLock, "acquire", "instance lock")
wrap(kstore.Store, "start", "store start")
wrap(kdb.Database, "ensure_ready", "store: open, migrations", startup_only=True)
wrap(kclean.Cleanup, "end_cut_off_executions", "store: end cut-off cells")
wrap(kstore.Store, "purge", "store: purge", startup_only=True)
wrap(kauth.Authenticator, "check_startup", "auth check")
wrap(kman.SessionManager, "reattach", "manager.reattach")
wrap(kman.SessionManager, "_start_pools", "pools")
wrap(kstore.Store, "open_sessions", "open_sessions")
wrap(kq, "reattach_reads", "reattach_reads", startup_only=True)
wrap(kapp, "_prepare_routes", "routes (start-up thread)")
wrap(kstore.Store, "flush", "flush", startup_only=True)
wrap(kstore.Store, "session_lost", "session_lost", key=lambda self, s, *a, **k: {"sid": s})
wrap(kdocker.DockerBackend, "list_kernels", "list_kernels")
wrap(kdocker.DockerBackend, "reap_except", "reap_except")
wrap(kdocker.DockerBackend, "state", "docker inspect (no reply yet)", startup_only=True)
wrap(ksess.KernelSession, "reattach", "session reattach", key=lambda self, *a, **k: {"sid": self.id})
wrap(klink.KernelLink, "_connect", "link connect", key=sid, startup_only=True)
wrap(klink.KernelLink, "_wait_ready", "kernel_info wait", key=sid, startup_only=True)
wrap(jac.AsyncKernelClient, "start_channels", "zmq start_channels", startup_only=True)
wrap(jac.AsyncKernelClient, "get_iopub_msg", "iopub timeout", startup_only=True, only_errors=True)
wrap(jac.AsyncKernelClient, "get_control_msg", "control timeout", startup_only=True, only_errors=True)
wrap(klink.KernelLink, "send", "first cell sent to a kernel", key=sid, first_only=True)

_startup = uvicorn.Server.startup
async def startup(self, *a, **k):
    t = _t.time()
    try:
        return await _startup(self, *a, **k)
    finally:
        _serving[0] = True
        mark("uvicorn startup", t, _t.time())
uvicorn.Server.startup = startup
mark("probe installed", T3, _t.time())
cli.main(args=sys.argv[1:], prog_name="kernelgw")
"""


# ------------------------------------------------------------------ gateway


class Restarter:
    """One gateway name, data and runtime directory, restarted again and again."""

    def __init__(self, image: str, work: Path) -> None:
        self.name = f"brt{os.getpid()}"[:16]
        self.image, self.work = image, work
        self.data, self.runtime_dir = work / "data", Path(f"/tmp/kgwb{os.getpid()}")
        self.log = work / "gateway.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self, trace: Path | None = None) -> float:
        """Start the gateway (under the probe when ``trace``); returns time.time() just before."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELGW_")}
        env.update(
            KERNELGW_GATEWAY_NAME=self.name,
            KERNELGW_IMAGE=self.image,
            KERNELGW_RUNTIME_DIR=str(self.runtime_dir),
            KERNELGW_DATA_DIR=str(self.data),
            KERNELGW_MEMORY_MB="256",
            KERNELGW_MAX_SESSIONS="100",
            KERNELGW_POOL_SIZE="0",
            KERNELGW_LOG_FORMAT="text",
        )
        if trace is None:
            argv = [sys.executable, "-m", "kernelgw", "serve", "--port", str(self.port)]
        else:
            env["KGWB_TRACE"] = str(trace)
            argv = [sys.executable, "-c", PROBE, "serve", "--port", str(self.port)]
        with self.log.open("ab") as out:
            t = time.time()
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=out, cwd=REPO)
        return t

    def wait_healthy(self, deadline_s: float = 180) -> float:
        assert self.proc is not None
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return time.time()
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited while starting:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.01)
        raise TimeoutError("the gateway did not start")

    def cpu_s(self) -> float:
        """The gateway's CPU seconds so far (user + system, all threads): beside the
        wall times, a measure a busy machine inflates far less."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 3)

    def stop(self, how: str) -> float:
        """SIGTERM or SIGKILL; returns seconds until the process was gone."""
        assert self.proc is not None
        t = time.time()
        self.proc.send_signal(getattr(signal, how))
        self.proc.wait(timeout=300)
        return time.time() - t

    def print_x(self, sid: str) -> float:
        body = httpx.post(f"{self.url}/v1/sessions/{sid}/execute", json={"code": "print(x)"}, timeout=120).json()
        if body.get("status") != "ok" or "42" not in json.dumps(body.get("events", body)):
            raise RuntimeError(f"print(x) on {sid}: {body}")
        return time.time()

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        client = docker.from_env()
        try:
            label = {"label": f"kernelgw.gateway={self.name}"}
            for c in client.containers.list(all=True, filters=label):
                c.remove(force=True, v=True)
            for volume in client.volumes.list(filters=label):  # the sessions' workspace volumes
                volume.remove(force=True)
        finally:
            client.close()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


# ------------------------------------------------------------------ phases


def phases(trace: list[dict[str, Any]], spawn: float, healthy: float, first: float, all_: float) -> dict[str, Any]:
    """Seconds per start-up step, in order, from the probe's records; the steps
    tile the interval spawn -> all answered (gaps are named 'other')."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in trace:
        by[r["name"]].append(r)

    def one(name: str) -> dict[str, Any] | None:
        return by[name][0] if by.get(name) else None

    def dur(name: str) -> float:
        return sum(r["t1"] - r["t0"] for r in by.get(name, []))

    ready = one("interpreter ready")
    probe = one("probe installed")
    life, startup = one("lifespan"), one("uvicorn startup")
    reatt = one("manager.reattach")
    cre = one("create_app")
    if not (ready and probe and cre and life and startup and reatt):
        return {"error": "incomplete trace: " + ", ".join(sorted(by))}

    def inlife(name: str) -> float:  # only the lifespan's calls (the CLI makes some before)
        return sum(r["t1"] - r["t0"] for r in by.get(name, []) if r["t0"] >= life["t0"])

    sess = by.get("session reattach", [])
    s_durs = sorted(r["t1"] - r["t0"] for r in sess)
    store_start = by["store start"][-1] if by.get("store start") else None  # the lifespan's (the CLI's is first)
    sess_end = max((r["t1"] for r in sess), default=reatt["t0"])
    steps: list[tuple[str, float]] = [
        ("interpreter start (fork/exec, site, .pth)", ready["t0"] - spawn),
        ("imports of kernelgw serve", dur("import kernelgw.cli.main") + dur("import serve modules")),
        ("probe's own imports and wrappers", probe["t1"] - probe["t0"] + dur("import (probe's extra)")),
        ("settings, CLI checks (store + auth, once more)", cre["t0"] - probe["t1"]),
        ("create_app (routes: in the lifespan's thread)", cre["t1"] - cre["t0"]),
        ("uvicorn config", life["t0"] - cre["t1"]),
        ("instance lock", inlife("instance lock")),
        ("store start (open, migrations, clean-up)", inlife("store start")),
        ("auth check", inlife("auth check")),
        ("open_sessions (rows + replay cells)", inlife("open_sessions")),
        ("Docker list_kernels", inlife("list_kernels")),
    ]
    # the sessions' reattach run concurrently: wall time from the first start to the last end
    if sess:
        steps.append(("sessions reattach (concurrent, wall)", max(r["t1"] for r in sess) - min(r["t0"] for r in sess)))
    steps += [
        ("flush (seq reservations)", sum(r["t1"] - r["t0"] for r in by.get("flush", []) if r["t0"] >= sess_end)),
        ("reap_except", inlife("reap_except")),
    ]
    known_life = sum(s for name, s in steps[6:])
    steps.append(("rest of the lifespan", (life["t1"] - life["t0"]) - known_life))
    steps += [
        ("uvicorn bind (startup after the lifespan)", startup["t1"] - life["t1"]),
        ("until the client saw /healthz", healthy - startup["t1"]),
        ("first execute (healthy -> first answered)", first - healthy),
        ("the other sessions' executes", all_ - first),
    ]
    sent = one("first cell sent to a kernel")
    return {
        "steps": [{"step": n, "s": round(s, 4)} for n, s in steps],
        "total_s": round(all_ - spawn, 4),
        "first_s": round(first - spawn, 4),
        "sessions": {
            "n": len(sess),
            "failed": sum(1 for r in sess if r.get("error")),
            "first_start_s": round(min((r["t0"] for r in sess), default=spawn) - spawn, 4),
            "last_end_s": round(max((r["t1"] for r in sess), default=spawn) - spawn, 4),
            "each_p50_s": round(statistics.median(s_durs), 4) if s_durs else None,
            "each_max_s": round(max(s_durs), 4) if s_durs else None,
            "each_min_s": round(min(s_durs), 4) if s_durs else None,
            "kernel_info_wait_p50_s": _median(by.get("kernel_info wait", [])),
            "zmq_start_channels_total_s": round(dur("zmq start_channels"), 4),
            "iopub_timeouts": len(by.get("iopub timeout", [])),
            "control_timeouts": len(by.get("control timeout", [])),
            "docker_inspects": len(by.get("docker inspect (no reply yet)", [])),
        },
        "store": {
            "open_migrations_s": round(inlife("store: open, migrations"), 4),
            "end_cut_off_s": round(inlife("store: end cut-off cells"), 4),
            "purge_s": round(inlife("store: purge"), 4),
            "cli_check_s": round(sum(r["t1"] - r["t0"] for r in by.get("store start", []) if r["t0"] < life["t0"]), 4),
            "total_s": round(store_start["t1"] - store_start["t0"], 4) if store_start else None,
            "reattach_reads_s": round(dur("reattach_reads"), 4),
        },
        "start_up_thread": {  # beside the lifespan's steps, not in series with them
            "create_backend_s": round(inlife("create_backend"), 4),
            "routes_s": round(dur("routes (start-up thread)"), 4),
        },
        "first_execute": {
            "request_to_kernel_s": round(sent["t0"] - healthy, 4) if sent else None,
            "kernel_and_reply_s": round(first - sent["t0"], 4) if sent else None,
        },
    }


def _median(records: list[dict[str, Any]]) -> float | None:
    return round(statistics.median(r["t1"] - r["t0"] for r in records), 4) if records else None


def timed_run(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, cwd=REPO, capture_output=True)
    return time.perf_counter() - t


def route_imports(times: int = 3) -> dict[str, list[float]]:
    """create_app's route imports, timed in fresh interpreters: as installed, and with
    rfc3987_syntax blocked (jsonschema then skips the formats that need it)."""
    out: dict[str, list[float]] = {}
    for _ in range(times):
        for label, code in (
            ("as installed", ROUTES_TIMER),
            ("rfc3987_syntax blocked", BLOCK_RFC3987 + ROUTES_TIMER),
            ("import nbformat, as installed", NBFORMAT_TIMER),
            ("import nbformat, rfc3987_syntax blocked", BLOCK_RFC3987 + NBFORMAT_TIMER),
        ):
            proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
            out.setdefault(label, []).append(round(float(proc.stdout.split()[-1]), 4))
    return out


def importtime_by_package(top: int = 14) -> list[dict[str, Any]]:
    """One ``python -X importtime`` of serve's imports: self time summed by top-level package."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"{SERVE_IMPORTS}; {APP_IMPORTS}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    by: dict[str, int] = defaultdict(int)
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            by[m.group(4).split(".")[0]] += int(m.group(1))
    total = sum(by.values())
    rows = [{"package": k, "self_ms": round(v / 1000, 1)} for k, v in sorted(by.items(), key=lambda kv: -kv[1])]
    return [*rows[:top], {"package": "(all, under -X importtime)", "self_ms": round(total / 1000, 1)}]


def kernelgw_bytecode(compile_first: bool) -> dict[str, Any]:
    """How many of the tree's kernelgw modules lack current bytecode, and whether they
    were compiled before timing. A checkout run with PYTHONDONTWRITEBYTECODE=1 (this
    machine's default) compiles each from source at every start: 0.1-0.2 s of a
    restart that no install pays (pip and the gateway image write the .pyc files)."""
    import importlib.util

    def stale() -> int:
        n = 0
        for source in (REPO / "kernelgw").rglob("*.py"):
            cached = Path(importlib.util.cache_from_source(str(source)))
            try:
                header = cached.read_bytes()[8:16]
            except OSError:
                n += 1
                continue
            st = source.stat()
            if header != (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(
                4, "little"
            ):
                n += 1
        return n

    before = stale()
    if compile_first and before:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "kernelgw")], check=True)
    return {
        "modules": sum(1 for _ in (REPO / "kernelgw").rglob("*.py")),
        "stale_or_missing": before,
        "compiled_first": compile_first,
    }


# ------------------------------------------------------------------ the run


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.sessions
    work = Path(tempfile.mkdtemp(prefix="kgwb-reattach-"))
    gw = Restarter(args.image, work)
    restarts: list[dict[str, Any]] = []
    floors: dict[str, list[float]] = {"python -c pass": [], "serve's imports only": []}
    try:
        gw.spawn()
        gw.wait_healthy()
        with ThreadPoolExecutor(n) as pool:
            t = time.time()

            def create(_: int) -> str:
                r = httpx.post(f"{gw.url}/v1/sessions", json={}, timeout=300)
                r.raise_for_status()
                return str(r.json()["id"])

            sids = list(pool.map(create, range(n)))
            for r in pool.map(
                lambda s: httpx.post(f"{gw.url}/v1/sessions/{s}/execute", json={"code": "x = 42"}, timeout=120), sids
            ):
                r.raise_for_status()
            print(f"{n} sessions created and set x = 42 in {time.time() - t:.1f} s")
            plan = [
                (how, probed) for _ in range(args.rounds) for how in ("SIGTERM", "SIGKILL") for probed in (False, True)
            ]
            for i, (how, probed) in enumerate(plan):
                floors["python -c pass"].append(timed_run([sys.executable, "-c", "pass"]))
                floors["serve's imports only"].append(timed_run([sys.executable, "-c", SERVE_IMPORTS]))
                load = [round(x, 2) for x in os.getloadavg()]
                stop_s = gw.stop(how)
                trace_path = work / f"trace{i}.jsonl" if probed else None
                spawn = gw.spawn(trace_path)
                healthy = gw.wait_healthy()
                first = gw.print_x(sids[0])
                cpu_first = gw.cpu_s()
                rest = list(pool.map(gw.print_x, sids[1:]))
                all_ = max([first, *rest])
                warm = gw.print_x(sids[0]) - all_  # an execute on a settled gateway, for comparison
                listed = len(httpx.get(f"{gw.url}/v1/sessions", timeout=30).json()["sessions"])
                row: dict[str, Any] = {
                    "kind": how,
                    "probed": probed,
                    "sessions_listed": listed,
                    "stop_s": round(stop_s, 3),
                    "healthy_s": round(healthy - spawn, 3),
                    "first_s": round(first - spawn, 3),
                    "all_s": round(all_ - spawn, 3),
                    "first_execute_s": round(first - healthy, 3),
                    "later_execute_s": round(warm, 4),
                    "cpu_to_first_s": cpu_first,
                    "loadavg": load,
                }
                if trace_path is not None:
                    trace = [json.loads(line) for line in trace_path.read_text().splitlines() if line.strip()]
                    row["phases"] = phases(trace, spawn, healthy, first, all_)
                restarts.append(row)
                print(
                    f"{how:<8} {'probed' if probed else 'plain':<7} listed {listed:>3}  stop {stop_s:5.2f} s  "
                    f"healthy {row['healthy_s']:6.2f}  first {row['first_s']:6.2f}  all {row['all_s']:6.2f} s  "
                    f"cpu {cpu_first:5.2f} s  load {load[0]:.2f}",
                    flush=True,
                )
        gw.stop("SIGTERM")
    finally:
        gw.cleanup()
        log_tail = gw.log.read_text(errors="replace")[-4000:] if gw.log.exists() else ""
        shutil.rmtree(work, ignore_errors=True)
    return {
        "restarts": restarts,
        "sessions": n,
        "floors_s": {k: [round(x, 4) for x in v] for k, v in floors.items()},
        "log_tail": log_tail if any(r["sessions_listed"] != n for r in restarts) else "",
    }


def summarize(out: dict[str, Any]) -> dict[str, Any]:
    """Per restart kind (plain restarts only: the verdict's rows): median and max."""
    kinds: dict[str, dict[str, Any]] = {}
    for kind in ("SIGTERM", "SIGKILL"):
        rs = [r for r in out["restarts"] if r["kind"] == kind and not r["probed"]]
        if not rs:
            continue
        kinds[kind] = {"n": len(rs)}
        for f in ("stop_s", "healthy_s", "first_s", "all_s", "first_execute_s", "later_execute_s", "cpu_to_first_s"):
            vals = [r[f] for r in rs]
            kinds[kind][f] = {"p50": round(statistics.median(vals), 3), "max": round(max(vals), 3)}
        kinds[kind]["all_listed"] = all(r["sessions_listed"] == out["sessions"] for r in rs)
    plain = [r for r in out["restarts"] if not r["probed"]]
    met = (
        bool(plain)
        and out["sessions"] >= GOAL_SESSIONS
        and all(r["first_s"] < GOAL_S and r["sessions_listed"] == out["sessions"] for r in plain)
    )
    # the probed restarts' steps, median over them
    probed = [r["phases"] for r in out["restarts"] if r["probed"] and "steps" in r.get("phases", {})]
    breakdown = []
    if probed:
        for i, step in enumerate(probed[0]["steps"]):
            vals = [p["steps"][i]["s"] for p in probed]
            breakdown.append({"step": step["step"], "p50_s": round(statistics.median(vals), 4), "max_s": max(vals)})
    return {
        "goal_s": GOAL_S,
        "goal_sessions": GOAL_SESSIONS,
        "met": met,
        "worst_first_s": max((r["first_s"] for r in plain), default=None),
        "by_kind": kinds,
        "breakdown": breakdown,
        "breakdown_from": len(probed),
    }


def print_report(result: dict[str, Any]) -> None:
    s = result["summary"]
    print(f"\n{result['sessions']} sessions; seconds from the new process's spawn (includes Python start-up)")
    bc = result["bytecode"]
    print(
        f"kernelgw bytecode: {bc['stale_or_missing']} of {bc['modules']} modules stale or missing, "
        + ("compiled before timing" if bc["compiled_first"] else "timed as is")
    )
    print(f"{'restart':<10} {'probe':<6} {'listed':>6} {'stop':>6} {'healthy':>8} {'first':>7} {'all':>7}  load")
    for r in result["restarts"]:
        print(
            f"{r['kind']:<10} {'yes' if r['probed'] else 'no':<6} {r['sessions_listed']:>6} {r['stop_s']:>6.2f} "
            f"{r['healthy_s']:>8.2f} {r['first_s']:>7.2f} {r['all_s']:>7.2f}  {r['loadavg'][0]:.2f}"
        )
    print(
        f"\ngoal: first execute < {GOAL_S:g} s with {GOAL_SESSIONS} sessions: "
        f"{'MET' if s['met'] else 'MISSED'} (worst plain restart {s['worst_first_s']} s)"
    )
    if s["breakdown"]:
        print(f"\nwhere the time goes (median of {s['breakdown_from']} probed restarts), seconds:")
        for b in s["breakdown"]:
            print(f"  {b['step']:<46} {b['p50_s']:>7.3f}   (max {b['max_s']:.3f})")
    fl = result["floors_s"]
    print(
        "\nfloors: "
        + ", ".join(f"{k} p50 {statistics.median(v):.3f} s" for k, v in fl.items() if v)
        + f"; load average {' '.join(str(x) for x in result['activity_end']['loadavg'])}"
    )
    print(
        "create_app's route imports, s: "
        + "; ".join(f"{k}: {', '.join(f'{x:.2f}' for x in v)}" for k, v in result["route_imports_s"].items())
    )
    print("\nimport self time by package (ms, one -X importtime run of serve's and create_app's imports):")
    for r in result["importtime"]:
        print(f"  {r['package']:<28} {r['self_ms']:>8.1f}")


def draw(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = result["restarts"]
    s = result["summary"]
    fig, (ax, bx) = plt.subplots(
        2, 1, figsize=(9, 3.2 + 0.32 * max(1, len(s["breakdown"]))), gridspec_kw={"height_ratios": [3, 4]}
    )
    labels = [f"{r['kind']}\n{'probed' if r['probed'] else 'plain'}" for r in rs]
    x = list(range(len(rs)))
    w = 0.27
    for off, field, color, name in (
        (-w, "healthy_s", "#9ab", "/healthz"),
        (0, "first_s", "#3572A5", "first print(x)"),
        (w, "all_s", "#c73", f"all {result['sessions']} answered"),
    ):
        vals = [r[field] for r in rs]
        ax.bar([i + off for i in x], vals, w, color=color, label=name)
    ax.axhline(GOAL_S, color="#a00", ls="--", lw=1)
    ax.text(-0.45, GOAL_S, f"goal {GOAL_S:g} s", color="#a00", va="bottom", ha="left", fontsize=8)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("seconds from spawn", fontsize=8)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(
        f"Restart with {result['sessions']} sessions -> reattached sessions answer "
        f"({result['date'][:10]}, {result['machine']['cores']} cores)",
        fontsize=9,
        loc="left",
    )
    ax.grid(axis="y", alpha=0.3)
    bd = s["breakdown"]
    if bd:
        left = 0.0
        names = [b["step"] for b in bd]
        for i, b in enumerate(bd):
            bx.barh(i, b["p50_s"], left=left, color="#3572A5" if b["p50_s"] >= 0.1 else "#9ab")
            bx.text(left + max(b["p50_s"], 0) + 0.03, i, f"{b['p50_s']:.2f} s", va="center", fontsize=7)
            left += max(0.0, b["p50_s"])
        bx.axvline(GOAL_S, color="#a00", ls="--", lw=1)
        bx.set_yticks(range(len(bd)), names, fontsize=7)
        bx.invert_yaxis()
        bx.set_xlabel("seconds from spawn (median of the probed restarts; steps in order)", fontsize=8)
        bx.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=GOAL_SESSIONS)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of SIGTERM/SIGKILL x plain/probed restarts")
    parser.add_argument("--quick", action="store_true", help="--rounds 1 (still 20 sessions: the goal's number)")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument(
        "--bytecode",
        choices=["compile", "as-is"],
        default="compile",
        help="compile kernelgw's missing or stale .pyc files before timing, as an install has them "
        "(default), or time the tree as it is (with PYTHONDONTWRITEBYTECODE=1, from source at every start)",
    )
    parser.add_argument("--json", type=Path, default=DOCS_BENCH / "reattach.json")
    parser.add_argument("--chart", type=Path, default=DOCS_BENCH / "reattach.png")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    machine = machine_info(args.image)
    bytecode = kernelgw_bytecode(args.bytecode == "compile")
    date = now_iso()
    out = run(args)
    result = {
        "benchmark": "reattach",
        "date": date,
        "machine": machine,
        "args": vars(args) | {"json": str(args.json), "chart": str(args.chart)},
        "bytecode": bytecode,
        **out,
        "importtime": importtime_by_package(),
        "route_imports_s": route_imports(),
        "activity_end": other_activity(),
    }
    result["summary"] = summarize(result)
    print_report(result)
    if args.json:
        write_json(args.json, result)
    if args.chart:
        draw(result, args.chart)
        print(f"wrote {args.chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
