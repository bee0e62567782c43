"""Limits the Linux kernel counts per uid are not shared between sessions.

Each session's kernel runs as a host uid of its own (``kernel_uid_range``), so a
session that exhausts what is counted per uid (inotify instances, POSIX message
queue bytes, processes under RLIMIT_NPROC) exhausts it for itself only. Before,
every kernel of every gateway on the host ran as one uid: 128 inotify instances
or 9 message queues in one session made the same calls fail in all others.
"""

from __future__ import annotations

import collections
from typing import Any

import docker
import httpx

from tests.security.conftest import RUNTIME, new_session, run_json

LABEL_UID = "kernelgw.uid"

HOLD = "_held = globals().setdefault('_held', [])\n"

INOTIFY = (
    HOLD
    + """\
n, why = 0, 'cap'
while n < 1024:
    fd = _libc.inotify_init1(0)
    if fd == -1:
        why = errno.errorcode.get(ctypes.get_errno(), '?')
        break
    _held.append(fd)
    n += 1
print(json.dumps([n, why]))
"""
)
"""Opens inotify instances (kept open) until the kernel refuses one: [count, errno]."""

MQUEUES = """\
_libc.mq_open.restype = ctypes.c_int
_libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
n, why = 0, 'cap'
while n < 256:
    fd = _libc.mq_open(f'/kgw-{os.getpid()}-{n}'.encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
    if fd == -1:
        why = errno.errorcode.get(ctypes.get_errno(), '?')
        break
    n += 1
print(json.dumps([n, why]))
"""
"""Creates POSIX message queues (default size, never unlinked) until one is refused."""

PROCESSES = """\
import resource
def tasks_here():
    n = 0
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                status = open(f'/proc/{p}/status').read()
            except OSError:
                continue
            fields = dict(line.split(':', 1) for line in status.splitlines() if ':' in line)
            if int(fields['Uid'].split()[0]) == os.getuid():
                n += int(fields['Threads'])
    return n
cap = tasks_here() + 10
resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))
_kids = globals().setdefault('_kids', [])
def spawn(n):
    for _ in range(n):
        _kids.append(subprocess.Popen(['sleep', '600']))
print(json.dumps(outcome(lambda: spawn(6))))
"""
"""Caps the uid's tasks at those of this container plus 10 and starts 6 processes
that stay: within the cap when the uid is the session's own. Under runc the
Linux kernel counts RLIMIT_NPROC over every task of the uid on the host, so a
uid shared with other sessions (each kernel a dozen threads) is over it at once."""


def kernel_uid(http: httpx.Client, sid: str) -> int:
    uid: int = run_json(http, sid, "print(json.dumps(os.getuid()))")
    return uid


def test_inotify_instances_of_one_session_leave_the_others_theirs(http: httpx.Client) -> None:
    with new_session(http) as greedy, new_session(http) as other:
        taken, why = run_json(http, greedy, INOTIFY)
        # runc: the host's fs.inotify.max_user_instances (128 by default) per uid;
        # gVisor counts none of its own, so both sessions reach the cap
        assert why == ("cap" if RUNTIME == "runsc" else "EMFILE"), (taken, why)
        assert taken > 0
        assert run_json(http, other, INOTIFY) == [taken, why]


def test_message_queues_of_one_session_leave_the_others_theirs(http: httpx.Client) -> None:
    with new_session(http) as greedy, new_session(http) as other:
        taken, why = run_json(http, greedy, MQUEUES)
        if RUNTIME == "runsc":
            # gVisor keeps its own message queues per sandbox, with no RLIMIT_MSGQUEUE
            # reached by 256 of them: both sessions reach the cap
            assert (taken, why) == (256, "cap")
        else:
            # RLIMIT_MSGQUEUE (800 KiB per uid): a few default-sized queues use it up
            assert why == "EMFILE" and 0 < taken < 256, (taken, why)
        assert run_json(http, other, MQUEUES) == [taken, why]


def test_processes_of_one_session_do_not_count_against_another(http: httpx.Client) -> None:
    with new_session(http) as greedy, new_session(http) as other:
        assert run_json(http, greedy, PROCESSES) == "ok"
        assert run_json(http, other, PROCESSES) == "ok"


