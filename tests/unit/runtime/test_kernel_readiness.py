"""A kernel is ready once our stdin socket has joined it, not only shell and iopub.

stdin carries nothing back until a cell calls input(), and the kernel's ROUTER
drops an ``input_request`` addressed to a peer that has not joined yet: the
cell then waits for an answer that can never come (seen once in CI, and in 1 of
5 local ipykernels, whose kernel_info reply came 42 ms before our stdin
socket's handshake). A real ipykernel (local backend) whose stdin binds late,
after it has answered on shell and iopub, makes that window wide.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kernelgw.errors import KernelStartFailed
from kernelgw.runtime.session import KernelSession
from tests.support.local_backend import IMAGE_HELPERS, LocalBackend
from tests.unit.runtime.conftest import session_config, spec

LATE_STDIN = """
import os, socket as sockets, threading, time
from pathlib import Path
from ipykernel.kernelapp import IPKernelApp

_bind = IPKernelApp._bind_socket

def _bind_socket(self, socket, port):
    if socket is not getattr(self, "stdin_socket", None):
        return _bind(self, socket, port)
    # a socket file that refuses connections stands in until the real bind
    # (the gateway's check that the kernel made its sockets passes meanwhile)
    path = f"{{self.ip}}-{{port}}"
    stand_in = sockets.socket(sockets.AF_UNIX)
    stand_in.bind(path)
    def later():
        time.sleep({delay})
        os.unlink(path)
        stand_in.close()
        _bind(self, socket, port)
        Path({marker!r}).write_text("bound")
    threading.Thread(target=later, daemon=True).start()
    return port

IPKernelApp._bind_socket = _bind_socket
"""


def late_stdin_env(tmp_path: Path, delay: float) -> tuple[dict[str, str], Path]:
    """A kernel environment whose ipykernel binds stdin ``delay`` seconds after
    its other sockets (a ``sitecustomize`` on its path), refusing connections
    until then, and the file it writes once bound."""
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "stdin-bound"
    (site / "sitecustomize.py").write_text(LATE_STDIN.format(delay=delay, marker=str(marker)))
    return {"PYTHONPATH": f"{site}:{IMAGE_HELPERS}"}, marker


async def test_start_waits_until_stdin_has_joined(local_backend: LocalBackend, tmp_path: Path) -> None:
    env, marker = late_stdin_env(tmp_path, delay=2.0)
    sid = uuid.uuid4().hex
    session = KernelSession(sid, spec(sid, env=env), local_backend, session_config())
    try:
        await session.start()
        # without the wait, start returned about 2 s before stdin could be joined
        assert marker.read_text() == "bound"
        assert session.state == "idle"
    finally:
        await session.close()


async def test_a_kernel_whose_stdin_never_binds_fails_to_start(local_backend: LocalBackend, tmp_path: Path) -> None:
    env, marker = late_stdin_env(tmp_path, delay=600.0)
    sid = uuid.uuid4().hex
    session = KernelSession(sid, spec(sid, env=env), local_backend, session_config(kernel_start_timeout_s=8))
    try:
        with pytest.raises(KernelStartFailed, match="stdin"):
            await session.start()
        assert not marker.exists()
    finally:
        await session.close()
    assert not local_backend.kernels, "the kernel that never joined was stopped"
