"""Shared pieces of the benchmark scripts (not a test helper; nothing here is timed by pytest).

- `Gateway`: ``python -m kernelgw serve`` in its own process with ``KERNELGW_*``
  overrides, its own gateway name, runtime and data directories; stopped with
  SIGTERM (the gateway removes its sessions' containers itself).
- `WsConn`, `rest_execute`, `RawKernel`: one execution over the WebSocket, over
  blocking REST, or straight to the kernel's ZMQ sockets (the floor).
- `llm_sandbox_configs`: how llm-sandbox is pointed at the same local image.
- `summary`, `print_table`, `draw_bars`: percentiles, the p50/p95/p99 table with
  the ratio to a floor, and a horizontal bar chart (p50 bar, p95/p99 markers).
- `machine_info`, `container_memory`, `proc_status_kib`, `write_json`.

Every script runs against one machine and one image in one run; rows that are
compared with each other are interleaved in rounds so load drift hits all alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
DOCS_BENCH = REPO / "docs" / "bench"
DEFAULT_IMAGE = "kernelgw/python:latest"
KERNEL_PYTHON = "/opt/kernel/bin/python"


# ------------------------------------------------------------------ statistics


def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile, linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(name: str, samples_ms: Sequence[float], **extra: Any) -> dict[str, Any]:
    """A table row: n, p50/p95/p99/mean/min/max in ms, plus any extra fields."""
    samples = list(samples_ms)
    row: dict[str, Any] = {"name": name, "n": len(samples)}
    if samples:
        row.update(
            p50_ms=pct(samples, 50),
            p95_ms=pct(samples, 95),
            p99_ms=pct(samples, 99),
            mean_ms=statistics.fmean(samples),
            min_ms=min(samples),
            max_ms=max(samples),
        )
    row.update(extra)
    return row


def failed_row(name: str, error: BaseException | str, **extra: Any) -> dict[str, Any]:
    """A row for something that could not run here: the error is the result."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return {"name": name, "n": 0, "error": " ".join(text.split())[:400], **extra}


# ---------------------------------------------------------------------- tables


def _fmt_ms(v: float | None) -> str:
    if v is None or v != v:  # None or NaN
        return ""
    if v >= 10_000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.2f}"


def table_lines(
    rows: Sequence[dict[str, Any]],
    floor: str | None = None,
    *,
    floor_label: str = "floor",
    name_width: int | None = None,
) -> list[str]:
    """A markdown table: n, p50/p95/p99 ms, p50 minus the floor's p50, p50 / floor p50.

    ``floor`` names the row the others are compared with (None: no ratio columns).
    Rows with an ``error`` show it instead of numbers."""
    base = next((r for r in rows if r["name"] == floor and r.get("n")), None)
    width = name_width or max(12, *(len(r["name"]) for r in rows))
    cols = ["n", "p50 ms", "p95 ms", "p99 ms"]
    if floor is not None:
        cols += [f"p50 - {floor_label}", f"p50 / {floor_label}"]
    widths = [max(9, len(c)) for c in cols]
    header = (
        f"| {'measurement':<{width}} | " + " | ".join(f"{c:>{w}}" for c, w in zip(cols, widths, strict=True)) + " |"
    )
    lines = [header, "|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|"]
    for r in rows:
        if r.get("error") or not r.get("n"):
            msg = f"not measured: {r.get('error', 'no samples')}"
            lines.append(f"| {r['name']:<{width}} | {msg} |" + " |" * (len(cols) - 1))
            continue
        cells = [str(r["n"]), _fmt_ms(r["p50_ms"]), _fmt_ms(r["p95_ms"]), _fmt_ms(r["p99_ms"])]
        if floor is not None:
            if base is None:
                cells += ["", ""]
            else:
                delta = r["p50_ms"] - base["p50_ms"]
                ratio = r["p50_ms"] / base["p50_ms"] if base["p50_ms"] else float("nan")
                cells += [f"{delta:+.2f} ms" if abs(delta) < 100 else f"{delta:+,.0f} ms", f"{ratio:.2f}x"]
        lines.append(
            f"| {r['name']:<{width}} | " + " | ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)) + " |"
        )
    return lines


