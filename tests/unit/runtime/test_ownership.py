"""One live gateway per name and host (kernelgw.runtime.ownership), with real
processes: a live holder refuses a second, a holder killed with SIGKILL does not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kernelgw.errors import GatewayNameInUse
from kernelgw.runtime.ownership import InstanceLock

HOLD = """
import sys
from pathlib import Path
from kernelgw.runtime.ownership import InstanceLock
lock = InstanceLock(Path(sys.argv[1]), sys.argv[2])
lock.acquire("http://127.0.0.1:9999")
print("held", flush=True)
sys.stdin.read()  # until the test kills it
"""


def hold_in_child(runtime_dir: Path, name: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(runtime_dir), name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    return child


def test_a_second_holder_in_this_process_is_refused_until_the_first_releases(tmp_path: Path) -> None:
    first = InstanceLock(tmp_path, "gw")
    first.acquire("http://127.0.0.1:8000")
    second = InstanceLock(tmp_path, "gw")
    with pytest.raises(GatewayNameInUse) as refused:
        second.acquire("http://127.0.0.1:8001")
    message = refused.value.message
    assert f"pid {os.getpid()}" in message and "http://127.0.0.1:8000" in message
    assert "KERNELGW_GATEWAY_NAME" in message and refused.value.status_code == 409
    assert not second.held
    InstanceLock(tmp_path, "other").acquire("x")  # other names are independent
    first.release()
    second.acquire("http://127.0.0.1:8001")
    assert second.held
    second.release()


def test_a_live_holder_in_another_process_is_named_and_a_killed_one_frees_the_name(tmp_path: Path) -> None:
    child = hold_in_child(tmp_path, "gw")
    try:
        with pytest.raises(GatewayNameInUse) as refused:
            InstanceLock(tmp_path, "gw").check()
        assert f"pid {child.pid}" in refused.value.message
        assert "http://127.0.0.1:9999" in refused.value.message
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate()  # reaps it and closes its pipes
    lock = InstanceLock(tmp_path, "gw")
    lock.acquire("http://127.0.0.1:8000")  # the dead owner's lock went with it
    lock.release()


def test_check_holds_nothing(tmp_path: Path) -> None:
    InstanceLock(tmp_path, "gw").check()
    lock = InstanceLock(tmp_path, "gw")
    lock.acquire("x")
    lock.release()
