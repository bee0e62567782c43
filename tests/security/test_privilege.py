"""Threat: code in a sandbox gaining privileges: root through a setuid binary,
capabilities, another process's memory, mounts, new namespaces, chroot.

Covered elsewhere (test_sandbox.py, moving here from tests/integration): the kernel runs as its session's own uid (no host account)
with CapEff 0; test_init.py: PID 1 is out of the kernel's reach. Here: every process in the container, setuid binaries, ptrace,
mount, unshare and chroot: EPERM under runc. Under gVisor (runsc) registered
without ``--oci-seccomp``, as scripts/ensure-runsc.sh does (docs/security.md: with
it, runsc 20221219 misapplies the profile), the profile is not applied and the
values are gVisor's own, stated exactly in ``GVISOR_*``: a user (and a mount)
namespace can be made inside the sandbox's kernel, then chroot and a new network
namespace; mount still fails, and nothing over the container's files is gained.
"""

from __future__ import annotations

import docker
import httpx
import pytest

from kernelgw.config import parse_uid_range
from tests.integration.conftest import RunningGateway
from tests.security.conftest import RUNTIME, in_child, run_json, session_containers

pytestmark = pytest.mark.integration

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
GVISOR_UNSHARE = {
    "CLONE_NEWUSER": "ok",
    "CLONE_NEWNS": "ok",
    "CLONE_NEWUSER|CLONE_NEWNS": "ok",
    "CLONE_NEWNET": "EPERM",
}
"""unshare in gVisor's own kernel (no profile): its namespaces, not the host's."""
GVISOR_AFTER_UNSHARE = {"unshare": "ok", "chroot": "ok", "unshare_net": "ok", "mount": "EPERM"}
"""chroot, a network namespace (empty: no network either way) and mount after
unshare(CLONE_NEWUSER|CLONE_NEWNS) in gVisor's own kernel."""
# CAP_KILL (5), CAP_SETGID (6), CAP_SETUID (7), CAP_SETPCAP (8): all PID 1 may hold
INIT_CAPS = 0x1E0


@pytest.fixture
def kernel_uid(docker_client: docker.DockerClient, gateway: RunningGateway, session_id: str) -> str:
    """The session's own uid, from its kernel container's label: one of the
    gateway's ``kernel_uid_range``."""
    (kernel,) = [c for c in session_containers(docker_client, session_id) if "kernelgw.kernel" in c.labels]
    uid = kernel.labels["kernelgw.uid"]
    assert int(uid) in parse_uid_range(gateway.settings.kernel_uid_range), uid
    return str(uid)


def test_no_process_in_the_container_is_privileged(http: httpx.Client, session_id: str, kernel_uid: str) -> None:
    code = (
        "import glob\n"
        "procs = {}\n"
        "for path in glob.glob('/proc/[0-9]*/status'):\n"
        "    try:\n"
        "        fields = dict(line.split(':', 1) for line in open(path) if ':' in line)\n"
        "    except OSError:\n"
        "        continue\n"
        "    keys = ('Name', 'Uid', 'Gid', 'Groups', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs')\n"
        "    procs[path.split('/')[2]] = {k: fields[k].split() for k in keys if k in fields}\n"
        "print(json.dumps(procs))\n"
    )
    procs = run_json(http, session_id, code)
    assert len(procs) >= 2, procs  # docker-init and the kernel at least
    init = procs.pop("1")
    # PID 1 is root (another uid than the kernel's, so the kernel can neither signal
    # nor patch it) holding only what it needs to start the kernel and forward signals
    assert init["Name"] == ["docker-init"] and init["Uid"] == ["0"] * 4, init
    for cap in ("CapInh", "CapAmb"):
        assert int(init.get(cap, ["0"])[0], 16) == 0, (cap, init)
    for cap in ("CapPrm", "CapEff", "CapBnd"):
        assert int(init.get(cap, ["0"])[0], 16) & ~INIT_CAPS == 0, (cap, init)
    assert init.get("NoNewPrivs", ["1"]) == ["1"], init
    for pid, status in procs.items():
        name = (pid, status["Name"])
        assert status["Uid"] == [kernel_uid] * 4 and status["Gid"] == [kernel_uid] * 4, (name, status)
        assert set(status.get("Groups", [])) <= {kernel_uid}, (name, status)
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(status.get(cap, ["0"])[0], 16) == 0, (name, cap, status)
        assert status.get("NoNewPrivs", ["1"]) == ["1"], (name, status)  # gVisor has no such line


def test_setuid_binaries_do_not_give_root(http: httpx.Client, session_id: str, kernel_uid: str) -> None:
    # Each set-id program is started with a stdin that never answers; its
    # credentials are read right after exec (no-new-privileges: they stay the kernel's).
    code = (
        "import stat\n"
        "root_dev = os.stat('/').st_dev\n"
        "found = []\n"
        "for d, dirs, files in os.walk('/', onerror=lambda e: None):\n"
        "    dirs[:] = [n for n in dirs if os.lstat(os.path.join(d, n)).st_dev == root_dev]\n"
        "    for n in files:\n"
        "        p = os.path.join(d, n)\n"
        "        try:\n"
        "            st = os.lstat(p)\n"
        "        except OSError:\n"
        "            continue\n"
        "        if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID) and st.st_mode & 0o111:\n"
        "            found.append(p)\n"
        "creds = {}\n"
        "for p in found:\n"
        "    child = subprocess.Popen([p], stdin=subprocess.PIPE,\n"
        "                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "    lines = open(f'/proc/{child.pid}/status').read().splitlines()\n"
        "    child.kill()\n"
        "    child.wait()\n"
        "    creds[p] = [l.split()[1:] for l in lines if l.startswith(('Uid:', 'Gid:'))]\n"
        "print(json.dumps(creds))\n"
    )
    creds = run_json(http, session_id, code)
    for path, (uids, gids) in creds.items():
        assert uids == [kernel_uid] * 4 and gids == [kernel_uid] * 4, (path, uids, gids)


