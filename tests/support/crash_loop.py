"""Kill -9 a real ``kernelgw serve`` at random moments while cells run over REST,
restart it, and count what an acknowledged answer was worth.

Shared by ``tests/integration/test_crash_loop.py`` (a few rounds) and
``benchmarks/bench_crash.py`` (100 rounds). Each round: a gateway (own name, own
data directory, SQLite) starts, reattaches the session or a new one is made, a
thread posts cells one after another, and the gateway is SIGKILLed a random
delay after a randomly chosen request was sent. At the end a last gateway reads
``/v1/sessions/{id}/history`` for every session used: every cell answered 200
must be there with the status it was answered with (else it is *lost*); a cell
left ``running`` is *unmarked*. That gateway is stopped with
``on_shutdown=stop`` and no container with the name's label may be left.
"""

from __future__ import annotations

import random
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker
import httpx

from tests.support import processes

LABEL_GATEWAY = "kernelgw.gateway"
RUNTIME_DIR = Path("/tmp/kgwk")
START_DEADLINE_S = 90.0


@dataclass
class CrashCounts:
    rounds: int = 0
    sent: int = 0
    acknowledged: int = 0
    lost: list[str] = field(default_factory=list)
    """Execution ids answered 200 but absent from history (or stored with another status)."""
    cut_off: int = 0
    """Rows marked dead because a gateway stopped while they ran."""
    unmarked: list[str] = field(default_factory=list)
    """Rows still ``running`` after a restart."""
    leaked: list[str] = field(default_factory=list)
    """Containers of the gateway name left after the last gateway stopped."""
    from_journal: int = 0
    """Answered cells a restart wrote into the database from the answer journal
    (kernelgw.storage.journal): the kill came before their commit."""


_FROM_JOURNAL = re.compile(rb"(\d+) cells answered before a gateway stop were written from its journal")


@contextmanager
def gateway_process(
    name: str, data_dir: Path, log: Path, image: str, database_url: str | None = None, **env: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``kernelgw serve`` for a round (no warm pool: every kernel is the session's)."""
    with processes.gateway_process(
        name,
        data_dir,
        log,
        image=image,
        runtime_dir=RUNTIME_DIR,
        database_url=database_url,
        start_deadline_s=START_DEADLINE_S,
        KERNELGW_POOL_SIZE="0",
        **env,
    ) as running:
        yield running


class _Poster(threading.Thread):
    """Posts cells one after another until the gateway stops answering."""

    def __init__(self, url: str, sid: str, code: str = "1+1") -> None:
        super().__init__(daemon=True)
        self.url, self.sid, self.code = url, sid, code
        self.sent: list[str] = []
        self.acked: dict[str, str] = {}
        self.sent_event = threading.Condition()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while True:
                eid = uuid.uuid4().hex
                with self.sent_event:
                    self.sent.append(eid)
                    self.sent_event.notify_all()
                try:
                    resp = http.post(f"/v1/sessions/{self.sid}/execute", json={"code": self.code, "execution_id": eid})
                except httpx.TransportError:
                    return
                if resp.status_code != 200:
                    return
                self.acked[eid] = resp.json()["status"]

    def wait_sent(self, count: int, deadline_s: float = 60.0) -> None:
        with self.sent_event:
            if not self.sent_event.wait_for(lambda: len(self.sent) >= count or not self.is_alive(), deadline_s):
                raise RuntimeError("no request was sent")


def _session(http: httpx.Client, sid: str | None) -> str:
    """The reattached session, or a new one when it did not survive."""
    if sid is not None and http.get(f"/v1/sessions/{sid}").status_code == 200:
        return sid
    resp = http.post("/v1/sessions", json={})
    resp.raise_for_status()
    return str(resp.json()["id"])


def crash_rounds(
    rounds: int,
    workdir: Path,
    image: str,
    seed: int | None = None,
    database_url: str | None = None,
    code: str = "1+1",
    kill_after_send_s: tuple[float, float] = (0.0, 0.02),
) -> CrashCounts:
    """Run ``rounds`` kill -9 rounds in ``workdir`` (history in SQLite there, or at
    ``database_url``), posting ``code`` and killing a random time in
    ``kill_after_send_s`` after a request was sent; returns the counts (never
    raises on a loss). A cell's ``running`` row is committed about 20 ms after
    it starts (the writer's linger), so only kills that land later in a longer
    cell test the marking of cut-off cells."""
    rng = random.Random(seed)
    name = f"crash{uuid.uuid4().hex[:8]}"
    data_dir, log = workdir / "data", workdir / "gateway.log"
    counts = CrashCounts()
    acked: dict[str, dict[str, str]] = {}
    sid: str | None = None
    client = docker.from_env()
    try:
        for _ in range(rounds):
            with gateway_process(name, data_dir, log, image, database_url) as (proc, url):
                with httpx.Client(base_url=url, timeout=120) as http:
                    sid = _session(http, sid)
                poster = _Poster(url, sid, code)
                poster.start()
                poster.wait_sent(rng.randint(1, 8))
                time.sleep(rng.uniform(*kill_after_send_s))  # the random moment of the kill, not a synchronisation
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                poster.join(60)
                counts.rounds += 1
                counts.sent += len(poster.sent)
                acked.setdefault(sid, {}).update(poster.acked)
        with gateway_process(name, data_dir, log, image, database_url, KERNELGW_ON_SHUTDOWN="stop") as (proc, url):
            with httpx.Client(base_url=url, timeout=120) as http:
                for session_id, cells in acked.items():
                    resp = http.get(f"/v1/sessions/{session_id}/history")
                    if resp.status_code == 404:  # the session's own row is gone: all its cells are lost
                        stored = {}
                    else:
                        resp.raise_for_status()
                        stored = {e["execution_id"]: e for e in resp.json()["executions"]}
                    for eid, status in cells.items():
                        counts.acknowledged += 1
                        if eid not in stored or stored[eid]["status"] != status:
                            counts.lost.append(eid)
                    for e in stored.values():
                        if e["status"] == "running":
                            counts.unmarked.append(e["execution_id"])
                        elif e["status"] == "dead" and "the gateway stopped while this cell ran" in (e["reason"] or ""):
                            counts.cut_off += 1
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        counts.from_journal = sum(int(m[1]) for m in _FROM_JOURNAL.finditer(log.read_bytes()))
        counts.leaked = [
            str(c.name) for c in client.containers.list(all=True, filters={"label": f"{LABEL_GATEWAY}={name}"})
        ]
    finally:
        for container in client.containers.list(all=True, filters={"label": f"{LABEL_GATEWAY}={name}"}):
            container.remove(force=True)
        shutil.rmtree(RUNTIME_DIR / name, ignore_errors=True)
        client.close()
    return counts
