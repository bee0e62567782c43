"""Docker implementation of :class:`~kernelgw.runtime.backends.base.Backend`.

One container per kernel: no network, read-only root, explicit tmpfs sizes, no
capabilities, no new privileges, a non-root user, pids/memory/CPU limits, and
Docker's init (tini) as PID 1 so signals reach the kernel and zombies are reaped.
The init runs as root with only the capabilities to drop root, empty the
kernel's capability bounding set and forward signals (the kernel runs under it
as its own uid), so code in the kernel cannot stop or patch it and hide its
own death.
The kernel's ZMQ sockets are unix sockets in a per-kernel directory bind-mounted
at ``/conn``; that directory is the only thing the host shares with it.

A session's workspace can outlive its kernel containers: its volumes and the
store container that keeps them mounted are `WorkspaceStore`'s
(:mod:`kernelgw.runtime.backends.workspace_store`). A user's command (or
terminal) is a `DockerCommand` (:mod:`kernelgw.runtime.backends.docker_command`).

The Docker SDK is blocking, so every call runs on a private thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import importlib.resources
import json
import logging
import os
import secrets
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
from docker.models.containers import Container

from kernelgw.config import DEFAULT_KERNEL_UID
from kernelgw.errors import BackendError, EngineUnavailable, ImageNotFound, KernelDied, KernelStartFailed
from kernelgw.runtime.backends.base import (
    COMMAND_WRAPPER,
    HELPER_LOADER_RESET,
    IPC_PORTS,
    ROOT_CAPABILITIES,
    WORKSPACE_DIR,
    EngineHealth,
    KernelContainer,
    KernelCounters,
    KernelHandle,
    KernelSpec,
    KernelState,
    TerminalSize,
    connection_info,
    helper_command,
)
from kernelgw.runtime.backends.child_kernels import CHILD_CONN_PREFIX, ChildKernels
from kernelgw.runtime.backends.docker_command import DockerCommand, OpenCommands, exec_exit_code, read_ahead
from kernelgw.runtime.backends.engine_stats import counters_from_stats
from kernelgw.runtime.backends.labels import LABEL_GATEWAY, LABEL_KERNEL, LABEL_SESSION, LABEL_STORE, LABEL_UID
from kernelgw.runtime.backends.oom_events import OomCounter
from kernelgw.runtime.backends.uids import UidAllocator
from kernelgw.runtime.backends.workspace_store import STORE_MOUNT_MODE, WorkspaceStore, session_mounts

log = logging.getLogger(__name__)

T = TypeVar("T")

START_ATTEMPTS = 3
RACED_START = ("cannot start a stopped process", "cannot start an already running container")
CONTAINER_LOG = docker.types.LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"})
"""The log of every container the backend starts. What a kernel process writes
to its own stdout or stderr outside Jupyter (a subprocess with the kernel's
real fds, R's ``system()``) goes to the engine's log, on the host's disk: the
json-file driver with one file of at most 1 MiB keeps that bounded, and
``docker logs`` still shows the last of it (a failed start's diagnostics)."""
OOM_RECHECKS = 50
"""A SIGKILL exit waits for an ``oom`` event that may follow it for up to
OOM_RECHECKS x OOM_RECHECK_S (5 s; seen 60 ms after the exit under gVisor; the
count is in memory, so waiting costs no engine call)."""
OOM_RECHECK_S = 0.1
CONTAINER_CONN_DIR = "/conn"
SIGNAL_GROUP = 'kill -s "$1" -- "-$2" 2>/dev/null || kill -s "$1" "$2" 2>/dev/null; exit 0'
"""``sh -c`` this, signal and pid: the process group of a command, or the process if it leads none."""
SIGNAL_PID = 'kill -s "$1" "$2" 2>/dev/null; exit 0'
"""The process alone (a child kernel's interrupt: the kernel passes it on, as a main kernel's init does)."""
SIGNAL_SESSION = """
sig=$1 sid=$2
for stat in /proc/[0-9]*/stat; do
  IFS= read -r line < "$stat" 2>/dev/null || continue
  set -- ${line##*) }
  if [ "$4" = "$sid" ]; then pid=${stat#/proc/}; kill -s "$sig" "${pid%/stat}" 2>/dev/null; fi
done
exit 0
"""
"""Signal every process whose session is ``$2`` (field 6 of proc_pid_stat(5),
the 4th after the command name, which may hold spaces but ends at the last
``)``); the container has no ``pkill``."""
KERNEL_ACCOUNT_ENV = {"USER": "kernel", "LOGNAME": "kernel"}
"""The images name only uid 61000 (``kernel``) and a session's uid has no account
in them: ``getpass.getuser()`` (and what uses it) reads these first. A session's
own ``env`` may replace them."""
KERNEL_COMMAND = ["/opt/kernelgw/start-kernel", f"{CONTAINER_CONN_DIR}/kernel.json"]
# sun_path is 108 bytes including the terminating NUL
MAX_SOCKET_PATH = 107


def warn_if_host_account(uid: int) -> None:
    """Files a kernel leaves on the host (its connection directory, while it
    starts) belong to its uid; a host account with that uid would own them."""
    import pwd

    try:
        account = pwd.getpwuid(uid).pw_name
    except KeyError:
        return
    log.warning(
        "kernels run as uid %d, which is the host account %r: choose a kernel_uid no host account has "
        "(the default, %d, is meant to be one)",
        uid,
        account,
        DEFAULT_KERNEL_UID,
    )


def warn_if_host_accounts(uids: range) -> None:
    """A session's files belong to its uid: no host account should have one of the range."""
    import pwd

    accounts = sorted(f"{entry.pw_name} ({entry.pw_uid})" for entry in pwd.getpwall() if entry.pw_uid in uids)
    if accounts:
        log.warning(
            "kernel_uid_range %d-%d holds host accounts %s: choose a range no host account has",
            uids.start,
            uids.stop - 1,
            ", ".join(accounts),
        )


def process_limits(spec: KernelSpec) -> dict[str, Any]:
    """The container options that cap processes.

    runc: the pids cgroup. gVisor (ptrace platform) runs about 40 host threads
    per sandbox plus about 7 per process inside it, all counted by that cgroup,
    so a limit of 256 let a fork bomb kill the whole sandbox after some 30
    forks. Under runsc the cgroup only stops runaway host threads, and the
    process count is enforced inside the sandbox with RLIMIT_NPROC, which gVisor
    counts per sandbox (under runc it would count the kernel uid on the whole host).
    """
    if spec.runtime != "runsc":
        return {"pids_limit": spec.pids_limit}
    return {
        "pids_limit": spec.pids_limit * 8 + 64,
        "ulimits": [docker.types.Ulimit(name="nproc", soft=spec.pids_limit, hard=spec.pids_limit)],
    }


@functools.cache
def seccomp_profile(runtime: str = "runc") -> str:
    """The containers' seccomp profile (``seccomp.json`` next to this module), as
    compact JSON text: the Docker API takes the profile's content, not a path.

    It is Docker's own default profile (moby/moby ``profiles/seccomp/default.json``
    at v20.10.24, the engine here) with six calls taken out of the allow rules;
    they fall to the default action, ``SCMP_ACT_ERRNO`` without
    ``defaultErrnoRet``: the call fails with EPERM, the process lives on.
    Nothing else differs.

    * ``ptrace``, ``process_vm_readv``, ``process_vm_writev``: the default
      allows ptrace on kernels >= 4.8 (and, from 23.0, process_vm_readv/writev
      too). Code could PTRACE_ATTACH to docker-init (PID 1) and, by exiting
      without detaching, leave it stopped, so the container would keep
      "running" after the kernel died, or read and write the memory of any
      process in the container.
    * ``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``: a large
      host-kernel attack surface with a record of container escapes, whose
      operations (open, connect, ...) seccomp never sees; no kernel needs it,
      and Docker's own default blocks it from 25.0 (moby/moby#46762).

    gVisor (runsc) applies OCI seccomp only with ``--oci-seccomp``, which
    scripts/ensure-runsc.sh does not set (runsc 20221219 misapplies the profile:
    docs/security.md); without it the Sentry answers these calls itself
    (tests/security/test_seccomp_edges.py). Its profile differs in one rule
    (`gvisor_profile`), so that a kernel at least starts with the flag.
    """
    text = importlib.resources.files("kernelgw.runtime.backends").joinpath("seccomp.json").read_text(encoding="utf-8")
    profile = json.loads(text)
    if runtime == "runsc":
        profile = gvisor_profile(profile)
    return json.dumps(profile, separators=(",", ":"))


def gvisor_profile(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile for gVisor's ``--oci-seccomp``: ``clone3`` allowed, not
    refused with ENOSYS. runsc 20221219 ignores a rule's ``errnoRet`` and
    answers EPERM, on which glibc does not fall back to ``clone``: no thread
    could start (ZMQ aborted the kernel, signal 6). Allowed, the call reaches
    the Sentry, which has no ``clone3`` and answers ENOSYS itself, so no
    namespace can be made through it either (test_seccomp.py checks ENOSYS)."""
    rules = []
    for rule in profile["syscalls"]:
        if rule["names"] == ["clone3"] and rule.get("errnoRet") == errno.ENOSYS:
            rule = {k: v for k, v in rule.items() if k != "errnoRet"} | {"action": "SCMP_ACT_ALLOW"}
        rules.append(rule)
    return profile | {"syscalls": rules}


def security_options(runtime: str = "runc") -> list[str]:
    """``security_opt`` of every container a backend starts, for its runtime."""
    return ["no-new-privileges", "seccomp=" + seccomp_profile(runtime)]


def command_privileges(uid: int, gid: int, root: bool, setpriv: str = "/usr/bin/setpriv") -> list[str]:
    """How a process leaves the root it starts as in a kernel's container: the
    session's uid with every capability set empty (changing the uid from 0
    clears the effective and permitted sets, the bounding and inheritable sets
    are emptied, no-new-privileges does the rest). The kernel itself
    (`DockerBackend._command`, which names ``setpriv`` as the image's PATH finds
    it) and every user command, context and terminal (a root ``docker exec``:
    an exec as the uid kept the container's bounding set). ``root`` keeps uid 0
    and only `ROOT_CAPABILITIES` (those the container has: a gVisor sandbox's
    when the gateway allows root commands)."""
    if root:
        keep = ",".join(f"+{cap.lower()}" for cap in ROOT_CAPABILITIES)
        return [setpriv, "--clear-groups", f"--bounding-set=-all,{keep}", "--inh-caps=-all", "--"]
    return [
        setpriv,
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--bounding-set=-all",
        "--inh-caps=-all",
        "--",
    ]


class DockerBackend:
    def __init__(
        self,
        *,
        gateway_name: str,
        runtime_dir: Path,
        kernel_uid: int = DEFAULT_KERNEL_UID,
        kernel_gid: int = DEFAULT_KERNEL_UID,
        kernel_uids: range | None = None,
        uid_state_dir: Path = Path("/run/kernelgw/.uids"),
        keep_workspaces: bool = True,
        root_commands: bool = False,
        max_workers: int = 32,
        client_factory: Callable[[], docker.DockerClient] | None = None,
    ) -> None:
        self.gateway_name = gateway_name
        self.base_dir = Path(runtime_dir) / gateway_name
        self.root_commands = root_commands
        """gVisor sessions' containers keep `ROOT_CAPABILITIES` (``e2b_root_commands``)."""
        if os.geteuid() == 0:
            self.uid, self.gid = kernel_uid, kernel_gid
            warn_if_host_account(kernel_uid)
        else:
            # Without root we cannot chown the connection directory to another uid,
            # so the kernel runs as the gateway's own (still unprivileged) user.
            self.uid, self.gid = os.geteuid(), os.getegid()
        self._uids: UidAllocator | None = None
        """Each session's own uid (`kernelgw.runtime.backends.uids`); None: every
        kernel runs as ``uid`` (no range configured, or the gateway is not root)."""
        if kernel_uids is not None and os.geteuid() == 0:
            self._uids = UidAllocator(kernel_uids, uid_state_dir, self._held_uids)
            warn_if_host_accounts(kernel_uids)
        self._session_uids: dict[str, int] = {}
        """The uid of each session this gateway started or found a kernel of."""
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="docker")
        self._client_factory = client_factory or partial(docker.from_env, max_pool_size=max_workers, timeout=60)
        self._docker: docker.DockerClient | None = None
        self._ooms = OomCounter(gateway_name, self._client)
        """Out-of-memory kills by container (`kernelgw.runtime.backends.oom_events`)."""
        self._commands = OpenCommands()
        """Commands and child kernels' processes by container, ended with it."""
        self.children = ChildKernels(self, self._run, self._session_ids)
        """Child kernels (E2B contexts): processes in another kernel's container
        (`kernelgw.runtime.backends.child_kernels`)."""
        self.workspaces = WorkspaceStore(
            gateway_name=gateway_name,
            uid_of=self._session_ids,
            enabled=keep_workspaces,
            client=self._client,
            run=self._run,
            run_container=self._run_container,
            security_opt=security_options,
        )
        longest = self.base_dir / ("x" * 12) / "k-5"
        if len(str(longest).encode()) > MAX_SOCKET_PATH:
            raise ValueError(
                f"socket paths under {self.base_dir} would exceed {MAX_SOCKET_PATH} bytes; "
                "choose a shorter runtime_dir or gateway_name"
            )

    # ------------------------------------------------------------------ helpers
    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(fn, *args, **kwargs))

    def _client(self) -> docker.DockerClient:
        if self._docker is None:
            try:
                self._docker = self._client_factory()
            except docker.errors.DockerException as exc:
                raise EngineUnavailable(
                    f"The Docker engine does not answer ({exc}). Start it (for example "
                    "scripts/ensure-docker.sh) and try again."
                ) from exc
        return self._docker

    def _labels(self, spec: KernelSpec, kernel_id: str, uid: int) -> dict[str, str]:
        return {
            LABEL_GATEWAY: self.gateway_name,
            LABEL_SESSION: spec.session_id,
            LABEL_KERNEL: kernel_id,
            LABEL_UID: str(uid),
        }

    # ------------------------------------------------------------- session uids
    def _owner(self, session_id: str) -> str:
        return f"{self.gateway_name}/{session_id}"

    def _held_uids(self) -> dict[int, str]:
        """The uids the engine's containers carry (every gateway's), by holder."""
        try:
            found = self._client().api.containers(all=True, filters={"label": LABEL_UID})
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"The Docker engine failed: {exc}") from exc
        held: dict[int, str] = {}
        for c in found:
            labels = c.get("Labels") or {}
            with contextlib.suppress(ValueError):
                session = labels.get(LABEL_SESSION) or labels.get(LABEL_STORE) or c["Id"]
                held[int(labels[LABEL_UID])] = f"{labels.get(LABEL_GATEWAY, '')}/{session}"
        return held

    def _acquire_uid(self, session_id: str) -> int:
        """The session's uid for a container about to start (blocking): the one
        its containers have, else a free one, reserved until `_release_uid`."""
        if self._uids is None:
            return self.uid
        uid = self._uids.acquire(self._owner(session_id), prefer=self._session_uids.get(session_id))
        self._session_uids[session_id] = uid
        return uid

    def _release_uid(self, session_id: str) -> None:
        if self._uids is not None:
            self._uids.release(self._owner(session_id))

    def _session_uid(self, session_id: str) -> int:
        """The uid a session's processes run as (blocking on a miss: a kernel found
        again after a restart has it in its containers' label)."""
        if self._uids is None:
            return self.uid
        uid = self._session_uids.get(session_id)
        if uid is None:
            try:
                uid = self._acquire_uid(session_id)
            finally:
                self._release_uid(session_id)
        return uid

    def _session_ids(self, session_id: str) -> tuple[int, int]:
        uid = self._session_uid(session_id)
        return uid, self._gid(uid)

    def _make_conn_dir(self, kernel_id: str, key: str, uid: int) -> Path:
        self.base_dir.mkdir(parents=True, exist_ok=True, mode=0o711)
        conn_dir = self.base_dir / kernel_id
        conn_dir.mkdir(mode=0o700)
        conn_file = conn_dir / "kernel.json"
        fd = os.open(conn_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(connection_info(f"{CONTAINER_CONN_DIR}/k", key), f)
        if os.geteuid() == 0:
            os.chown(conn_file, uid, self._gid(uid))
            os.chown(conn_dir, uid, self._gid(uid))
        return conn_dir

    def _gid(self, uid: int) -> int:
        """A session's own uid comes with a group of the same number."""
        return self.gid if uid == self.uid else uid

    def _init_apart(self, uid: int) -> bool:
        """PID 1 runs as root (without capabilities but SETUID/SETGID to drop root,
        SETPCAP to empty the kernel's bounding set, KILL to forward signals to
        another uid) and the kernel under it as ``uid``: code in the kernel can then
        neither signal nor patch its init (``/proc/1/mem``), so the container
        ends when the kernel does and the engine says so at once. Not when the
        kernel itself is configured to run as root (there is nothing to keep apart)."""
        return uid != 0

    def _identity(self, uid: int, runtime: str = "runc") -> dict[str, Any]:
        if self._init_apart(uid):
            caps = ["SETUID", "SETGID", "SETPCAP", "KILL"]
            if self.root_commands and runtime == "runsc":  # the kernel drops them all; root commands keep them
                caps += ROOT_CAPABILITIES
            return {"user": "0:0", "cap_drop": ["ALL"], "cap_add": caps}
        return {"user": f"{uid}:{self._gid(uid)}", "cap_drop": ["ALL"]}

    def _command(self, uid: int) -> list[str]:
        if not self._init_apart(uid):
            return KERNEL_COMMAND
        # setpriv (util-linux, in every Debian base) gives up root for the kernel's uid
        return [*command_privileges(uid, self._gid(uid), root=False, setpriv="setpriv"), *KERNEL_COMMAND]

    # ---------------------------------------------------------------- protocol
    async def start(self, spec: KernelSpec) -> KernelHandle:
        if spec.host is not None:
            return await self.children.start(spec, CONTAINER_CONN_DIR)
        uid = await self._run(self._acquire_uid, spec.session_id)
        try:
            volumes = await self.workspaces.volumes(spec) if self.workspaces.keeps(spec) else None
            return await self._start_container(spec, volumes, uid)
        finally:
            # the kernel's container (if made) now carries the uid in its label
            await self._run(self._release_uid, spec.session_id)

    async def _start_container(self, spec: KernelSpec, volumes: dict[str, str] | None, uid: int) -> KernelHandle:
        """``_start_sync`` on the pool, through a cancellation of the caller (a
        pool closing while it refills, a gateway stopping): the thread makes the
        container whatever the caller does, and the caller cancelled meanwhile
        removes it once made. Left to the thread, it ran on after the gateway
        stopped (seen: a warm kernel of a stopped test gateway, found later)."""
        made = asyncio.ensure_future(self._run(self._start_sync, spec, volumes, uid))
        try:
            return await asyncio.shield(made)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self.stop(await made)
            raise

    async def keep_workspace(self, spec: KernelSpec) -> None:
        # a child's files are its host's, and so is their keeping (its spec names the host's session)
        await self.workspaces.keep(replace(spec, host=None, kernel=spec.host.image_kernel) if spec.host else spec)

    def _start_sync(self, spec: KernelSpec, store_volumes: dict[str, str] | None, uid: int) -> KernelHandle:
        self._client()  # an engine that does not answer fails here, before anything is made
        self._watch_ooms()
        kernel_id = secrets.token_hex(6)
        key = secrets.token_hex(32)
        conn_dir = self._make_conn_dir(kernel_id, key, uid)
        volumes = {str(conn_dir): {"bind": CONTAINER_CONN_DIR, "mode": "rw"}}
        tmpfs = {"/tmp": f"rw,exec,nosuid,nodev,size={spec.tmp_size_mb}m,mode=1777"}
        if store_volumes is None:
            tmpfs.update(session_mounts(spec, uid, self._gid(uid)))
        else:
            volumes.update({volume: {"bind": path, "mode": STORE_MOUNT_MODE} for path, volume in store_volumes.items()})
        try:
            container = self._run_container(
                spec.image,
                command=self._command(uid),
                name=f"kernelgw-{self.gateway_name}-{kernel_id}",
                detach=True,
                labels=self._labels(spec, kernel_id, uid),
                network_mode="none",
                read_only=True,
                tmpfs=tmpfs,
                shm_size=f"{spec.shm_size_mb}m",
                volumes=volumes,
                working_dir=WORKSPACE_DIR,
                **self._identity(uid, spec.runtime),
                security_opt=security_options(spec.runtime),
                **process_limits(spec),
                mem_limit=f"{spec.memory_mb}m",
                memswap_limit=f"{spec.memory_mb}m",
                nano_cpus=int(spec.cpus * 1e9),
                init=True,
                hostname="sandbox",
                environment={**KERNEL_ACCOUNT_ENV, **spec.env},
                runtime=spec.runtime,
            )
        except docker.errors.ImageNotFound as exc:
            shutil.rmtree(conn_dir, ignore_errors=True)
            build = "kernelgw image build" + ("" if spec.kernel == "python3" else f" --kernel {spec.kernel}")
            raise ImageNotFound(f"Kernel image {spec.image!r} is not present. Build it with `{build}`.") from exc
        except docker.errors.APIError as exc:
            shutil.rmtree(conn_dir, ignore_errors=True)
            self._remove_by_label(LABEL_KERNEL, kernel_id)
            raise KernelStartFailed(f"Could not start a kernel container: {exc.explanation or exc}") from exc
        except docker.errors.DockerException as exc:
            shutil.rmtree(conn_dir, ignore_errors=True)
            raise EngineUnavailable(f"The Docker engine failed: {exc}") from exc
        if container.id is None:  # the stubs allow it; docker-py fetched the container by its id
            shutil.rmtree(conn_dir, ignore_errors=True)
            self._remove_by_label(LABEL_KERNEL, kernel_id)
            raise KernelStartFailed("The Docker engine returned no id for the kernel container.")
        return KernelHandle(
            kernel_id=kernel_id,
            session_id=spec.session_id,
            container_id=container.id,
            conn_dir=conn_dir,
            connection=connection_info(str(conn_dir / "k"), key),
        )

    def _run_container(self, image: str, *, name: str, **options: Any) -> Container:
        """``containers.run`` with the bounded log (`CONTAINER_LOG`), tried again
        when the engine says the start raced itself ("cannot start a stopped
        process", "cannot start an already running container": seen with Docker
        20.10 and containerd when many containers start at once, the CI's two
        test passes side by side); the half-made container is removed first. Any other error is raised at once."""
        client = self._client()
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                container: Container = client.containers.run(image, name=name, log_config=CONTAINER_LOG, **options)
                return container
            except docker.errors.APIError as exc:
                text = str(exc.explanation or exc)
                if attempt == START_ATTEMPTS or not any(t in text for t in RACED_START):
                    raise
                log.warning("starting container %s failed (%s); trying again", name, text)
                with contextlib.suppress(docker.errors.DockerException):
                    client.api.remove_container(name, force=True, v=True)
                time.sleep(0.2 * attempt)
        raise AssertionError("unreachable")

    def _remove_by_label(self, label: str, value: str) -> None:
        try:
            for c in self._client().containers.list(all=True, filters={"label": f"{label}={value}"}):
                c.remove(force=True, v=True)
        except docker.errors.DockerException:
            log.warning("could not remove containers with %s=%s", label, value, exc_info=True)

    async def stop(self, handle: KernelHandle) -> None:
        if handle.host is not None:
            await self.children.stop(handle)
            return
        await self._run(self._stop_sync, handle)
        self._commands.hang_up(handle.container_id)

    def _stop_sync(self, handle: KernelHandle) -> None:
        try:
            self._client().api.remove_container(handle.container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                log.warning("removing container %s failed: %s", handle.container_id[:12], exc)
        shutil.rmtree(handle.conn_dir, ignore_errors=True)
        self._ooms.forget(handle.container_id)

    async def end_session(self, session_id: str) -> None:
        await self.workspaces.end(session_id)
        self._session_uids.pop(session_id, None)  # free once its containers are gone

    async def signal(self, handle: KernelHandle, signum: int) -> None:
        if handle.host is not None:
            await self.children.signal(handle, signum)
            return
        try:
            await self._run(self._client().api.kill, handle.container_id, signal=signum)
        except docker.errors.APIError as exc:
            # 409: not running. Nothing to interrupt; the state poll reports death.
            log.info("signal %s to %s failed: %s", signum, handle.container_id[:12], exc)

    async def state(self, handle: KernelHandle, oom_seen: int = 0) -> KernelState:
        state = await self._state(handle, oom_seen)
        # The engine's ``oom`` event can come after the exit (seen under gVisor:
        # the shim sent the exit first): a SIGKILL exit is asked about again for a
        # moment before it is called anything but out-of-memory.
        for _ in range(OOM_RECHECKS):
            if state.status != "exited" or state.oom_killed or state.exit_code != 128 + 9:
                break
            await asyncio.sleep(OOM_RECHECK_S)
            state = replace(state, **self._oom_verdict(handle, oom_seen, bool(state.oom_killed)))
        return state

    def oom_kills(self, handle: KernelHandle) -> int:
        return self._ooms.count(handle.container_id)

    def _oom_verdict(self, handle: KernelHandle, oom_seen: int, flag: bool) -> dict[str, Any]:
        """``oom_killed`` and ``oom_kills`` of an exited kernel: counted from the
        engine's events (`OomCounter`), or its sticky flag while they are not read."""
        kills = self._ooms.count(handle.container_id)
        if not self._ooms.watching:
            return {"oom_killed": flag, "oom_kills": kills}
        return {"oom_killed": kills > oom_seen, "oom_kills": kills}

    def _watch_ooms(self) -> None:
        """Subscribe to the engine's ``oom`` events, once (blocking)."""
        try:
            self._ooms.ensure_watching()
        except docker.errors.DockerException as exc:
            log.warning("subscribing to the engine's out-of-memory events failed: %s", exc)

    async def _state(self, handle: KernelHandle, oom_seen: int) -> KernelState:
        if handle.host is not None:
            state = await self.children.state(handle)
            if state.alive:
                return replace(state, oom_kills=self._ooms.count(handle.container_id))
            # an out-of-memory kill ends the child, or (gVisor) the whole container
            return replace(state, **self._oom_verdict(handle, oom_seen, False))
        try:
            info = await self._run(self._client().api.inspect_container, handle.container_id)
        except docker.errors.NotFound:
            return KernelState(status="missing")
        except docker.errors.DockerException as exc:
            # Engine hiccup: do not declare the kernel dead on a failed question.
            return KernelState(status="running", error=str(exc))
        st = info.get("State", {})
        if st.get("Running"):
            return KernelState(status="running", oom_kills=self._ooms.count(handle.container_id))
        return KernelState(
            status="exited",
            exit_code=st.get("ExitCode"),
            error=st.get("Error") or None,
            **self._oom_verdict(handle, oom_seen, bool(st.get("OOMKilled"))),
        )

    async def counters(self, handle: KernelHandle) -> KernelCounters:
        try:
            stats = await self._run(
                self._client().api.stats, handle.container_id, decode=False, stream=False, one_shot=True
            )
        except docker.errors.NotFound:
            raise KernelDied("The kernel's container no longer exists; restart the session.") from None
        except docker.errors.DockerException as exc:
            raise BackendError(f"the engine did not report the container's use: {exc}") from exc
        return counters_from_stats(stats, time.monotonic())

    async def seal(self, handle: KernelHandle) -> None:
        await self._run(self._seal_sync, handle)

    def _seal_sync(self, handle: KernelHandle) -> None:
        expected = {f"k-{port}" for port in IPC_PORTS.values()}
        try:
            fd = os.open(handle.conn_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            raise KernelStartFailed(f"The kernel's connection directory is not usable: {exc}") from exc
        try:
            for name in expected:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    raise KernelStartFailed(f"The kernel did not create its socket {name}.") from None
                if not stat.S_ISSOCK(st.st_mode):
                    raise KernelStartFailed(f"{name} in the kernel's connection directory is not a socket.")
            if os.geteuid() == 0:
                # root:root 0700: the kernel (its own uid, no capabilities) can no longer
                # add, remove or rename anything here; bound sockets keep working.
                os.fchown(fd, 0, 0)
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)

    async def reap_orphans(self) -> list[str]:
        return await self.reap_except(set())

    async def list_kernels(self) -> list[KernelContainer]:
        return await self._run(self._list_sync)

    def _list_sync(self) -> list[KernelContainer]:
        self._watch_ooms()  # kernels found again after a restart
        found = self._client().api.containers(all=True, filters={"label": f"{LABEL_GATEWAY}={self.gateway_name}"})
        found = [c for c in found if LABEL_STORE not in (c.get("Labels") or {})]
        return [
            KernelContainer(
                container_id=c["Id"],
                kernel_id=(c.get("Labels") or {}).get(LABEL_KERNEL, ""),
                session_id=(c.get("Labels") or {}).get(LABEL_SESSION, ""),
                running=c.get("State") == "running",
            )
            for c in found
        ]

    async def reap_except(self, keep: set[str]) -> list[str]:
        return await self._run(self._reap_sync, keep)

    def _reap_sync(self, keep: set[str]) -> list[str]:
        removed: list[str] = []
        api = self._client().api
        # one listing with the labels (the high-level list inspected each container
        # again: 20 kept kernels cost a restart ~50 ms before it could listen)
        containers = api.containers(all=True, filters={"label": f"{LABEL_GATEWAY}={self.gateway_name}"})
        labels = [c.get("Labels") or {} for c in containers]
        # the stores of the kept kernels' sessions stay, with their volumes
        kept = {found.get(LABEL_SESSION) for found in labels if found.get(LABEL_KERNEL) in keep}
        for c, found in zip(containers, labels, strict=True):
            if found.get(LABEL_KERNEL) in keep or found.get(LABEL_STORE) in kept:
                continue
            try:
                api.remove_container(c["Id"], force=True, v=True)
                removed.append(str((c.get("Names") or ["/" + c["Id"][:12]])[0]).lstrip("/"))
            except docker.errors.NotFound:
                pass
        for volume in self._client().volumes.list(filters={"label": f"{LABEL_GATEWAY}={self.gateway_name}"}):
            if (volume.attrs.get("Labels") or {}).get(LABEL_STORE) not in kept:
                try:
                    volume.remove(force=True)
                    removed.append(str(volume.name))
                except docker.errors.NotFound:
                    pass
        if self.base_dir.exists():
            for d in self.base_dir.iterdir():
                if d.name not in keep:
                    shutil.rmtree(d, ignore_errors=True)
                    continue
                # the child kernels of a kept kernel ended with the gateway that started them
                for child in d.iterdir():
                    if child.name.startswith(CHILD_CONN_PREFIX) and child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child, ignore_errors=True)
        if removed:
            log.warning("removed %d container(s) left by a previous gateway: %s", len(removed), removed)
        return removed

    async def exec(
        self, handle: KernelHandle, argv: list[str], *, stdin: bool = False, timeout: float = 120.0
    ) -> DockerExec:
        return await self._run(self._exec_sync, handle, argv, stdin, timeout)

    def _exec_sync(
        self, handle: KernelHandle, argv: list[str], stdin: bool, timeout: float, as_root: bool = False
    ) -> DockerExec:
        api = self._client().api
        uid = 0 if as_root else self._session_uid(handle.session_id)
        try:
            created = api.exec_create(
                handle.container_id,
                helper_command(argv),
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                user=f"{uid}:{self._gid(uid)}",
                workdir="/",
                environment=HELPER_LOADER_RESET,
            )
            sock = api.exec_start(created["Id"], socket=True)
        except docker.errors.NotFound as exc:
            raise KernelDied("The kernel container no longer exists; restart the session.") from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # not running, paused or restarting
                raise KernelDied(
                    f"The kernel container is not running ({exc.explanation or exc}); restart the session."
                ) from exc
            raise EngineUnavailable(f"The Docker engine refused to run a helper: {exc.explanation or exc}") from exc
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"The Docker engine failed: {exc}") from exc
        return DockerExec(self, created["Id"], sock, timeout)

    async def run_command(
        self,
        handle: KernelHandle,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        stdin: bool = False,
        tty: TerminalSize | None = None,
        root: bool = False,
    ) -> DockerCommand:
        sock, exec_id = await self._run(self._command_sync, handle, argv, env, cwd, stdin or tty is not None, tty, root)
        command = DockerCommand(self, exec_id, sock, tty=tty is not None)
        self._commands.add(handle.container_id, command)
        try:
            if tty is not None:  # at once, before the pid line: the program most likely starts at this size
                await command.resize(tty)
            await command.started()
        except BaseException:
            await command.close()
            raise
        return command

    def _command_sync(
        self,
        handle: KernelHandle,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        stdin: bool,
        tty: TerminalSize | None,
        root: bool,
    ) -> tuple[Any, str]:
        uid = self._session_uid(handle.session_id)
        user, drop = "0:0", command_privileges(uid, self._gid(uid), root)
        if not self._init_apart(uid):  # the kernel itself runs as root: nothing to drop to
            user, drop = f"{uid}:{self._gid(uid)}", []
        full = [*drop, "/bin/sh", "-c", COMMAND_WRAPPER, "sh", cwd, env.get("PWD", cwd), *argv]
        return self._exec_start_sync(handle, full, user, "/", env, stdin, tty is not None)

    def _exec_start_sync(
        self,
        handle: KernelHandle,
        argv: list[str],
        user: str,
        cwd: str,
        env: dict[str, str],
        stdin: bool,
        tty: bool = False,
    ) -> tuple[Any, str]:
        """An exec with its hijacked connection: a command's, a child kernel's."""
        api = self._client().api
        try:
            created = api.exec_create(
                handle.container_id,
                argv,
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=tty,
                user=user,
                workdir=cwd,
                environment=env,
            )
            # the start says tty too, or the engine frames the terminal's stream as stdout
            sock = api.exec_start(created["Id"], socket=True, tty=tty)
        except docker.errors.NotFound as exc:
            raise KernelDied("The kernel container no longer exists; restart the session.") from exc
        except docker.errors.APIError as exc:
            if exc.status_code == 409:
                raise KernelDied(
                    f"The kernel container is not running ({exc.explanation or exc}); restart the session."
                ) from exc
            raise EngineUnavailable(f"The Docker engine refused to run a command: {exc.explanation or exc}") from exc
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"The Docker engine failed: {exc}") from exc
        return sock, str(created["Id"])

    async def signal_command(
        self, handle: KernelHandle, pid: int, signum: int, *, session: bool = False, root: bool = False
    ) -> None:
        await self._signal(handle, SIGNAL_SESSION if session else SIGNAL_GROUP, pid, signum, root=root)

    async def signal_process(self, host: KernelHandle, pid: int, signum: int, *, group: bool) -> None:
        await self._signal(host, SIGNAL_GROUP if group else SIGNAL_PID, pid, signum)

    async def _signal(self, handle: KernelHandle, script: str, pid: int, signum: int, *, root: bool = False) -> None:
        argv = ["/bin/sh", "-c", script, "sh", str(signum), str(pid)]
        process = await self._run(self._exec_sync, handle, argv, False, 30.0, root)
        try:
            while await process.read():
                pass
        finally:
            await process.close()

    async def start_process(self, host: KernelHandle, argv: list[str], env: dict[str, str]) -> DockerCommand:
        """A child kernel's process (`ChildOps.start_process`): started as root and
        dropped to the sandbox's uid by the same ``setpriv`` as the main kernel
        (an exec as the uid would keep the container's capabilities in its
        bounding set), absolute paths only for what runs as root, and the
        loader's variables reset on the exec itself."""
        uid = await self._run(self._session_uid, host.session_id)
        user = "0:0" if self._init_apart(uid) else f"{uid}:{self._gid(uid)}"
        drop = command_privileges(uid, self._gid(uid), root=False) if self._init_apart(uid) else []
        full = ["/bin/sh", "-c", COMMAND_WRAPPER, "sh", "/", "/", *drop, *argv]
        env = {**env, **HELPER_LOADER_RESET}
        sock, exec_id = await self._run(self._exec_start_sync, host, full, user, "/", env, True)
        command = DockerCommand(self, exec_id, sock)
        self._commands.add(host.container_id, command)
        try:
            await command.started()
        except BaseException:
            await command.close()
            raise
        return command

    async def host_running(self, host: KernelHandle) -> bool:
        try:
            info = await self._run(self._client().api.inspect_container, host.container_id)
        except docker.errors.NotFound:
            return False
        except docker.errors.DockerException:
            return True  # an engine hiccup: not a verdict
        return bool((info.get("State") or {}).get("Running"))

    async def image_labels(self, image: str) -> dict[str, str] | None:
        def labels() -> dict[str, str] | None:
            try:
                # typed here: the stubs leave APIClient.inspect_image unannotated
                inspect_image: Callable[[str], dict[str, Any]] = self._client().api.inspect_image
                attrs = inspect_image(image)
            except docker.errors.ImageNotFound:
                return None
            except docker.errors.DockerException as exc:
                raise EngineUnavailable(f"The Docker engine failed: {exc}") from exc
            return dict((attrs.get("Config") or {}).get("Labels") or {})

        return await self._run(labels)

    async def health(self, image: str) -> EngineHealth:
        def check() -> EngineHealth:
            try:
                client = self._client()
                client.ping()
            except Exception as exc:  # any failure means "engine not usable"
                return EngineHealth(engine=False, image=False, detail=str(exc))
            try:
                client.images.get(image)
            except docker.errors.ImageNotFound:
                return EngineHealth(engine=True, image=False, detail=f"image {image} missing")
            return EngineHealth(engine=True, image=True)

        return await self._run(check)

    async def close(self) -> None:
        await self.children.close()
        await self._run(self._ooms.close)
        if self._docker is not None:
            await self._run(self._docker.close)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):
            self.base_dir.rmdir()  # empty once every kernel is stopped; else leave it


