"""Threat: code that kills, stops or crashes its own kernel or the container's
init, ignores interrupts, or leaves processes behind, hoping to wedge the
session, the gateway, or to outlive its sandbox.

Covered elsewhere (tests/integration/test_timeouts.py): SIGKILL of the kernel
itself, ``os._exit``, a cell that catches KeyboardInterrupt in a loop. Here:
signals to PID 1, killing every process, a segfault, interrupts ignored at the
OS level or impossible (stopped kernel), and background processes.
"""

from __future__ import annotations

import time

import docker
import httpx
import pytest

from tests.security.conftest import (
    LABEL_SESSION,
    LIST_PROCESSES,
    done_event,
    run,
    run_json,
    session_containers,
    session_state,
    stdout,
)

pytestmark = pytest.mark.integration


def restart_and_check(http: httpx.Client, sid: str) -> None:
    """A dead session comes back with POST restart and runs code again."""
    resp = http.post(f"/v1/sessions/{sid}/restart")
    assert resp.status_code == 200 and resp.json()["state"] == "idle", resp.text
    assert stdout(run(http, sid, "print('back')")) == "back\n"


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM", "SIGSTOP"])
def test_signalling_pid_1_is_ignored_or_ends_the_session_cleanly(
    http: httpx.Client, session_id: str, docker_client: docker.DockerClient, signal_name: str
) -> None:
    run(http, session_id, "before = 1")
    code = f"import os, signal, time\nos.kill(1, signal.{signal_name})\ntime.sleep(1)\nprint('alive', before)"
    result = run(http, session_id, code, timeout=20)
    done = done_event(result)
    if done["status"] == "error":
        # PID 1 runs as another uid (root without capabilities): not the kernel's to signal
        assert "PermissionError" in (done["reason"] or ""), done
        assert stdout(run(http, session_id, "print(before + 1)")) == "2\n"
    elif done["status"] == "ok":
        # PID 1 of a PID namespace ignores signals from inside it that it has no handler for
        assert stdout(result) == "alive 1\n"
        assert stdout(run(http, session_id, "print(before + 1)")) == "2\n"
    else:
        # the init forwarded the signal to the kernel (SIGTERM), or the runtime let it
        # die (gVisor): the execution ends dead with a reason, the session restarts
        assert done["status"] == "dead" and done["state_lost"] is True, done
        assert done["reason"], done
        assert session_state(http, session_id) == "dead"
        restart_and_check(http, session_id)
    assert len(session_containers(docker_client, session_id)) == 1


def test_killing_every_process_ends_dead_and_restart_works(http: httpx.Client, session_id: str) -> None:
    code = (
        "import os, subprocess, time\n"
        "subprocess.Popen(['sleep', '1000'])\n"
        "print('before', flush=True)\n"
        "time.sleep(0.3)\n"
        "os.kill(-1, 9)  # every process but PID 1 and the caller\n"
        "os.killpg(0, 9)  # then the kernel's own process group\n"
        "print('never')"
    )
    result = run(http, session_id, code, timeout=20)
    done = done_event(result)
    assert stdout(result) == "before\n"
    assert done["status"] == "dead" and done["state_lost"] is True and done["reason"], done
    restart_and_check(http, session_id)


def test_segfault_mid_cell_delivers_earlier_output_then_dead(http: httpx.Client, session_id: str) -> None:
    code = "import ctypes, time\nprint('before', flush=True)\ntime.sleep(0.3)\nctypes.string_at(0)\nprint('never')"
    result = run(http, session_id, code, timeout=20)
    done = done_event(result)
    assert stdout(result) == "before\n"
    assert done["status"] == "dead" and done["state_lost"] is True and done["reason"], done
    again = run(http, session_id, "1")
    assert again["status"] == "dead"  # said at once, without hanging
    restart_and_check(http, session_id)


UNINTERRUPTIBLE = {
    # SIGINT ignored at the OS level: no KeyboardInterrupt is ever raised
    "sigint-ignored": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
    # the kernel stops itself: it can neither take an interrupt nor answer
    "kernel-stopped": "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)",
}


@pytest.mark.parametrize("kind", list(UNINTERRUPTIBLE))
def test_uninterruptible_cell_times_out_and_the_kernel_is_replaced(
    http: httpx.Client, session_id: str, kind: str
) -> None:
    run(http, session_id, "lost = 1")
    started = time.monotonic()
    result = run(http, session_id, UNINTERRUPTIBLE[kind], timeout=1)
    elapsed = time.monotonic() - started
    done = done_event(result)
    assert done["status"] == "timeout" and done["state_lost"] is True, done
    assert "restarted" in done["reason"], done
    print(f"timed out and replaced in {elapsed:.1f} s")
    assert session_state(http, session_id) == "idle"
    after = run(http, session_id, "print('lost' in dir())")
    assert stdout(after) == "False\n"


def sleepers(http: httpx.Client, sid: str) -> list[str]:
    return sorted(c for c in run_json(http, sid, LIST_PROCESSES).values() if c.startswith("sleep"))


def test_background_processes_die_with_their_kernel(
    http: httpx.Client, session_id: str, docker_client: docker.DockerClient
) -> None:
    spawn = (
        "import subprocess\n"
        "subprocess.Popen(['sleep', '1000'], start_new_session=True)\n"
        # a daemon that ignores the polite signals and double-forks away from the kernel
        "subprocess.Popen(['sh', '-c', 'trap \"\" TERM HUP INT; (sleep 1001 &) ; sleep 1002'],\n"
        "                 start_new_session=True, stdin=subprocess.DEVNULL,\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "import time; time.sleep(0.3)\n"
    )
    assert run(http, session_id, spawn)["status"] == "ok"
    (container,) = session_containers(docker_client, session_id)
    # the cell is over, the processes live on in the container
    assert sleepers(http, session_id) == ["sleep 1000", "sleep 1001", "sleep 1002"]

    resp = http.post(f"/v1/sessions/{session_id}/restart")
    assert resp.status_code == 200
    (fresh,) = session_containers(docker_client, session_id)
    assert fresh.id != container.id
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(container.id)
    assert sleepers(http, session_id) == []

    assert run(http, session_id, spawn)["status"] == "ok"
    assert http.delete(f"/v1/sessions/{session_id}").status_code == 204
    assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_SESSION}={session_id}"}) == []
