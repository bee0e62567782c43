"""Threat: code in a sandbox reaching the host: its Docker engine, its files,
the gateway's secrets, kernel knobs that act on the host, or the host's disk.

Covered elsewhere (test_sandbox.py, moving here from tests/integration): writes to /evil, /usr/evil
and /opt/kernel/evil fail. Here: the engine's sockets, host files and
directories, secrets in /proc, other read-only paths and host-wide kernel
interfaces, and filling each writable tmpfs.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import docker
import httpx
import pytest

from tests.security.conftest import (
    PROBE,
    SECRET_ENV,
    SECRET_MARKER,
    describe_failure,
    new_session,
    run,
    run_json,
    session_containers,
    stdout,
)

pytestmark = pytest.mark.integration


def test_no_engine_socket_is_reachable(http: httpx.Client, session_id: str) -> None:
    code = (
        "import stat\n"
        "named = [p for p in ('/var/run/docker.sock', '/run/docker.sock', '/run/containerd/containerd.sock',\n"
        "                     '/var/run/containerd/containerd.sock', '/run/podman/podman.sock', '/run/runsc')\n"
        "         if os.path.lexists(p)]\n"
        "sockets = []\n"
        "for top in ('/', ):\n"
        "    for d, dirs, files in os.walk(top, onerror=lambda e: None):\n"
        "        if d in ('/proc', '/sys'):\n"
        "            dirs[:] = []\n"
        "            continue\n"
        "        for n in files + dirs:\n"
        "            p = os.path.join(d, n)\n"
        "            try:\n"
        "                if stat.S_ISSOCK(os.lstat(p).st_mode):\n"
        "                    sockets.append(p)\n"
        "            except OSError:\n"
        "                pass\n"
        "print(json.dumps({'named': named, 'sockets': sockets}))\n"
    )
    # /conn holds the kernel's own five sockets, but it is sealed (not listable)
    assert run_json(http, session_id, code) == {"named": [], "sockets": []}


def test_host_files_are_not_visible(http: httpx.Client, session_id: str, host_marker: Path) -> None:
    host_home = sorted(os.listdir("/home")) if os.path.isdir("/home") else []
    code = (
        f"home = {host_home!r}\n"
        "print(json.dumps({\n"
        "    'hostname': open('/etc/hostname').read().strip(),\n"
        "    'uname': os.uname().nodename,\n"
        f"    'marker': os.path.exists({str(host_marker)!r}),\n"
        "    'root': outcome(lambda: os.listdir('/root')),\n"
        "    'host_home': [h for h in home if os.path.lexists('/home/' + h)],\n"
        "    'pid1': open('/proc/1/cmdline').read().split('\\0')[0],\n"
        "}))\n"
    )
    seen = run_json(http, session_id, code)
    host_name = Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").exists() else socket.gethostname()
    assert seen["hostname"] == seen["uname"] == "sandbox" != host_name
    assert seen["marker"] is False
    assert seen["root"] in {"EACCES", "ENOENT"}, seen
    assert seen["host_home"] == []
    assert seen["pid1"].endswith("docker-init")  # the container's own init, not the host's


def test_proc_shows_no_gateway_secret_or_variable(http: httpx.Client, docker_client: docker.DockerClient) -> None:
    assert os.environ.get(SECRET_ENV) is None or os.environ[SECRET_ENV] == SECRET_MARKER
    user_env = {"KERNELGW_USER_PASSED": "yes", "PLAIN": "1"}
    with new_session(http, env=user_env) as sid:
        code = (
            "import glob, re\n"
            "texts, readable = [], 0\n"
            "paths = (glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline')\n"
            "         + glob.glob('/proc/[0-9]*/task/[0-9]*/environ') + ['/proc/self/environ'])\n"
            "for path in paths:\n"
            "    try:\n"
            "        texts.append(open(path, 'rb').read().decode('utf-8', 'replace'))\n"
            "        readable += 1\n"
            "    except OSError:\n"
            "        pass\n"
            "blob = '\\n'.join(texts + [f'{k}={v}' for k, v in os.environ.items()])\n"
            "names = sorted(set(re.findall(r'(?:^|[\\0\\n])(KERNELGW_[A-Za-z0-9_]*)=', blob)))\n"
            f"print(json.dumps({{'readable': readable, 'secret': {SECRET_MARKER!r} in blob, 'names': names}}))\n"
        )
        seen = run_json(http, sid, code)
        (container,) = session_containers(docker_client, sid)
        engine_env = "\n".join(container.attrs["Config"]["Env"] or [])
    assert seen["readable"] >= 4  # PID 1 and the kernel at least, environ and cmdline
    assert seen["secret"] is False
    assert set(seen["names"]) <= {"KERNELGW_USER_PASSED"}, seen["names"]
    assert SECRET_MARKER not in engine_env
    assert not [
        line
        for line in engine_env.splitlines()
        if line.startswith("KERNELGW_") and not line.startswith("KERNELGW_USER_PASSED=")
    ]


READ_ONLY_TARGETS = [
    "/etc/kgw-evil",
    "/etc/passwd",  # append: a second root account
    "/usr/local/bin/kgw-evil",
    "/opt/kernelgw/start-kernel",  # the kernel's entry point, rewritten for the next start
    "/home/kgw-evil",
    "/var/tmp/kgw-evil",
    "/root/kgw-evil",
    "/proc/sys/kernel/core_pattern",  # host-wide: a pipe here runs as root on the host
    "/proc/sysrq-trigger",
    "/sys/kernel/uevent_helper",
    "/sys/fs/cgroup/memory/release_agent",  # CVE-2022-0492
]


@pytest.mark.parametrize("path", READ_ONLY_TARGETS)
def test_writes_outside_the_tmpfs_mounts_fail(http: httpx.Client, session_id: str, path: str) -> None:
    code = (
        "import hashlib\n"
        f"path = {path!r}\n"
        "def digest():\n"
        "    try:\n"
        "        return hashlib.sha256(open(path, 'rb').read()).hexdigest()\n"
        "    except OSError as e:\n"
        "        return errno.errorcode.get(e.errno)\n"
        "before = digest()\n"
        "def write():\n"
        "    with open(path, 'a') as f:\n"
        "        f.write('kgw-evil\\n')\n"
        "print(json.dumps({'write': outcome(write), 'same': digest() == before}))\n"
    )
    result = run_json(http, session_id, code)
    assert result["write"] in {"EROFS", "EACCES", "EPERM", "ENOENT"}, result
    assert result["same"] is True


TMPFS_MOUNTS = {"/tmp": "tmp_size_mb", "/workspace": "workspace_size_mb", "/dev/shm": "shm_size_mb"}


@pytest.mark.parametrize("mount", list(TMPFS_MOUNTS))
def test_filling_a_tmpfs_ends_in_enospc_and_the_session_goes_on(
    http: httpx.Client, session_id: str, mount: str, request: pytest.FixtureRequest
) -> None:
    size_mb = getattr(request.getfixturevalue("gateway").settings, TMPFS_MOUNTS[mount])
    code = (
        f"path = os.path.join({mount!r}, 'fill.bin')\n"
        "written = 0\n"
        "try:\n"
        "    with open(path, 'wb') as f:\n"
        "        while True:\n"
        "            f.write(b'\\xab' * (1 << 20))\n"
        "            f.flush()\n"
        "            written += 1 << 20\n"
        "except OSError as e:\n"
        "    error = errno.errorcode.get(e.errno)\n"
        "print(json.dumps({'error': error, 'written': written}))\n"
    )
    filled = run(http, session_id, PROBE + code)
    assert filled["status"] == "ok", describe_failure(filled)
    result = json.loads(stdout(filled))  # one line: nothing else wrote to the cell
    assert result["error"] == "ENOSPC", result
    assert result["written"] <= size_mb << 20
    # the full mount does not break the kernel: it still runs cells, writes
    # elsewhere work, and nothing of the kernel's own (IPython's history is in
    # memory) complains into the user's output
    still = run(
        http,
        session_id,
        "other = '/workspace' if path.startswith('/tmp') else '/tmp'\n"
        "open(os.path.join(other, 'small.txt'), 'w').write('ok')\nprint('still here')",
    )
    assert still["status"] == "ok", describe_failure(still)
    streams = [(e["name"], e["text"]) for e in still["events"] if e["type"] == "stream"]
    assert "".join(text for _, text in streams) == "still here\n", streams
    freed = run(http, session_id, "os.remove(path)\nopen(path, 'wb').write(b'x')\nprint(os.path.getsize(path))")
    assert stdout(freed) == "1\n"