def test_ptrace_attach_to_pid_1_fails(http: httpx.Client, session_id: str) -> None:
    # PTRACE_ATTACH = 16. Should it succeed, detach at once so that PID 1 (the
    # container's init) is not left stopped.
    code = (
        "attach = outcome(lambda: libc('ptrace', 16, 1, 0, 0))\n"
        "if attach == 'ok':\n"
        "    os.waitpid(1, 0x40000000)  # __WALL\n"
        "    libc('ptrace', 17, 1, 0, 0)  # PTRACE_DETACH\n"
        "print(json.dumps(attach))\n"
    )
    assert run_json(http, session_id, code) == "EPERM"


def test_mount_fails(http: httpx.Client, session_id: str) -> None:
    code = (
        "os.makedirs('/tmp/mnt', exist_ok=True)\n"
        "call = outcome(lambda: libc('mount', b'none', b'/tmp/mnt', b'tmpfs', 0, None))\n"
        "binary = subprocess.run(['mount', '-t', 'tmpfs', 'none', '/tmp/mnt'], capture_output=True).returncode\n"
        "proc = outcome(lambda: libc('mount', b'proc', b'/tmp/mnt', b'proc', 0, None))\n"
        "mounted = any(' /tmp/mnt ' in line for line in open('/proc/self/mountinfo'))\n"
        "print(json.dumps({'call': call, 'binary': binary, 'proc': proc, 'mounted': mounted}))\n"
    )
    result = run_json(http, session_id, code)
    assert result["call"] == result["proc"] == "EPERM", result
    assert result["binary"] != 0 and result["mounted"] is False, result


@pytest.mark.parametrize("flag", ["CLONE_NEWUSER", "CLONE_NEWNS", "CLONE_NEWUSER|CLONE_NEWNS", "CLONE_NEWNET"])
def test_unshare_fails_and_grants_nothing(
    http: httpx.Client, session_id: str, docker_client: docker.DockerClient, flag: str
) -> None:
    flags = {"CLONE_NEWUSER": CLONE_NEWUSER, "CLONE_NEWNS": CLONE_NEWNS, "CLONE_NEWNET": CLONE_NEWNET}
    value = sum(flags[f] for f in flag.split("|"))
    probe = (
        f"result = {{'unshare': outcome(lambda: libc('unshare', {value}))}}\n"
        "def write():\n"
        "    open('/etc/kgw-evil', 'w').write('x')\n"
        "result['write_etc'] = outcome(write)\n"
        "result['read_root'] = outcome(lambda: os.listdir('/root'))\n"
        "print(json.dumps(result))\n"
    )
    result = run_json(http, session_id, in_child(probe))
    assert result["unshare"] == (GVISOR_UNSHARE[flag] if gvisor_ignores_the_profile(docker_client) else "EPERM"), result
    # and whatever a namespace made inside gVisor grants stays out of the container's files
    assert result["write_etc"] in {"EROFS", "EACCES", "EPERM"}, result
    assert result["read_root"] in {"EACCES", "ENOENT"}, result


def test_chroot_fails(http: httpx.Client, session_id: str) -> None:
    probe = "print(json.dumps(outcome(lambda: libc('chroot', b'/tmp'))))\n"
    assert run_json(http, session_id, in_child(probe)) == "EPERM"


def gvisor_ignores_the_profile(client: docker.DockerClient) -> bool:
    runsc = client.info().get("Runtimes", {}).get("runsc", {})
    return RUNTIME == "runsc" and "--oci-seccomp" not in runsc.get("runtimeArgs", [])


def test_after_unshare_chroot_and_mount_fail_too(
    http: httpx.Client, session_id: str, docker_client: docker.DockerClient
) -> None:
    """The path a review took under runsc: a user namespace first, then the rest."""
    probe = (
        f"result = {{'unshare': outcome(lambda: libc('unshare', {CLONE_NEWUSER | CLONE_NEWNS}))}}\n"
        "result['chroot'] = outcome(lambda: libc('chroot', b'/tmp'))\n"
        f"result['unshare_net'] = outcome(lambda: libc('unshare', {CLONE_NEWNET}))\n"
        "os.makedirs('/tmp/mnt', exist_ok=True)\n"
        "result['mount'] = outcome(lambda: libc('mount', b'none', b'/tmp/mnt', b'tmpfs', 0, None))\n"
        "print(json.dumps(result))\n"
    )
    expected = (
        GVISOR_AFTER_UNSHARE
        if gvisor_ignores_the_profile(docker_client)
        else dict.fromkeys(GVISOR_AFTER_UNSHARE, "EPERM")
    )
    assert run_json(http, session_id, in_child(probe)) == expected