def print_table(title: str, rows: Sequence[dict[str, Any]], floor: str | None = None, **kw: Any) -> None:
    print(f"\n{title}\n")
    for line in table_lines(rows, floor, **kw):
        print(line)
    sys.stdout.flush()


# ---------------------------------------------------------------------- charts


def draw_bars(
    groups: Sequence[tuple[str, Sequence[dict[str, Any]]]],
    path: Path,
    *,
    title: str,
    xlabel: str = "milliseconds (bar: p50; marks: p95 |, p99 x; log scale)",
    log: bool = True,
    floor_names: Iterable[str] = (),
) -> None:
    """Horizontal bars (p50) with p95/p99 marks, one panel per group of rows.

    Rows without samples are listed with 'not measured' instead of a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    floors = set(floor_names)
    heights = [max(1, len(rows)) for _, rows in groups]
    fig, axes = plt.subplots(
        len(groups),
        1,
        figsize=(9, 0.9 + 0.38 * sum(heights) + 0.45 * len(groups)),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for ax, (gtitle, rows) in zip(axes[:, 0], groups, strict=True):
        names = [r["name"] for r in rows]
        y = list(range(len(rows)))
        measured = [r for r in rows if r.get("n")]
        xmax = max((r["p99_ms"] for r in measured), default=1.0)
        xmin = min((r["p50_ms"] for r in measured), default=1.0)
        for i, r in enumerate(rows):
            if not r.get("n"):
                ax.text(xmin if log else 0, i, "  not measured (see table)", va="center", fontsize=8, color="#a00")
                continue
            color = "#888888" if r["name"] in floors else "#3572A5"
            ax.barh(i, r["p50_ms"], color=color, height=0.6)
            ax.plot([r["p95_ms"]], [i], marker="|", color="black", markersize=12)
            ax.plot([r["p99_ms"]], [i], marker="x", color="black", markersize=5)
            ax.text(r["p99_ms"] * (1.08 if log else 1.02), i, _fmt_ms(r["p50_ms"]), va="center", fontsize=7)
        ax.set_yticks(y, names, fontsize=8)
        ax.invert_yaxis()
        if log:
            ax.set_xscale("log")
            ax.set_xlim(xmin / 2, xmax * 4)
        else:
            ax.set_xlim(0, xmax * 1.2)
        ax.set_title(gtitle, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3, which="both")
    axes[-1, 0].set_xlabel(xlabel, fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ the machine


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def mem_total_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def meminfo_kib(field: str = "MemAvailable") -> int:
    m = re.search(rf"^{field}:\s+(\d+) kB", _read("/proc/meminfo"), re.M)
    return int(m.group(1)) if m else 0


def machine_info(image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    """Cores, RAM, kernel, Docker version and runtime, cgroup version, image: for the report."""
    import docker

    cpu = re.search(r"^model name\s*:\s*(.+)$", _read("/proc/cpuinfo"), re.M)
    os_name = re.search(r'^PRETTY_NAME="?([^"\n]+)', _read("/etc/os-release"), re.M)
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu": cpu.group(1).strip() if cpu else platform.processor(),
        "ram_gib": round(mem_total_gib(), 1),
        "kernel": platform.release(),
        "os": os_name.group(1) if os_name else platform.platform(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    info["activity_start"] = other_activity()
    try:
        git = ["git", "-C", str(REPO)]
        info["kernelgw_commit"] = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            [*git, "status", "--porcelain", "--", "kernelgw"], capture_output=True, text=True, check=True
        ).stdout.split("\n")
        info["kernelgw_uncommitted"] = sorted(line[3:] for line in changed if line.strip())
    except (OSError, subprocess.CalledProcessError):
        pass
    try:
        dc = docker.from_env()
        ver, dinfo = dc.version(), dc.info()
        img = dc.images.get(image)
        info.update(
            docker_version=ver.get("Version"),
            docker_runtime=dinfo.get("DefaultRuntime"),
            cgroup_version=dinfo.get("CgroupVersion"),
            storage_driver=dinfo.get("Driver"),
            image=image,
            image_id=img.id[7:19],
            image_size_mb=round(img.attrs.get("Size", 0) / 1e6),
        )
        dc.close()
    except Exception as exc:
        info["docker_error"] = str(exc)
    return info


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m.get('cores')} cores ({m.get('cpu')}), {m.get('ram_gib')} GiB, {m.get('os')}, "
        f"kernel {m.get('kernel')}, Docker {m.get('docker_version')} ({m.get('docker_runtime')}, "
        f"cgroup v{m.get('cgroup_version')}), Python {m.get('python')}, image {m.get('image')} "
        f"({m.get('image_id')})"
    )


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def other_activity() -> dict[str, Any]:
    """What else runs on the machine (it would skew the numbers): load average, containers
    that no benchmark gateway or llm-sandbox session of ours made, pytest processes."""
    import docker

    out: dict[str, Any] = {"loadavg": [round(x, 2) for x in os.getloadavg()]}
    try:
        dc = docker.from_env()
        foreign = [
            c.name
            for c in dc.containers.list()
            if not c.labels.get("kernelgw.gateway", "").startswith("b") and LLMSB_LABEL not in c.labels
        ]
        dc.close()
        out["other_containers"] = len(foreign)
    except Exception:
        pass
    me = os.getpid()
    procs = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != me:
            try:
                if b"pytest" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    procs += 1
            except OSError:
                pass
    out["pytest_processes"] = procs
    return out


def write_json(path: Path, data: dict[str, Any]) -> None:
    data.setdefault("activity_end", other_activity())
    data.setdefault("finished", now_iso())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"\nwrote {path}")


# --------------------------------------------------------------------- memory


def proc_status_kib(pid: int, field: str = "VmRSS") -> int:
    m = re.search(rf"^{field}:\s+(\d+) kB", _read(f"/proc/{pid}/status"), re.M)
    return int(m.group(1)) if m else 0


def process_tree_rss_kib(pid: int) -> int:
    """RSS of a process and its descendants (the gateway forks nothing today; this checks)."""
    total = proc_status_kib(pid)
    for child in _read(f"/proc/{pid}/task/{pid}/children").split():
        total += process_tree_rss_kib(int(child))
    return total


def container_memory(container_id: str) -> dict[str, int]:
    """A container's memory from its cgroup (v1 sysfs, else v2, else the engine's stats API).

    usage: memory.usage_in_bytes (everything charged, page cache and tmpfs included);
    working_set: usage minus inactive file pages (what `docker stats` shows);
    rss: anonymous memory; shmem: tmpfs and shared memory."""
    v1 = Path("/sys/fs/cgroup/memory/docker") / container_id
    if (v1 / "memory.usage_in_bytes").exists():
        usage = int((v1 / "memory.usage_in_bytes").read_text())
        stat = dict(line.split() for line in (v1 / "memory.stat").read_text().splitlines())
        inactive = int(stat.get("total_inactive_file", 0))
        return {
            "usage": usage,
            "working_set": max(0, usage - inactive),
            "rss": int(stat.get("total_rss", 0)),
            "cache": int(stat.get("total_cache", 0)),
            "shmem": int(stat.get("total_shmem", 0)),
            "source": "cgroup-v1",
        }  # type: ignore[dict-item]
    for v2 in (
        Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope"),
        Path("/sys/fs/cgroup/docker") / container_id,
    ):
        if (v2 / "memory.current").exists():
            usage = int((v2 / "memory.current").read_text())
            stat = dict(line.split() for line in (v2 / "memory.stat").read_text().splitlines())
            inactive = int(stat.get("inactive_file", 0))
            return {
                "usage": usage,
                "working_set": max(0, usage - inactive),
                "rss": int(stat.get("anon", 0)),
                "cache": int(stat.get("file", 0)),
                "shmem": int(stat.get("shmem", 0)),
                "source": "cgroup-v2",
            }  # type: ignore[dict-item]
    import docker

    dc = docker.from_env()
    try:
        s = dc.api.stats(container_id, stream=False)["memory_stats"]
    finally:
        dc.close()
    st = s.get("stats", {})
    inactive = st.get("total_inactive_file", st.get("inactive_file", 0))
    return {
        "usage": s.get("usage", 0),
        "working_set": s.get("usage", 0) - inactive,
        "rss": st.get("total_rss", st.get("anon", 0)),
        "cache": st.get("total_cache", st.get("file", 0)),
        "shmem": st.get("total_shmem", st.get("shmem", 0)),
        "source": "docker-stats",
    }  # type: ignore[dict-item]


class CpuMeter:
    """CPU time of the gateway process, of containers (cgroup cpuacct) and of the whole
    machine over an interval: `start()`, then `stop()` gives each as a share of one core."""

    def __init__(self, pid: int | None = None, containers: dict[str, str] | None = None) -> None:
        self.pid, self.containers = pid, containers or {}
        self._t0 = 0.0
        self._snap: dict[str, float] = {}

    @staticmethod
    def _proc(pid: int) -> float:
        fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[-1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    @staticmethod
    def _container(cid: str) -> float:
        for base in ("/sys/fs/cgroup/cpu,cpuacct/docker", "/sys/fs/cgroup/cpuacct/docker"):
            text = _read(f"{base}/{cid}/cpuacct.usage")
            if text:
                return int(text) / 1e9
        m = re.search(r"^usage_usec (\d+)", _read(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"), re.M)
        return int(m.group(1)) / 1e6 if m else float("nan")

    @staticmethod
    def _machine() -> tuple[float, float]:
        vals = [int(x) for x in _read("/proc/stat").splitlines()[0].split()[1:]]
        idle = vals[3] + vals[4]
        return (sum(vals) - idle) / os.sysconf("SC_CLK_TCK"), sum(vals) / os.sysconf("SC_CLK_TCK")

    def _take(self) -> dict[str, float]:
        snap = {f"container:{k}": self._container(v) for k, v in self.containers.items()}
        if self.pid:
            snap["gateway"] = self._proc(self.pid)
        snap["machine_busy"], snap["machine_total"] = self._machine()
        return snap

    def start(self) -> None:
        self._t0, self._snap = time.perf_counter(), self._take()

    def stop(self) -> dict[str, float]:
        """Cores used on average: gateway, each container, and the machine (of os.cpu_count())."""
        wall = time.perf_counter() - self._t0
        now = self._take()
        out = {k: (now[k] - self._snap[k]) / wall for k in now if not k.startswith("machine")}
        out["machine"] = (now["machine_busy"] - self._snap["machine_busy"]) / wall
        out["seconds"] = wall
        return out


# -------------------------------------------------------------------- gateway


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    """``python -m kernelgw serve`` in its own process, as in production: the
    benchmark's client never shares a GIL or an event loop with the gateway.

    ``env`` adds KERNELGW_* settings (e.g. ``{"KERNELGW_POOL_SIZE": "2"}``). Each
    gateway gets its own name (its orphan clean-up only touches its own
    containers), runtime directory and a throwaway data directory (history)."""

    def __init__(
        self, name: str, *, image: str = DEFAULT_IMAGE, env: dict[str, str] | None = None, port: int | None = None
    ) -> None:
        self.name = name
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._data = tempfile.mkdtemp(prefix=f"kgwb-{name}-")
        self.env = {
            "KERNELGW_GATEWAY_NAME": f"b{name}"[:16],
            "KERNELGW_RUNTIME_DIR": "/tmp/kgwb",
            "KERNELGW_DATA_DIR": self._data,
            "KERNELGW_IMAGE": image,
            "KERNELGW_MAX_SESSIONS": "100",
            **(env or {}),
        }
        self.log_path = Path(self._data) / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.command: list[str] = ["-m", "kernelgw"]
        """What follows the interpreter on the command line before ``serve --port N``
        (a subclass may run the CLI under a ``-c`` wrapper that measures something)."""

    def start(self, timeout: float = 90) -> Gateway:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELGW_")}
        full_env.update(self.env)
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, *self.command, "serve", "--port", str(self.port)],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = httpx.get(f"{self.url}/healthz", timeout=2)
                if r.status_code == 200:
                    return self
                raise RuntimeError(f"gateway unhealthy: {r.text}")
            except httpx.TransportError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the gateway did not start; see {self.log_path}:\n" + self.log_path.read_text()[-2000:]
                    ) from None
                time.sleep(0.1)

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # show what the gateway said before it is stopped
            with contextlib.suppress(OSError):
                sys.stderr.write(
                    f"--- gateway log ({self.log_path}), last lines:\n" + self.log_path.read_text()[-4000:] + "\n---\n"
                )
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def ws_url(self, sid: str) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/sessions/{sid}/ws"

    def rss_kib(self) -> int:
        return process_tree_rss_kib(self.pid)

    def metrics(self) -> dict[str, float] | None:
        """``GET /metrics`` as {name{labels}: value}; None when the gateway has no /metrics."""
        try:
            r = httpx.get(f"{self.url}/metrics", timeout=10)
        except httpx.TransportError:
            return None
        if r.status_code != 200:
            return None
        out: dict[str, float] = {}
        for line in r.text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    out[key] = float(value)
        return out

    def metric(self, prefix: str) -> float | None:
        """The sum of all samples whose name starts with ``prefix`` (a counter's ``_total`` too)."""
        m = self.metrics()
        if m is None:
            return None
        vals = [v for k, v in m.items() if k.split("{")[0] in (prefix, prefix + "_total")]
        return sum(vals) if vals else None

    def wait_pool_ready(self, size: int, timeout: float = 120) -> float | None:
        """Wait until /metrics reports ``size`` ready pool kernels; returns how many
        are ready then (fewer: it timed out), None when the gateway has no pool metric."""
        deadline = time.monotonic() + timeout
        while (ready := self.metric("kernelgw_pool_ready")) is not None and ready < size:
            if time.monotonic() > deadline:
                return ready
            time.sleep(0.1)
        return ready

    def containers(self) -> list[Any]:
        import docker

        dc = docker.from_env()
        try:
            return dc.containers.list(
                all=True, filters={"label": f"kernelgw.gateway={self.env['KERNELGW_GATEWAY_NAME']}"}
            )
        finally:
            dc.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # Belt and braces: nothing this gateway started may outlive the benchmark (a
        # stop keeps kernels for a successor by default: their workspace volumes too).
        with contextlib.suppress(Exception):
            for c in self.containers():
                c.remove(force=True, v=True)
        with contextlib.suppress(Exception):
            import docker

            dc = docker.from_env()
            try:
                label = f"kernelgw.gateway={self.env['KERNELGW_GATEWAY_NAME']}"
                for volume in dc.volumes.list(filters={"label": label}):
                    volume.remove(force=True)
            finally:
                dc.close()
        shutil.rmtree(self._data, ignore_errors=True)


def session_container(sid: str) -> tuple[str, Path]:
    """(container id, host connection directory) of a kernelgw session."""
    import docker

    dc = docker.from_env()
    try:
        (container,) = dc.containers.list(filters={"label": f"kernelgw.session={sid}"})
        conn = next(m["Source"] for m in container.attrs["Mounts"] if m["Destination"] == "/conn")
        return container.id, Path(conn)
    finally:
        dc.close()


# ---------------------------------------------------------------- transports


class WsConn:
    """One WebSocket to a session; `execute` sends a cell and waits for its ``done``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ws: Any = None

    async def __aenter__(self) -> WsConn:
        from websockets.asyncio.client import connect

        self.ws = await connect(self.url, max_size=None, compression=None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.close()

    async def execute(self, code: str) -> tuple[float, list[dict[str, Any]]]:
        """(elapsed ms, this execution's events)."""
        eid = uuid.uuid4().hex
        events = []
        t0 = time.perf_counter()
        await self.ws.send(json.dumps({"type": "execute", "code": code, "execution_id": eid}))
        while True:
            event = json.loads(await self.ws.recv())
            if event.get("execution_id") == eid:
                events.append(event)
                if event["type"] == "done":
                    return (time.perf_counter() - t0) * 1000, events


async def rest_execute(client: httpx.AsyncClient, sid: str, code: str) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    resp = await client.post(f"/v1/sessions/{sid}/execute", json={"code": code})
    resp.raise_for_status()
    body = resp.json()
    return (time.perf_counter() - t0) * 1000, body


class RawKernel:
    """The floor: jupyter_client straight to a session's kernel sockets (through the
    connection directory the container mounts), no gateway in between."""

    def __init__(self, conn_dir: Path) -> None:
        from jupyter_client.asynchronous import AsyncKernelClient

        info = json.loads((conn_dir / "kernel.json").read_text())
        info["ip"] = str(conn_dir / "k")
        self.kc = AsyncKernelClient()
        self.kc.load_connection_info(info)

    async def __aenter__(self) -> RawKernel:
        self.kc.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        await self.kc.wait_for_ready(timeout=30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.kc.stop_channels()

    async def drain(self) -> int:
        """Read and drop what is queued (messages of executions other clients sent to the
        same kernel); not timed, so the floor never pays for others' output."""
        import queue

        n = 0
        for get in (self.kc.get_iopub_msg, self.kc.get_shell_msg):
            while True:
                try:
                    await get(timeout=0.001)
                    n += 1
                except queue.Empty:
                    break
        return n

    async def execute(self, code: str) -> tuple[float, list[dict[str, Any]]]:
        """Execute, then wait for the reply and the idle status: (elapsed ms, iopub messages)."""
        kc = self.kc
        await self.drain()
        t0 = time.perf_counter()
        msg_id = kc.execute(code)
        reply_seen = idle_seen = False
        msgs: list[dict[str, Any]] = []
        while not (reply_seen and idle_seen):
            if not reply_seen:
                reply = await kc.get_shell_msg(timeout=60)
                reply_seen = reply["parent_header"].get("msg_id") == msg_id
            while not idle_seen:
                msg = await kc.get_iopub_msg(timeout=60)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                msgs.append(msg)
                idle_seen = msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
        return (time.perf_counter() - t0) * 1000, msgs


def raw_output_bytes(msgs: list[dict[str, Any]]) -> int:
    n = 0
    for m in msgs:
        c = m["content"]
        if m["header"]["msg_type"] == "stream":
            n += len(c["text"])
        elif m["header"]["msg_type"] in ("display_data", "execute_result"):
            n += sum(len(str(v)) for v in c["data"].values())
    return n


def event_output_bytes(events: list[dict[str, Any]]) -> int:
    n = 0
    for e in events:
        if e["type"] == "stream":
            n += len(e["text"])
        elif e["type"] in ("display", "result"):
            n += sum(len(str(v)) for v in e["data"].values())
    return n


def run_sync(coro: Any) -> Any:
    return asyncio.run(coro)


# ------------------------------------------------------------------ llm-sandbox


def llm_sandbox_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("llm-sandbox")
    except Exception:
        return None


LLMSB_WORKDIR = "/sandbox"
LLMSB_LABEL = "kernelgw.bench.llm-sandbox"


def llm_sandbox_configs(memory_mb: int = 2048, cpus: float = 1.0, pids: int = 256) -> dict[str, Any]:
    """llm-sandbox's Docker `runtime_configs` for our image, with kernelgw's limits.

    - command: our image's CMD starts a kernel that needs /conn/kernel.json; llm-sandbox
      wants a container that just stays up and runs `docker exec`s, so: sleep.
    - init: PID 1 `sleep` would ignore the SIGTERM of `container.stop()` and every
      close would wait Docker's 10 s stop timeout; tini forwards it.
    - network none, memory (no swap), CPU and pids limits as kernelgw's sessions.
    Not applied (llm-sandbox needs them otherwise): read-only root file system
    (it writes its code files and venv into /sandbox), non-root user (it runs as
    root by default and chowns as root), cap_drop=ALL, no-new-privileges."""
    return {
        "command": ["sleep", "infinity"],
        "init": True,
        "network_mode": "none",
        "mem_limit": f"{memory_mb}m",
        "memswap_limit": f"{memory_mb}m",
        "nano_cpus": int(cpus * 1e9),
        "pids_limit": pids,
        "environment": {"MPLBACKEND": "Agg", "HOME": "/tmp", "MPLCONFIGDIR": "/tmp/mpl"},
        "labels": {LLMSB_LABEL: "1"},
    }


def llmsb_session(image: str = DEFAULT_IMAGE, *, artifacts: bool = False, **kw: Any) -> Any:
    """A stateless llm-sandbox Docker session on our image (not opened).

    skip_environment_setup=True: the image already has its Python and packages
    (/opt/kernel, first on PATH); llm-sandbox's own setup would make a venv on the
    base interpreter (which cannot see /opt/kernel's packages) and upgrade pip from
    PyPI, which a network-less container cannot reach (measured separately)."""
    from llm_sandbox import ArtifactSandboxSession, SandboxSession

    cls = ArtifactSandboxSession if artifacts else SandboxSession
    opts = dict(
        lang="python",
        image=image,
        runtime_configs=llm_sandbox_configs(),
        skip_environment_setup=True,
        keep_template=True,
        workdir=LLMSB_WORKDIR,
        execution_timeout=300,
        default_timeout=300,
    )
    opts.update(kw)
    if not artifacts:
        opts["backend"] = "docker"
    return cls(**opts)


def llmsb_interactive(image: str = DEFAULT_IMAGE, *, workaround: bool = True, **kw: Any) -> Any:
    """llm-sandbox's InteractiveSandboxSession (an IPython runner) on our image (not opened).

    It runs `<workdir>/.sandbox-venv/bin/pip install ipython` and then the runner with
    `<workdir>/.sandbox-venv/bin/python`: the venv that llm-sandbox's environment
    setup makes. That setup cannot work offline (see `llmsb_session`), so with
    ``workaround`` the setup is skipped and the venv path is a symlink to the image's
    /opt/kernel (one extra `docker exec`, included in the timings); pip then finds
    ipython already installed and needs no network."""
    from llm_sandbox.interactive import InteractiveSandboxSession

    opts = dict(
        backend="docker",
        image=image,
        runtime_configs=llm_sandbox_configs(),
        keep_template=True,
        workdir=LLMSB_WORKDIR,
        max_memory=None,
        timeout=300,
    )
    if workaround:
        opts["skip_environment_setup"] = True
    opts.update(kw)
    session = InteractiveSandboxSession(**opts)
    if workaround:
        backend = session._backend_session

        def setup() -> None:
            backend.execute_command(
                f"sh -c 'mkdir -p {LLMSB_WORKDIR} && ln -sfn /opt/kernel {LLMSB_WORKDIR}/.sandbox-venv'"
            )

        backend.environment_setup = setup
    return session


def llmsb_fetch(session: Any, remote: str) -> bytes:
    """A file from an llm-sandbox container to the host (copy_from_runtime), as bytes."""
    with tempfile.TemporaryDirectory() as d:
        local = Path(d) / Path(remote).name
        session.copy_from_runtime(remote, str(local))
        return local.read_bytes()


def docker_run(image: str, code: str, *, network_none: bool = True) -> tuple[float, str]:
    """`docker run --rm IMAGE python -c CODE`: (elapsed ms, stdout)."""
    cmd = (
        ["docker", "run", "--rm"]
        + (["--network", "none"] if network_none else [])
        + ["--entrypoint", KERNEL_PYTHON, image, "-c", code]
    )
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return (time.perf_counter() - t0) * 1000, out.stdout


def leftover_llmsb_containers() -> list[Any]:
    """Containers the benchmarks made through llm-sandbox (by label), for clean-up checks."""
    import docker

    dc = docker.from_env()
    try:
        return dc.containers.list(all=True, filters={"label": LLMSB_LABEL})
    finally:
        dc.close()


def remove_llmsb_leftovers() -> int:
    n = 0
    for c in leftover_llmsb_containers():
        with contextlib.suppress(Exception):
            c.remove(force=True)
            n += 1
    return n
