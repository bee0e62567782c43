"""A session's workspace that outlives its kernel containers (`WorkspaceStore`).

A session's workspace and installed packages outlive its kernel containers: they
are tmpfs volumes of the engine (same sizes and mount options as before, so the
quota is still the kernel's ``ENOSPC``), kept mounted between kernels by a small
store container per session that only sleeps. The engine unmounts a tmpfs volume,
and loses its files, when no container uses it; the store is that container. It
starts once the session has files to keep (``keep_workspace``: the first upload,
install or cell that wrote a file, and any restart), not with every kernel, so a
session that never writes a file costs one container as before. A restart, a
timeout's restart or an out-of-memory kill then replaces only the kernel's
container; ending the session removes the store and its volumes. Only for
runtimes in ``STORE_RUNTIMES``: gVisor 20221219 (Debian's) answers ``statx`` on a
bind-mounted volume with EINVAL, so ``ls`` and ``cp`` in ``/workspace`` would
fail; its sessions keep the tmpfs inside the sandbox, which ends with it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import docker
import docker.errors
from docker.models.containers import Container

from kernelgw.errors import KernelStartFailed
from kernelgw.runtime.backends.base import PACKAGES_DIR, WORKSPACE_DIR, KernelSpec
from kernelgw.runtime.backends.labels import LABEL_GATEWAY, LABEL_STORE, LABEL_UID

log = logging.getLogger(__name__)

T = TypeVar("T")

ENDED_REMEMBERED = 10_000
"""Ended sessions a store remembers (`WorkspaceStore.keep`)."""
STORE_RUNTIMES = frozenset({"runc"})
"""Runtimes whose kernels get a workspace that outlives them (see the module doc)."""
STORE_COMMAND = ["sleep", "infinity"]
STORE_CPUS = 0.25
"""The store's CPU quota. Its ``sleep`` uses none, but its container's start
runs in its cgroup: at 0.05 of a core that start took 0.27-0.54 s here against
0.17-0.24 s at 0.25 to 1, and the first cell after a session's first file
waits for it."""
STORE_MOUNT_MODE = "rw,nocopy"
"""nocopy: the engine would otherwise copy the image's directory (and its owner
and mode) into an empty volume on its first mount."""


class OnThreads(Protocol):
    """Runs a blocking call on the backend's thread pool (the Docker SDK blocks)."""

    def __call__(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]: ...


def session_mounts(spec: KernelSpec, uid: int, gid: int) -> dict[str, str]:
    """The session's own tmpfs mounts and their options. exec on all of them
    (Docker's default is noexec): native extensions load from the packages
    mount; why the workspace too, and /dev/shm not: docs/security.md."""
    owner = f"uid={uid},gid={gid}"
    return {
        WORKSPACE_DIR: f"rw,exec,nosuid,nodev,size={spec.workspace_size_mb}m,{owner},mode=0700",
        PACKAGES_DIR: f"rw,exec,nosuid,nodev,size={spec.packages_size_mb}m,{owner},mode=0755",
    }


