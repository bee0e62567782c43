"""Threat: one session starving the others: a thread storm, every core spun by
many processes, every file descriptor held across cells. While each attack
runs, a separate session must still answer ``1+1`` (within a generous 60 s
that only catches a hang), and the attacking session must come back.

Covered elsewhere: a fork bomb and a memory bomb (tests/integration/test_sandbox.py),
filling each tmpfs (test_host.py), output floods (test_output.py).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from tests.integration.conftest import RunningGateway, run, stdout
from tests.security.conftest import (
    RUNTIME,
    done_event,
    new_session,
    run_json,
    session_containers,
    wait_for_state,
    ws_connect,
)

pytestmark = pytest.mark.integration


@contextmanager
def attacking(gateway: RunningGateway, sid: str, code: str, ready: str | None = None) -> Iterator[dict[str, Any]]:
    """Runs ``code`` in ``sid`` on a thread; inside the block it is running, and
    once it printed ``ready`` (seen on the session's WebSocket) when given: the
    attack is under way, not only started. Yields the (later filled) result."""
    outcome: dict[str, Any] = {}

    def attack() -> None:
        with httpx.Client(base_url=gateway.url, timeout=180) as c:
            resp = c.post(f"/v1/sessions/{sid}/execute", json={"code": code, "timeout": 120})
            outcome.update(resp.json())

    with ws_connect(gateway, sid) as ws:
        thread = threading.Thread(target=attack, daemon=True)
        thread.start()
        with httpx.Client(base_url=gateway.url, timeout=30) as c:
            wait_for_state(c, sid, "busy")
        printed = ""
        while ready is not None and ready not in printed:
            event = json.loads(ws.recv(timeout=60))
            assert event["type"] != "done", f"the attack ended before it printed {ready!r}: {event}"
            if event["type"] == "stream":
                printed += event["text"]
    try:
        yield outcome
    finally:
        thread.join(timeout=180)
        assert not thread.is_alive(), "the attack never ended"


def bystander_answers(gateway: RunningGateway) -> None:
    """A fresh session starts and answers 1+1 while the attack runs (a hang is
    bounded by the client's timeout, not by a wall-clock assertion)."""
    with httpx.Client(base_url=gateway.url, timeout=60) as c, new_session(c) as sid:
        result = run(c, sid, "print(1 + 1)")
    assert stdout(result) == "2\n", done_event(result)


def test_thread_storm_stops_at_the_process_limit(gateway: RunningGateway, http: httpx.Client, session_id: str) -> None:
    code = (
        "import threading, time, json\n"
        "stop = threading.Event()\n"
        "threads, error = [], None\n"
        "time.sleep(0.5)\n"
        "try:\n"
        "    for _ in range(100000):\n"
        "        t = threading.Thread(target=stop.wait, daemon=True)\n"
        "        t.start()\n"
        "        threads.append(t)\n"
        "except RuntimeError as e:\n"
        "    error = str(e)\n"
        "print('storming', flush=True)\n"
        "time.sleep(3)  # hold them while the bystander works\n"
        "stop.set()\n"
        "print(json.dumps({'threads': len(threads), 'error': error}))\n"
    )
    with attacking(gateway, session_id, code, ready="storming") as outcome:
        bystander_answers(gateway)
    assert outcome["status"] == "ok", done_event(outcome)
    seen = json.loads(stdout(outcome).strip().splitlines()[-1])
    assert seen["error"] == "can't start new thread", seen
    assert 0 < seen["threads"] < gateway.settings.pids_limit, seen
    assert stdout(run(http, session_id, "print('alive')")) == "alive\n"


def _cpu_seconds(container_id: str) -> float:
    """CPU time the host charged to the container's cgroup (cgroup v1, as on these hosts)."""
    path = Path(f"/sys/fs/cgroup/cpuacct/docker/{container_id}/cpuacct.usage")
    if not path.exists():
        pytest.fail(f"no host cgroup accounting at {path}: this test reads the host's own numbers")
    return int(path.read_text()) / 1e9


def test_many_processes_spinning_stay_inside_the_cpu_limit(
    gateway: RunningGateway, http: httpx.Client, session_id: str, docker_client: docker.DockerClient
) -> None:
    (container,) = session_containers(docker_client, session_id)
    code = (
        "import os, time\n"
        "pids = []\n"
        "for _ in range(8):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        end = time.monotonic() + 4\n"
        "        while time.monotonic() < end:\n"
        "            pass\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "print('spinning', flush=True)\n"
        "for pid in pids:\n"
        "    os.waitpid(pid, 0)\n"
        "print('spun')\n"
    )
    # measured by the host, not inside: gVisor's own rusage counts virtual time
    cpu_before, started = _cpu_seconds(container.id), time.monotonic()
    with attacking(gateway, session_id, code, ready="spinning") as outcome:
        bystander_answers(gateway)
    wall, cpu = time.monotonic() - started, _cpu_seconds(container.id) - cpu_before
    assert outcome["status"] == "ok" and stdout(outcome) == "spinning\nspun\n", done_event(outcome)
    # eight spinners got at most the session's CPU share (gateway default 1 CPU),
    # not the machine's cores: the limit is what protects the neighbours
    assert cpu <= gateway.settings.cpus * wall * 1.25 + 0.5, (cpu, wall)
    assert cpu > 0.5, (cpu, wall)  # the accounting did see the spinners


def test_every_file_descriptor_held_across_cells(gateway: RunningGateway, http: httpx.Client, session_id: str) -> None:
    # the kernel process itself holds every descriptor it may open, and keeps them
    code = (
        "import socket, resource\n"
        "held, error = [], None\n"
        "try:\n"
        "    while True:\n"
        "        held.extend(socket.socketpair())\n"
        "except OSError as e:\n"
        "    error = errno.errorcode.get(e.errno)\n"
        "print(json.dumps({'held': len(held), 'error': error,\n"
        "                  'limit': resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))\n"
    )
    seen = run_json(http, session_id, code)
    assert seen["error"] in ("EMFILE", "ENFILE") if RUNTIME == "runc" else seen["error"] == "EMFILE", seen
    assert 0 < seen["held"] <= seen["limit"], seen
    bystander_answers(gateway)
    # the kernel still takes cells with every descriptor in use, and recovers when freed
    still = run(http, session_id, "print(len(held))")
    # (IPython may add that it can no longer save its history, which needs a
    # descriptor: its thread's note can land on the same line, right after the count)
    assert still["status"] == "ok" and re.match(rf"{seen['held']}(?!\d)", stdout(still)), done_event(still)
    freed = run(
        http, session_id, "for s in held: s.close()\nheld.clear()\nprint(len(os.listdir('/proc/self/fd')) < 100)"
    )
    assert stdout(freed).splitlines()[-1] == "True", done_event(freed)