def uid_holders(docker_client: docker.DockerClient) -> dict[int, set[str]]:
    """Every container on the host that carries a uid label (every gateway's, other
    test passes too): its uid and the ``gateway/session`` holding it."""
    holders: dict[int, set[str]] = collections.defaultdict(set)
    # the engine's one listing (the high-level list inspects each container after,
    # and other gateways remove theirs meanwhile)
    for c in docker_client.api.containers(all=True, filters={"label": LABEL_UID}):
        labels: dict[str, Any] = c.get("Labels") or {}
        session = labels.get("kernelgw.session") or labels.get("kernelgw.store")
        holders[int(labels[LABEL_UID])].add(f"{labels.get('kernelgw.gateway')}/{session}")
    return holders


def test_live_sessions_run_as_different_uids_held_host_wide(
    http: httpx.Client, docker_client: docker.DockerClient
) -> None:
    with new_session(http) as first, new_session(http) as second:
        uid_first, uid_second = kernel_uid(http, first), kernel_uid(http, second)
        assert uid_first != uid_second and 0 not in (uid_first, uid_second)
        holders = uid_holders(docker_client)
        assert holders[uid_first] == {f"{first_gateway(holders, first)}/{first}"}
        assert not {uid: who for uid, who in holders.items() if len(who) > 1}, holders
    # the first session ended: its uid is free (no container holds it any more) ...
    assert not any(f"/{first}" in h for hs in uid_holders(docker_client).values() for h in hs)
    with new_session(http) as second, new_session(http) as third:
        live = kernel_uid(http, second), kernel_uid(http, third)
        # ... and a live session's uid is never another's, on any gateway of the host
        assert live[0] != live[1]
        holders = uid_holders(docker_client)
        assert all(len(holders[uid]) == 1 for uid in live), (live, holders)
        assert not {uid: who for uid, who in holders.items() if len(who) > 1}, holders


def first_gateway(holders: dict[int, set[str]], sid: str) -> str:
    """The gateway name in the holder entry of session ``sid``."""
    (holder,) = (h for hs in holders.values() for h in hs if h.endswith(f"/{sid}"))
    return holder.rsplit("/", 1)[0]


OWNERS = """\
found = {}
for top in ('/workspace', '/opt/kernelgw/packages'):
    for d, dirs, files in os.walk(top):
        for n in dirs + files:
            st = os.lstat(os.path.join(d, n))
            found[os.path.join(d, n)] = [st.st_uid, st.st_gid]
print(json.dumps([os.getuid(), found]))
"""
"""The kernel's uid and the owner (uid, gid) of every file of the session."""

MAKE_FILES = (
    "os.makedirs('/workspace/sub', exist_ok=True)\n"
    "open('/workspace/sub/a.txt', 'w').write('a')\n"
    "open('/opt/kernelgw/packages/kgw_mod.py', 'w').write('X = 1')\n"
    "print(json.dumps(os.getuid()))\n"
)


def assert_owned_by_kernel(http: httpx.Client, sid: str) -> int:
    uid, found = run_json(http, sid, OWNERS)
    assert "/workspace/sub/a.txt" in found and "/opt/kernelgw/packages/kgw_mod.py" in found, found
    assert {tuple(owner) for owner in found.values()} == {(uid, uid)}, (uid, found)
    return int(uid)


def test_forked_and_resumed_files_belong_to_the_session_that_has_them(http: httpx.Client) -> None:
    with new_session(http) as parent:
        parent_uid = run_json(http, parent, MAKE_FILES)
        resp = http.post("/v1/sessions", json={"from": parent})
        assert resp.status_code == 201, resp.text
        child = resp.json()["id"]
        try:
            # the fork runs as a uid of its own, and the copied files are its
            child_uid = assert_owned_by_kernel(http, child)
            assert child_uid != parent_uid
        finally:
            http.delete(f"/v1/sessions/{child}")
        # paused, the session holds no container and no uid; resumed, its files are
        # restored for whatever uid its new kernel got
        assert http.post(f"/v1/sessions/{parent}/pause").status_code == 200
        resp = http.post(f"/v1/sessions/{parent}/resume")
        assert resp.status_code == 200, resp.text
        assert_owned_by_kernel(http, parent)
        assert run_json(http, parent, "import kgw_mod\nprint(json.dumps(kgw_mod.X))") == 1


def test_a_session_uid_without_an_account_in_the_image_still_has_a_user_name(
    http: httpx.Client, session_id: str
) -> None:
    # the images name only 61000; getpass (and the libraries that use it) reads USER first
    named = "import getpass, pathlib\nprint(json.dumps([getpass.getuser(), str(pathlib.Path.home()), os.getuid()]))"
    user, home, uid = run_json(http, session_id, named)
    assert (user, home) == ("kernel", "/tmp/home") and uid != 61000, (user, home, uid)