class WorkspaceStore:
    """The store containers and volumes of one gateway's sessions. The engine,
    the thread pool and the container start (with its retries) are the
    backend's, given in."""

    def __init__(
        self,
        *,
        gateway_name: str,
        uid_of: Callable[[str], tuple[int, int]],
        enabled: bool,
        client: Callable[[], docker.DockerClient],
        run: OnThreads,
        run_container: Callable[..., Container],
        security_opt: Callable[[], list[str]],
    ) -> None:
        self.gateway_name = gateway_name
        self._uid_of = uid_of
        """A session's uid and gid (blocking: called on the thread pool). Its
        kernels' own, so the workspace files keep their owner between kernels."""
        self.enabled = enabled
        self._client = client
        self._run = run
        self._run_container = run_container
        self._security_opt = security_opt
        self._starts: dict[str, asyncio.Future[None]] = {}
        """Store containers being started, by session id (see ``end``)."""
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Sessions ended lately: a late `keep` for one makes no store, until a
        kernel starts for it again (`volumes`)."""

    def keeps(self, spec: KernelSpec) -> bool:
        """Whether the kernels of ``spec`` get a workspace that outlives them."""
        return self.enabled and spec.runtime in STORE_RUNTIMES

    async def volumes(self, spec: KernelSpec) -> dict[str, str]:
        """The session's volumes by mount path, for a kernel to mount (the
        volumes only: the store starts once there are files to keep).

        A kernel starting for a session ended here means it goes on: a pause
        ends its store (its files are in the snapshot), and the resume's kernel
        must get one again, or its files would not outlive that kernel. Its
        starts and ends take turns (the session's lifecycle lock)."""
        self._ended.pop(spec.session_id, None)
        volumes, _ = await self._run(self._prepare, spec)
        return volumes

    async def keep(self, spec: KernelSpec) -> None:
        """Start the session's store unless it runs (``Backend.keep_workspace``)."""
        if not self.keeps(spec) or spec.session_id in self._ended:
            return  # ended: a store made now would outlive its session
        store = self._starts.get(spec.session_id)
        if store is None:
            # end waits for it: a store must not appear after its session ended
            store = asyncio.ensure_future(self._run(self._ensure_running, spec))
            self._starts[spec.session_id] = store
            store.add_done_callback(lambda done: self._started(spec.session_id, done))
        # shielded: a caller cancelled meanwhile (the queue's worker, stopped by a
        # delete) must not cancel the start itself. Its engine call goes on in a
        # thread, and `end` must wait until that call made the store, to remove it.
        await asyncio.shield(store)

    def _started(self, session_id: str, store: asyncio.Future[None]) -> None:
        """A store's start ended: forget it, and take its exception (the caller
        that would have may have been cancelled; it was logged there if not)."""
        self._starts.pop(session_id, None)
        if not store.cancelled():
            store.exception()

    async def end(self, session_id: str) -> None:
        """Remove the session's store and volumes, after a start under way."""
        self._ended[session_id] = None
        while len(self._ended) > ENDED_REMEMBERED:
            self._ended.popitem(last=False)
        starting = self._starts.get(session_id)
        if starting is not None:  # its store may still be on its way: remove it after
            await asyncio.wait([starting])
        try:
            await self._run(self._remove, session_id)
        except docker.errors.DockerException as exc:
            log.warning("removing the workspace of session %s failed: %s", session_id, exc)

    def _ensure_running(self, spec: KernelSpec) -> None:
        volumes, missing = self._prepare(spec)
        if missing:
            self._start_store(spec, volumes)

    def _name(self, session_id: str) -> str:
        return f"kernelgw-{self.gateway_name}-{session_id}-store"

    def _prepare(self, spec: KernelSpec) -> tuple[dict[str, str], bool]:
        """The session's volumes by mount path, and whether its store container
        must be started: created on the first start, reused by later kernels."""
        mounts = session_mounts(spec, *self._uid_of(spec.session_id))
        name = self._name(spec.session_id)
        volumes = {path: f"{name}-{path.rstrip('/').rsplit('/', 1)[-1]}" for path in mounts}
        client = self._client()
        try:
            try:
                running = client.api.inspect_container(name).get("State", {}).get("Running", False)
            except docker.errors.NotFound:
                running = None
            if running:
                return volumes, False
            if running is not None:
                # stopped (say, the engine restarted): its tmpfs volumes were unmounted
                # and their files are gone; start over with empty ones
                self._remove(spec.session_id)
            for path, volume in volumes.items():
                # the engine's options field is mount(8)'s: the flags go through as flags
                client.volumes.create(
                    volume,
                    driver="local",
                    driver_opts={"type": "tmpfs", "device": "tmpfs", "o": mounts[path].removeprefix("rw,")},
                    labels={LABEL_GATEWAY: self.gateway_name, LABEL_STORE: spec.session_id},
                )
        except docker.errors.DockerException as exc:
            raise KernelStartFailed(f"Could not create the session's workspace volumes: {exc}") from exc
        return volumes, True

    def _start_store(self, spec: KernelSpec, volumes: dict[str, str]) -> None:
        """Start the container that keeps the session's volumes mounted."""
        uid, gid = self._uid_of(spec.session_id)
        try:
            self._run_container(
                spec.image,
                command=STORE_COMMAND,
                name=self._name(spec.session_id),
                detach=True,
                # its uid label holds the session's uid while its kernels come and go
                labels={LABEL_GATEWAY: self.gateway_name, LABEL_STORE: spec.session_id, LABEL_UID: str(uid)},
                network_mode="none",
                read_only=True,
                user=f"{uid}:{gid}",
                cap_drop=["ALL"],
                security_opt=self._security_opt(),
                pids_limit=4,
                mem_limit="16m",
                memswap_limit="16m",
                nano_cpus=int(STORE_CPUS * 1e9),
                volumes={volume: {"bind": path, "mode": STORE_MOUNT_MODE} for path, volume in volumes.items()},
                working_dir="/",
                runtime="runc",  # it runs only the image's sleep, never user code
            )
        except docker.errors.DockerException as exc:
            raise KernelStartFailed(f"Could not start the session's workspace store: {exc}") from exc

    def _remove(self, session_id: str) -> None:
        """Remove the session's store container, then its volumes (a volume in use
        cannot be removed). Idempotent."""
        client = self._client()
        try:
            client.api.remove_container(self._name(session_id), force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise
        for volume in client.volumes.list(filters={"label": f"{LABEL_STORE}={session_id}"}):
            if (volume.attrs.get("Labels") or {}).get(LABEL_GATEWAY) != self.gateway_name:
                continue
            try:
                volume.remove(force=True)
            except docker.errors.NotFound:
                pass
