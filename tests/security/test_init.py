"""Threat: the kernel's code tampers with PID 1 so that its own death goes
unnoticed (a held-out run patched docker-init through /proc/1/mem when both ran
as the same uid: the gateway then reported a timeout after 26 s instead of a
dead kernel). PID 1 runs as root without capabilities but the two it needs to
drop them; the kernel runs as an unprivileged uid under it."""

from __future__ import annotations

import httpx
import pytest

from tests.security.conftest import done_event, run, run_json

pytestmark = pytest.mark.integration

PROBE_INIT = """
import os, signal, json
def attempt(fn):
    try:
        fn()
        return "allowed"
    except OSError as exc:
        return type(exc).__name__
def uid_of(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Uid:"):
            return int(line.split()[1])
def write_mem():
    with open("/proc/1/mem", "wb") as f:
        f.write(b"x")
print(json.dumps({
    "kernel_uid": os.getuid(),
    "init_uid": uid_of(1),
    "mem": attempt(write_mem),
    "stop": attempt(lambda: os.kill(1, signal.SIGSTOP)),
    "kill": attempt(lambda: os.kill(1, signal.SIGKILL)),
    "caps": open("/proc/self/status").read().split("CapEff:")[1].split()[0],
}))
"""


def test_the_kernel_cannot_touch_its_init(http: httpx.Client, session_id: str) -> None:
    seen = run_json(http, session_id, PROBE_INIT)
    assert seen["kernel_uid"] != 0 and seen["init_uid"] != seen["kernel_uid"], seen
    assert seen["mem"] != "allowed" and seen["stop"] != "allowed" and seen["kill"] != "allowed", seen
    assert int(seen["caps"], 16) == 0, seen


def test_a_kernel_that_exits_is_dead_at_once(http: httpx.Client, session_id: str) -> None:
    result = run(http, session_id, "import os\nos._exit(3)", timeout=60)
    done = done_event(result)
    assert done["status"] == "dead" and done["state_lost"] is True, done