class DockerExec:
    """A ``docker exec`` with its hijacked connection (see ``ExecProcess``).

    Without a TTY the engine multiplexes stdout and stderr on the connection as
    frames: an 8-byte header (stream id, 3 zero bytes, big-endian length) and
    the payload. ``read`` undoes that; stderr is kept (capped). Every blocking
    socket call runs on the backend's thread pool, bounded by the timeout.
    """

    STDERR_CAP = 64 * 1024
    READ_SIZE = 1 << 20

    def __init__(self, backend: DockerBackend, exec_id: str, sock: Any, timeout: float) -> None:
        self._backend = backend
        self.exec_id = exec_id
        self._holder = sock  # keeps docker-py's response (and so the connection) alive
        self._sock: socket.socket = getattr(sock, "_sock", sock)
        self._sock.setblocking(False)
        self._head = bytearray(read_ahead(sock))
        """What the HTTP client read of the stream with the headers (`read_ahead`): read first."""
        self._sock.settimeout(timeout)
        self._timeout = timeout
        self._frame_left = 0
        self._frame_stream = 1
        self._eof = False
        self._stderr = bytearray()
        self._closed = False
        # One reader of the frame stream at a time, held by the reading thread: a
        # read whose awaiting coroutine was cancelled (a client cut a download off)
        # goes on in its executor thread, and a second read (the wind-down's drain)
        # must not interleave with it (the frame counter went negative, or hung).
        self._read_lock = threading.Lock()

    @property
    def stderr(self) -> bytes:
        return bytes(self._stderr)

    def _io_error(self, exc: OSError) -> BackendError:
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return BackendError(f"A helper in the kernel container did not answer within {self._timeout:g}s.")
        return BackendError(f"The connection to a helper in the kernel container broke: {exc}")

    async def write(self, data: bytes) -> None:
        try:
            await self._backend._run(self._sock.sendall, data)
        except OSError as exc:
            raise self._io_error(exc) from exc

    async def close_stdin(self) -> None:
        try:
            await self._backend._run(self._sock.shutdown, socket.SHUT_WR)
        except OSError as exc:
            raise self._io_error(exc) from exc

    async def read(self) -> bytes:
        try:
            return await self._backend._run(self._read_sync)
        except OSError as exc:
            raise self._io_error(exc) from exc

    def _recv(self, n: int) -> bytes:
        if self._head:
            data = bytes(self._head[:n])
            del self._head[:n]
            return data
        return self._sock.recv(n)

    def _recv_exact(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            data = self._recv(n - len(buf))
            if not data:
                return None
            buf += data
        return buf

    def _read_sync(self) -> bytes:
        with self._read_lock:
            return self._read_frames()

    def _read_frames(self) -> bytes:
        while not self._eof:
            if self._frame_left == 0:
                header = self._recv_exact(8)
                if header is None:
                    self._eof = True
                    break
                self._frame_stream = header[0]
                self._frame_left = int.from_bytes(header[4:8], "big")
                continue
            data = self._recv(min(self._frame_left, self.READ_SIZE))
            if not data:
                self._eof = True
                break
            self._frame_left -= len(data)
            if self._frame_stream == 1:
                return data
            if self._frame_stream == 2 and len(self._stderr) < self.STDERR_CAP:
                self._stderr += data[: self.STDERR_CAP - len(self._stderr)]
        return b""

    async def exit_code(self) -> int | None:
        return await exec_exit_code(self._backend, self.exec_id)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def close() -> None:
            try:
                with contextlib.suppress(OSError):
                    # ends the connection now, whoever else holds the socket object
                    self._sock.shutdown(socket.SHUT_RDWR)
                self._sock.close()
            finally:
                with contextlib.suppress(Exception):
                    self._holder.close()

        await self._backend._run(close)
