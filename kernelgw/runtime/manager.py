"""All sessions of one gateway: creation within limits, lookup, idle reaping, leases.

Like jupyter_server's MultiKernelManager plus its culler, but each kernel lives in
its own container. At start the manager reattaches the live kernels a previous
process of its name left (by default a gateway that stops leaves them running)
and removes the containers nobody can reattach. A session created with a lease
(`kernelgw.runtime.lease`) ends, or pauses, when it runs out.

A session may hold child sessions (E2B's contexts, `create_child`): kernels
that run as processes in its container, each a `KernelSession` of its own for
cells, events and interrupts. They belong to the parent's owner, are bounded
per parent (`MAX_CHILDREN`), are neither listed nor counted as sessions (the
sandbox is the unit), are not stored (their cells are audited as the parent's,
`kernelgw.runtime.child_audit`), and end with the parent's kernel (a
delete, a pause, a restart; a gateway restart too).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import functools
import logging
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from kernelgw.config import Settings
from kernelgw.errors import (
    BadRequest,
    ChildNotFound,
    KernelDied,
    KernelGWError,
    KernelNotInImage,
    KernelNotOffered,
    LimitExceeded,
    SessionBusy,
    SessionLimitReached,
    SessionNotFound,
    StorageUnavailable,
)
from kernelgw.kernels import BUNDLES, DEFAULT_KERNEL, bundle_image, image_kernels, profile
from kernelgw.keys import ANONYMOUS, KeyQuotas, Principal
from kernelgw.runtime.backends.base import Backend, KernelContainer, KernelHandle, KernelHost, KernelSpec
from kernelgw.runtime.child_audit import ChildAudit
from kernelgw.runtime.lease import (
    LEASE_ENDED_REASON,
    LEASE_PAUSED_REASON,
    SessionTerms,
    check_access_sha256,
    check_lease_end,
    check_lease_s,
    check_metadata,
    lease_until,
)
from kernelgw.runtime.lineage import LineageCell, ReplayReport
from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.pause import (
    NamespaceSummary,
    PausedBudgetExceeded,
    SnapshotBudget,
    SnapshotTooLarge,
    remove_snapshot,
)
from kernelgw.runtime.pool import PoolProfile, WarmPool
from kernelgw.runtime.recorder import Recorder, StoredSession
from kernelgw.runtime.session import KernelSession, Paused, SessionConfig
from kernelgw.runtime.workspace import copy_session_files, tree_caps
from kernelgw.tasks import cancel_and_wait

log = logging.getLogger(__name__)

KERNEL_GONE_REASON = "the kernel container was gone when the gateway restarted"
LEASE_RETRY_S = 5.0
"""After a lease's end failed unexpectedly, how long until it is tried again."""
LEASE_PAUSE_TRIES = 3
"""Cells a lease's pause interrupts before it gives up and ends the session."""
MAX_CHILDREN = 8
"""Child sessions (contexts) one session may hold at once."""
CHILD_CWD = "/home/user"
"""A child kernel's working directory unless asked otherwise (E2B's home)."""


@dataclass(frozen=True)
class SessionOptions:
    """What a client may choose for a new session; ``None`` means the default."""

    memory_mb: int | None = None
    cpus: float | None = None
    timeout: float | None = None
    image: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    runtime: str | None = None
    auto_replay: bool = False
    kernel: str | None = None
    """A kernel name of the gateway's ``kernels`` (None: the first of them)."""
    metadata: dict[str, str] = field(default_factory=dict)
    """Free labels kept with the session (E2B's metadata; at most 64, `kernelgw.runtime.lease`)."""
    lease_s: float | None = None
    """The session ends, or pauses (``on_lease_end``), this long from its creation
    unless `SessionManager.set_lease` moves it (None: no lease)."""
    on_lease_end: Literal["end", "pause"] = "end"
    access_sha256: str | None = None
    """The sha256 (hex) of a per-session access token the face issued (`KernelSession.check_access`)."""


@dataclass(frozen=True)
class Fork:
    """How a forked session was made (``ForkReport`` on the wire)."""

    source: str
    copied_bytes: int
    copy_ms: float
    replay: ReplayReport
    namespace: NamespaceSummary | None = None
    """A fork of a paused session: the variables its snapshot gave (no replay)."""


def _stored_terms(stored: StoredSession, *, lease: bool) -> SessionTerms:
    """A stored session's terms as they were (``lease=False``: without its lease)."""
    return SessionTerms(
        metadata=dict(stored.metadata),
        lease_until=stored.lease_until if lease else None,
        on_lease_end="pause" if stored.on_lease_end == "pause" else "end",
        access_sha256=stored.access_sha256,
    )


class SessionManager:
    def __init__(
        self,
        settings: Settings,
        backend: Backend,
        recorder: Recorder | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.recorder = recorder
        self.metrics = metrics
        self._sessions: dict[str, KernelSession] = {}
        self._starting_by: dict[str, int] = {}
        """Sessions being started, by API key id ("" without authentication)."""
        self._reaper: asyncio.Task[None] | None = None
        self._lease_keeper: asyncio.Task[None] | None = None
        self._leases_changed = asyncio.Event()
        """Set when a lease is set or one's end was handled: the keeper looks again."""
        self._lease_ends: dict[str, asyncio.Task[None]] = {}
        """Sessions whose lease ran out, being ended or paused."""
        self._lease_acting: set[str] = set()
        """Of them, those past the last check: too late to extend."""
        self.snapshots = SnapshotBudget(
            settings.paused_budget_mb * (1 << 20),
            on_change=metrics.paused_snapshot_bytes.set if metrics is not None else None,
        )
        """The disk paused sessions' snapshots hold, within ``paused_budget_mb``."""
        self.pools: dict[PoolProfile, WarmPool] = {}
        self.held_elsewhere: Callable[[str], Awaitable[int]] | None = None
        """Sessions a key holds on other gateways of a cluster (kernelgw.cluster):
        a key's session quota counts them too."""

    async def start(self) -> None:
        """Reattach what a previous gateway of this name left running, remove the
        rest, then start reaping and warming the pools."""
        await self.reattach()
        self._reaper = asyncio.create_task(self._reap_loop(), name="idle-reaper")
        # its first round ends at once the leases that ran out while no gateway ran
        self._lease_keeper = asyncio.create_task(self._keep_leases(), name="lease-keeper")
        self._start_pools()

    async def reattach(self) -> builtins.list[str]:
        """Reattach every live kernel container of this name whose session is open
        in the store (concurrently); end open sessions whose kernel is gone or
        does not answer; remove every other container. Returns the reattached ids."""
        if self.recorder is None:
            await self.backend.reap_orphans()
            await self._remove_stray_snapshots()
            return []
        try:
            stored = {s.session_id: s for s in await self.recorder.open_sessions(self.settings.replay_buffer_bytes)}
        except StorageUnavailable as exc:
            # without the store nothing can be matched: leave every container for
            # a later start rather than remove kernels that may be reattachable
            log.error("no session reattached, no container removed: %s", exc.message)
            return []
        containers = {c.container_id: c for c in await self.backend.list_kernels()}
        results = await asyncio.gather(
            *(self._reattach_one(s, containers.get(s.handle.container_id)) for s in stored.values())
        )
        reattached = [sid for sid, ok in zip(stored, results, strict=True) if ok]
        await self.recorder.flush()  # their new seq reservations, before anything is served
        keep = {stored[sid].handle.kernel_id for sid in reattached if not stored[sid].paused}
        await self.backend.reap_except(keep)
        await self._remove_stray_snapshots()
        if reattached:
            log.warning("reattached %d session(s) left by a previous gateway", len(reattached))
        return reattached

    async def _reattach_one(self, stored: StoredSession, container: KernelContainer | None) -> bool:
        assert self.recorder is not None
        if stored.paused:
            return await self._restore_paused(stored)
        if container is None or not container.running or container.session_id != stored.session_id:
            await self.recorder.session_lost(stored.session_id, KERNEL_GONE_REASON)
            return False
        config = dataclasses.replace(
            self._session_config(SessionOptions()),
            exec_timeout_s=stored.exec_timeout_s,
            auto_replay=stored.auto_replay,
        )
        session = KernelSession(stored.session_id, stored.spec, self.backend, config, self.recorder, self.metrics)
        session.owner = stored.owner
        session.created_at = stored.created_at
        session.terms = _stored_terms(stored, lease=True)
        try:
            await session.reattach(stored, self.settings.reattach_timeout_s)
        except Exception as exc:
            log.warning("session %s: its kernel could not be reattached: %s", stored.session_id, exc)
            await self.recorder.session_lost(
                stored.session_id, f"the kernel did not answer when the gateway restarted: {exc}"
            )
            return False
        self._sessions[session.id] = session
        if self.metrics is not None:
            self.metrics.sessions_active.set(len(self._sessions))
        return True

    async def _restore_paused(self, stored: StoredSession) -> bool:
        """A session a previous gateway process left paused: back as paused, if its
        snapshot is still on disk."""
        assert self.recorder is not None
        directory = self.snapshot_dir(stored.session_id)
        if not await asyncio.to_thread(directory.is_dir):
            await self.recorder.session_lost(
                stored.session_id, f"the session was paused and its snapshot ({directory}) is gone"
            )
            return False
        config = dataclasses.replace(
            self._session_config(SessionOptions()), exec_timeout_s=stored.exec_timeout_s, auto_replay=stored.auto_replay
        )
        session = KernelSession(stored.session_id, stored.spec, self.backend, config, self.recorder, self.metrics)
        session.owner = stored.owner
        session.created_at = stored.created_at
        session.terms = _stored_terms(stored, lease=False)  # no lease runs while paused
        await session.restore_paused(stored, directory, self.snapshots)
        self._sessions[session.id] = session
        return True

    async def _remove_stray_snapshots(self) -> None:
        """Snapshot directories of no paused session (ended while no gateway ran, or
        a pause cut off by a crash) are removed."""
        root = Path(self.settings.data_dir) / "paused"
        keep = {sid for sid, s in self._sessions.items() if s.state == "paused"}

        def sweep() -> list[str]:
            if not root.is_dir():
                return []
            gone = [d for d in root.iterdir() if d.name not in keep]
            for d in gone:
                shutil.rmtree(d, ignore_errors=True)
            return [d.name for d in gone]

        removed = await asyncio.to_thread(sweep)
        if removed:
            log.warning("removed %d snapshot(s) of sessions no longer paused: %s", len(removed), removed)

    def _start_pools(self) -> None:
        s = self.settings
        wanted = [(SessionOptions(), s.pool_size, s.pool_max_size)] + [
            (
                SessionOptions(memory_mb=p.memory_mb, cpus=p.cpus, image=p.image, runtime=p.runtime, kernel=p.kernel),
                p.size,
                p.max_size,
            )
            for p in s.pool_profiles
        ]
        for opts, size, max_size in wanted:
            if size <= 0 and not max_size:
                continue
            spec = self._spec("pool", opts)  # validates the profile against the maximums
            profile = PoolProfile(spec.image, spec.memory_mb, spec.cpus, spec.runtime)
            pool = WarmPool(
                profile,
                lambda opts=opts: self._start_warm_session(opts),  # type: ignore[misc]
                size=size,
                max_size=max_size if max_size is not None else 2 * size,
                shrink_after_s=s.pool_shrink_after_s,
                metrics=self.metrics,
            )
            self.pools[profile] = pool
            log.info(
                "warm pool: %d kernel%s of %s (%d MB, %g CPUs) started ahead of demand; pool_size=0 turns it off",
                size,
                "" if size == 1 else "s",
                spec.image,
                spec.memory_mb,
                spec.cpus,
            )
            pool.start()

    async def shutdown(self) -> None:
        """Stop reaping and empty the pools; then, with ``on_shutdown=keep``, leave
        the sessions' kernels running (open in the store, counters recorded) for
        the next gateway of this name, else end the sessions. A lease's end cut
        off here is enforced by the next gateway (its lease is stored)."""
        await cancel_and_wait(self._reaper)
        await cancel_and_wait(self._lease_keeper)
        for task in list(self._lease_ends.values()):
            await cancel_and_wait(task)
        await asyncio.gather(*(pool.close() for pool in self.pools.values()), return_exceptions=True)
        if self.settings.on_shutdown == "keep" and self.recorder is not None:
            sessions = [self._sessions.pop(sid) for sid in list(self._sessions)]
            await asyncio.gather(*(s.detach() for s in sessions), return_exceptions=True)
            return
        await asyncio.gather(
            *(self.delete(sid, reason="gateway shutdown") for sid in list(self._sessions)), return_exceptions=True
        )

    # ------------------------------------------------------------------ CRUD
    def _maximums(self, quotas: KeyQuotas | None) -> tuple[int, float, float]:
        """Memory, CPUs and timeout a session may ask for: the gateway's maximums,
        lowered by the key's quotas."""
        s, q = self.settings, quotas or KeyQuotas()
        return (
            min(s.max_memory_mb, q.max_memory_mb or s.max_memory_mb),
            min(s.max_cpus, q.max_cpus or s.max_cpus),
            min(s.max_exec_timeout_s, q.max_timeout_s or s.max_exec_timeout_s),
        )

    def _spec(self, session_id: str, opts: SessionOptions, quotas: KeyQuotas | None = None) -> KernelSpec:
        """The container's spec, within the gateway's maximums and the key's quotas."""
        s = self.settings
        max_memory, max_cpus, max_timeout = self._maximums(quotas)
        memory = opts.memory_mb if opts.memory_mb is not None else min(s.memory_mb, max_memory)
        cpus = opts.cpus if opts.cpus is not None else min(s.cpus, max_cpus)
        if not 64 <= memory <= max_memory:
            raise LimitExceeded(f"memory_mb must be between 64 and {max_memory}; got {memory}")
        if not 0.05 <= cpus <= max_cpus:
            raise LimitExceeded(f"cpus must be between 0.05 and {max_cpus:g}; got {cpus:g}")
        if opts.timeout is not None and not 0 < opts.timeout <= max_timeout:
            raise LimitExceeded(f"timeout must be greater than 0 and at most {max_timeout:g} seconds")
        runtime = opts.runtime or s.runtime
        runtimes = {s.runtime, *s.allowed_runtimes}
        if runtime not in runtimes:
            raise LimitExceeded(f"runtime {runtime!r} is not allowed; allowed runtimes: {sorted(runtimes)}")
        kernel = opts.kernel or s.default_kernel
        if kernel not in s.kernels:
            raise KernelNotOffered(
                f"kernel {kernel!r} is not offered by this gateway; it offers {s.kernels} "
                "(GET /v1/kernels lists them; the gateway's setting `kernels` chooses them)"
            )
        image = opts.image or s.kernel_image(kernel)
        # a bundle (built by the operator, every kernel in it kernelgw's) runs Python as its own kernel
        bundles = {bundle_image(name) for name in BUNDLES if BUNDLES[name][0] == kernel}
        allowed = {s.kernel_image(kernel), *bundles} | (
            {s.image, *s.allowed_images} if kernel == DEFAULT_KERNEL else set()
        )
        if image not in allowed:
            raise LimitExceeded(f"image {image!r} is not allowed; allowed images: {sorted(allowed)}")
        return KernelSpec(
            session_id=session_id,
            image=image,
            memory_mb=memory,
            cpus=cpus,
            pids_limit=s.pids_limit,
            tmp_size_mb=s.tmp_size_mb,
            workspace_size_mb=s.workspace_size_mb,
            shm_size_mb=s.shm_size_mb,
            packages_size_mb=s.packages_size_mb,
            runtime=runtime,
            env=dict(opts.env),
            kernel=kernel,
        )

    def _session_config(self, opts: SessionOptions, quotas: KeyQuotas | None = None) -> SessionConfig:
        s = self.settings
        max_timeout = self._maximums(quotas)[2]
        return SessionConfig(
            exec_timeout_s=opts.timeout if opts.timeout is not None else min(s.exec_timeout_s, max_timeout),
            max_exec_timeout_s=max_timeout,
            interrupt_grace_s=s.interrupt_grace_s,
            kernel_start_timeout_s=s.kernel_start_timeout_s,
            max_output_bytes=s.max_output_bytes,
            replay_buffer=s.replay_buffer,
            subscriber_queue=s.subscriber_queue,
            subscriber_max_bytes=s.subscriber_max_bytes,
            replay_buffer_bytes=s.replay_buffer_bytes,
            state_poll_s=s.state_poll_s,
            max_image_bytes=s.max_image_bytes,
            max_message_bytes=s.max_message_bytes,
            auto_replay=opts.auto_replay,
        )

    async def _start_session(self, opts: SessionOptions, quotas: KeyQuotas | None = None) -> KernelSession:
        """A started kernel session (not yet registered): what pools hold."""
        session_id = str(uuid.uuid4())  # dashed: Jupyter clients route only kernel ids of this shape
        spec = self._spec(session_id, opts, quotas)
        session = KernelSession(
            session_id, spec, self.backend, self._session_config(opts, quotas), self.recorder, self.metrics
        )
        await session.start()
        return session

    async def _start_warm_session(self, opts: SessionOptions) -> KernelSession:
        """What pools hold: a started session whose kernel has run its first cell."""
        session = await self._start_session(opts)
        try:
            await session.warm_up()
        except BaseException:
            await session.close()
            raise
        return session

    def _terms(self, opts: SessionOptions) -> SessionTerms:
        """The new session's labels, lease end and access hash, checked (the lease
        itself starts once the session is up)."""
        if opts.lease_s is not None:
            check_lease_s(opts.lease_s, self.settings.max_lease_s)
        return SessionTerms(
            metadata=check_metadata(opts.metadata),
            on_lease_end=check_lease_end(opts.on_lease_end),
            access_sha256=check_access_sha256(opts.access_sha256),
        )

    async def create(self, opts: SessionOptions | None = None, principal: Principal = ANONYMOUS) -> KernelSession:
        opts = opts or SessionOptions()
        spec = self._spec("new", opts, principal.quotas)  # validate before anything starts
        terms = self._terms(opts)
        per_key = principal.quotas.max_sessions or self.settings.max_sessions_per_key
        elsewhere = 0
        if self.held_elsewhere is not None and principal.key_id is not None and per_key is not None:
            # awaited before the checks below: from them to the count of starting sessions nothing awaits
            elsewhere = await self.held_elsewhere(principal.key_id)
        if len(self._sessions) + sum(self._starting_by.values()) >= self.settings.max_sessions:
            raise SessionLimitReached(
                f"The gateway already runs its maximum of {self.settings.max_sessions} sessions. "
                "Delete a session you no longer need, or retry later."
            )
        if principal.key_id is not None and per_key is not None:
            held = sum(1 for s in self._sessions.values() if s.owner == principal.key_id)
            held += self._starting_by.get(principal.key_id, 0)
            held += elsewhere
            if held >= per_key:
                raise SessionLimitReached(
                    f"This API key already holds its maximum of {per_key} sessions. "
                    "Delete a session you no longer need, or retry later."
                )
        started = time.perf_counter()
        key = principal.key_id or ""
        self._starting_by[key] = self._starting_by.get(key, 0) + 1
        try:
            pool = self.pools.get(PoolProfile(spec.image, spec.memory_mb, spec.cpus, spec.runtime))
            if opts.env and not profile(spec.kernel).python:
                pool = None  # its environment is set at container start: only Python's can change later
            session = pool.take() if pool is not None else None
            if session is not None:
                source = "pool"
                try:
                    await session.adopt(self._session_config(opts, principal.quotas), self.recorder, dict(opts.env))
                except BaseException:
                    await session.close()
                    raise
            else:
                source = "cold"
                session = await self._start_session(opts, principal.quotas)
        finally:
            self._starting_by[key] -= 1
            if not self._starting_by[key]:
                del self._starting_by[key]
        session.owner = principal.key_id
        if opts.lease_s is not None:
            terms.lease_until = lease_until(opts.lease_s)  # from when the session is up
            self._leases_changed.set()
        session.terms = terms
        self._sessions[session.id] = session
        if self.metrics is not None:
            self.metrics.session_start.labels(source).observe(time.perf_counter() - started)
            self.metrics.sessions_active.set(len(self._sessions))
        await self._record("session_started", session)
        log.info("session %s created (%s)", session.id, source)
        return session

    def fork_options(self, source: KernelSession, opts: SessionOptions) -> SessionOptions:
        """A fork's options: what the request gave, else the source's. Of the
        source's terms only its metadata is copied: the fork's lease and access
        token are the request's own."""
        spec, config = source.spec, source.config
        if opts.kernel not in (None, spec.kernel):
            raise BadRequest(f"a fork runs its source's kernel ({spec.kernel}); leave out `kernel`, or give that one")
        return SessionOptions(
            memory_mb=opts.memory_mb if opts.memory_mb is not None else spec.memory_mb,
            cpus=opts.cpus if opts.cpus is not None else spec.cpus,
            timeout=opts.timeout if opts.timeout is not None else config.exec_timeout_s,
            image=opts.image if opts.image is not None else spec.image,
            env=dict(opts.env) if opts.env else dict(spec.env),
            runtime=opts.runtime if opts.runtime is not None else spec.runtime,
            auto_replay=opts.auto_replay or config.auto_replay,
            kernel=spec.kernel,
            metadata=dict(opts.metadata) if opts.metadata else source.metadata,
            lease_s=opts.lease_s,
            on_lease_end=opts.on_lease_end,
            access_sha256=opts.access_sha256,
        )

    async def fork(
        self,
        source: KernelSession,
        opts: SessionOptions,
        principal: Principal = ANONYMOUS,
        *,
        copy_state: bool = False,
    ) -> tuple[KernelSession, Fork]:
        """A new session from a live one: its workspace and packages copied, then
        the cells that built its kernel's state replayed (files first: the cells
        may read them). The source goes on meanwhile; what it does after the
        lineage and files were read is not part of the fork. A fork that fails
        or is abandoned is deleted, never left half made. A paused source is
        forked from its snapshot instead (files, packages and variables; no
        replay), and stays paused. A restart, pause or resume of the source under
        way ends first (its files are in or out of its kernel by then), and the
        replay of a restart too (the cells it has not run yet would be missing).

        ``copy_state`` (E2B's snapshots): a running Python source between cells
        has its variables pickled and its files copied, as a pause would keep
        them, instead of its cells replayed (what its cells did that no replay
        would do again, random draws, reads of what changed since, is kept);
        while a cell runs, or for a kernel whose variables cannot be pickled, it
        is the replay."""
        await source.rebuilt()
        if source.state == "paused":
            return await self._fork_paused(source, opts, principal)
        handle = source.handle
        if handle is None or source.state == "dead":
            raise KernelDied(f"Session {source.id} has no running kernel to fork; restart it first.")
        cells = source.lineage
        session = await self.create(self.fork_options(source, opts), principal)
        async with self._deleted_if_fork_fails(session):
            copied = await self._fill_by_copy(source, session) if copy_state else None
            return session, copied or await self._fill_by_replay(source, handle, cells, session)

    async def _fill_by_replay(
        self, source: KernelSession, handle: KernelHandle, cells: tuple[LineageCell, ...], session: KernelSession
    ) -> Fork:
        target = session.handle
        assert target is not None
        started = time.perf_counter()
        copied = await copy_session_files(
            self.backend, handle, target, self.settings.file_io_timeout_s, tree_caps(session.spec)
        )
        await session.keep_files()
        copy_ms = (time.perf_counter() - started) * 1000
        report = await session.replay(cells, "fork")
        return Fork(source.id, copied, copy_ms, report)

    async def _fill_by_copy(self, source: KernelSession, session: KernelSession) -> Fork | None:
        """``source``'s state copied into ``session`` (`KernelSession.copy_state_into`);
        None when it cannot be now (a cell runs, not Python)."""
        directory = self.snapshot_dir(session.id).with_name(f"{session.id}.copy")
        started = time.perf_counter()
        try:
            s = self.settings
            done = await source.copy_state_into(session, directory, s.snapshot_max_bytes, s.file_io_timeout_s)
        finally:
            await remove_snapshot(directory)
        if done is None:
            return None
        copied, namespace = done
        copy_ms = (time.perf_counter() - started) * 1000
        return Fork(source.id, copied, copy_ms, ReplayReport("fork", (), 0.0), namespace)

    async def _fork_paused(
        self, source: KernelSession, opts: SessionOptions, principal: Principal
    ) -> tuple[KernelSession, Fork]:
        session = await self.create(self.fork_options(source, opts), principal)
        async with self._deleted_if_fork_fails(session):
            started = time.perf_counter()
            done = await source.fork_snapshot_into(session, self.settings.file_io_timeout_s)
            if done is None:
                raise KernelDied(f"Session {source.id} stopped being paused while it was forked; fork it again.")
            copied, namespace = done
            copy_ms = (time.perf_counter() - started) * 1000
        return session, Fork(source.id, copied, copy_ms, ReplayReport("fork", (), 0.0), namespace)

    @contextlib.asynccontextmanager
    async def _deleted_if_fork_fails(self, session: KernelSession) -> AsyncIterator[None]:
        """A fork that fails (or is cancelled) half-way leaves no session behind."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(SessionNotFound, asyncio.CancelledError):
                await asyncio.shield(self.delete(session.id, reason="fork failed"))
            raise

    # ------------------------------------------------------------------ children
    async def create_child(
        self, parent: KernelSession, kernel: str, *, cwd: str = CHILD_CWD, name: str | None = None, label: str = ""
    ) -> KernelSession:
        """A child session of ``parent``: a ``kernel`` kernel started in its container
        (as its uid, in its cgroup, sharing its files), working in ``cwd``.

        ``name``: a name unique among the parent's children; a child of that name
        already held is returned instead of a new one (a face's per-language
        default context). ``label``: the face's word for it (E2B: the language
        as asked). The parent must run (a paused one is resumed by its face
        first); its image must hold the kernel (`image_kernels`)."""
        if parent.parent is not None:
            raise BadRequest("A context cannot hold contexts of its own.")
        if not cwd.startswith("/"):
            raise BadRequest(f"A context's working directory must be an absolute path, not {cwd!r}.")
        held = image_kernels(parent.spec.kernel, parent.spec.image)
        if kernel not in held:
            raise KernelNotInImage(
                f"This sandbox's image ({parent.spec.image}) holds the {' and '.join(held)} kernels, not {kernel}."
            )
        async with parent.children_lock:
            if self._sessions.get(parent.id) is not parent or parent.state == "closed":
                raise SessionNotFound(parent.id)
            if name is not None:
                for child in parent.children:
                    if child.child_name == name and child.state not in ("dead", "closed"):
                        return child
                    if child.child_name == name:  # a dead default makes room for a new one
                        await parent.end_child(child.id, f"its kernel died ({child.dead_reason}); replaced")
            if len(parent.children) >= MAX_CHILDREN:
                raise SessionLimitReached(
                    f"The sandbox already holds its maximum of {MAX_CHILDREN} contexts besides its own kernel; "
                    "remove one it no longer needs."
                )
            handle = parent.handle
            if parent.state in ("paused", "dead", "starting") or handle is None:
                raise KernelDied(
                    f"Session {parent.id} has no running kernel ({parent.state}) for a context to join; "
                    "resume or restart it first."
                )
            if cwd != CHILD_CWD and not await self._enterable(handle, cwd):
                raise BadRequest(
                    f"The working directory {cwd} does not exist in the sandbox, or its user cannot enter it; "
                    "make it first (files.make_dir), or leave cwd out for /home/user."
                )
            spec = dataclasses.replace(parent.spec, kernel=kernel, host=KernelHost(handle, parent.spec.kernel, cwd))
            config = dataclasses.replace(parent.config, auto_replay=False)
            recorder = ChildAudit(self.recorder, parent) if self.recorder is not None else None
            child = KernelSession(str(uuid.uuid4()), spec, self.backend, config, recorder, self.metrics)
            child.owner = parent.owner
            child.child_name, child.child_label = name, label
            parent.add_child(child)
            try:
                await child.start()
            except BaseException:
                await asyncio.shield(parent.end_child(child.id, "its kernel did not start"))
                raise
        log.info("session %s: context %s (%s) started", parent.id, child.id, kernel)
        return child

    async def _enterable(self, handle: KernelHandle, cwd: str) -> bool:
        """Whether the sandbox's user can enter ``cwd`` (a helper in its container)."""
        process = await self.backend.exec(handle, ["/bin/sh", "-c", 'cd -- "$1"', "sh", cwd], timeout=30)
        try:
            while await process.read():
                pass
            return await process.exit_code() == 0
        finally:
            await process.close()

    def get_child(self, parent: KernelSession, child_id: str) -> KernelSession:
        """``parent``'s child ``child_id``, or `ChildNotFound` saying why it ended when known."""
        child = parent.child(child_id)
        if child is not None:
            return child
        ended = parent.child_ended(child_id)
        raise ChildNotFound(
            f"Context {child_id} ended: {ended}" if ended else f"Context {child_id} not found in this sandbox"
        )

    async def delete_child(self, parent: KernelSession, child_id: str, reason: str = "removed") -> None:
        """End ``parent``'s child ``child_id`` (its kernel process; the parent's goes on)."""
        self.get_child(parent, child_id)
        await parent.end_child(child_id, reason)

    def get(self, session_id: str, principal: Principal = ANONYMOUS) -> KernelSession:
        """The session, if it exists and ``principal`` may see it: another key's
        session is "not found" too, so ids of others' sessions reveal nothing."""
        session = self._sessions.get(session_id)
        if session is None or not principal.can_see(session.owner):
            raise SessionNotFound(session_id)
        return session

    def list(self, principal: Principal = ANONYMOUS) -> list[KernelSession]:
        return [s for s in self._sessions.values() if principal.can_see(s.owner)]

    async def delete(self, session_id: str, reason: str = "deleted") -> None:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(session_id)
        # Close before forgetting it: when delete returns, the container is gone.
        await session.close()
        if self._sessions.pop(session_id, None) is None:
            return  # a concurrent delete finished first and recorded the end
        if self.metrics is not None:
            self.metrics.sessions_active.set(len(self._sessions))
        await self._record("session_ended", session, reason)
        log.info("session %s %s", session_id, reason)

    async def _record(self, what: str, session: KernelSession, *args: str) -> None:
        if self.recorder is None:
            return
        try:
            await getattr(self.recorder, what)(session, *args)
        except Exception:
            log.exception("recording %s for session %s failed", what, session.id)

    def __len__(self) -> int:
        return len(self._sessions)

    # ------------------------------------------------------------------ reaping
    async def reap_idle(self) -> builtins.list[str]:
        """End (or, with ``idle_action=pause``, pause) sessions idle longer than the
        timeout with nobody watching; one whose snapshot finds no room (413,
        507) is ended instead. Paused sessions end after ``paused_ttl_s``. A
        session under a lease is left to it: its lease says how long it lives."""
        await self.expire_paused()
        now = time.monotonic()
        idle = [
            s
            for s in self._sessions.values()
            if s.state != "paused"
            and s.lease_until is None
            and s.queue_length == 0
            and s.subscriber_count == 0
            and not any(c.queue_length or c.subscriber_count for c in s.children)
            and now - s.last_activity > self.settings.idle_timeout_s
        ]
        for session in idle:
            try:
                pausable = profile(session.spec.kernel).python  # others: their variables cannot be pickled
                if self.settings.idle_action == "pause" and session.state == "idle" and pausable:
                    try:
                        await self.pause(session)
                    except (SnapshotTooLarge, PausedBudgetExceeded) as exc:
                        # it would be tried again every round, in vain: end it as idle_action=end would
                        await self.delete(session.id, reason=f"reaped: idle, and it could not be paused: {exc.message}")
                else:
                    await self.delete(session.id, reason="reaped")
            except SessionNotFound:
                pass
            except KernelGWError as exc:  # say, busy again: the next round decides
                log.info("session %s was not paused: %s", session.id, exc.message)
        return [s.id for s in idle]

    async def expire_paused(self) -> builtins.list[str]:
        """End the sessions paused for longer than ``paused_ttl_s`` (0: never),
        with the reason recorded; their snapshots are deleted with them."""
        ttl = self.settings.paused_ttl_s
        if not ttl:
            return []
        now = datetime.now(UTC)
        expired = [
            s
            for s in self._sessions.values()
            if s.state == "paused" and s.paused_at is not None and (now - s.paused_at).total_seconds() > ttl
        ]
        for session in expired:
            try:
                await self.delete(
                    session.id,
                    reason=f"expired: paused for longer than paused_ttl_s ({ttl:g} s); its snapshot was deleted",
                )
            except SessionNotFound:
                pass
        return [s.id for s in expired]

    def snapshot_dir(self, session_id: str) -> Path:
        return Path(self.settings.data_dir) / "paused" / session_id

    async def pause(self, session: KernelSession, reason: str | None = None) -> Paused:
        """Free a session's container, keeping its state on disk (``KernelSession.pause``);
        its lease stops. ``reason``: why, for the audit log."""
        s = self.settings
        return await session.pause(
            self.snapshot_dir(session.id), s.snapshot_max_bytes, s.file_io_timeout_s, self.snapshots, reason
        )

    # ------------------------------------------------------------------ leases
    async def set_lease(self, session: KernelSession, seconds: float) -> None:
        """The session's lease runs out ``seconds`` from now (set or moved, sooner or
        later); returns once the store has it. A paused session has no lease
        (resume it first), nor has one whose lease ran out and is being ended.
        0 makes the lease run out now: the session ends (or pauses) as if its
        timeout had run out, after this returns."""
        seconds = check_lease_s(seconds, self.settings.max_lease_s, now=True)
        if self._sessions.get(session.id) is not session or session.state == "closed":
            raise SessionNotFound(session.id)
        if session.state == "paused":
            raise SessionBusy(
                "The session is paused, and no timeout (lease) runs while it is paused: "
                "resume it (connect to it), then set its timeout."
            )
        if session.id in self._lease_acting:
            raise SessionBusy(
                f"The session's timeout ran out and it is being {'paused' if session.on_lease_end == 'pause' else 'ended'}"
                "; it can no longer be extended."
            )
        session.terms.lease_until = lease_until(seconds)
        self._leases_changed.set()
        if self.recorder is not None:
            await self.recorder.lease_changed(session)

    async def _keep_leases(self) -> None:
        """End or pause each session whose lease ran out, as it runs out: the keeper
        sleeps until the nearest lease end, or until a lease is set (no polling);
        each end runs in a task of its own, so a slow pause delays no other."""
        while True:
            self._leases_changed.clear()
            try:
                wait = self._leases_due()
            except Exception:
                log.exception("checking leases failed")
                wait = self.settings.reap_interval_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._leases_changed.wait()

    def _leases_due(self) -> float | None:
        """Start ending the sessions whose lease ran out; the seconds until the next
        lease runs out (None: none runs)."""
        now = datetime.now(UTC)
        nearest: float | None = None
        for session in builtins.list(self._sessions.values()):
            left = session.terms.lease_left_s(now)
            if left is None or session.state in ("paused", "closed"):
                continue
            if left > 0:
                nearest = left if nearest is None else min(nearest, left)
            elif session.id not in self._lease_ends:
                task = asyncio.create_task(self._lease_ran_out(session), name=f"lease-end-{session.id}")
                self._lease_ends[session.id] = task
                task.add_done_callback(functools.partial(self._lease_ended, session.id))
        return nearest

    def _lease_ended(self, session_id: str, task: asyncio.Task[None]) -> None:
        self._lease_ends.pop(session_id, None)
        self._lease_acting.discard(session_id)
        self._leases_changed.set()  # one extended meanwhile may run out later

    async def _lease_ran_out(self, session: KernelSession) -> None:
        """Pause (``on_lease_end=pause``) or end a session whose lease ran out; a
        pause that fails (a cell running, not a Python kernel, no room) ends it,
        saying why. Both are audited with the reason."""
        left = session.terms.lease_left_s(datetime.now(UTC))
        if left is None or left > 0 or session.state in ("paused", "closed"):
            return  # extended, paused or ended meanwhile
        self._lease_acting.add(session.id)
        reason = LEASE_ENDED_REASON
        try:
            if session.on_lease_end == "pause":
                try:
                    await self._pause_for_lease(session)
                    log.info("session %s paused: %s", session.id, LEASE_PAUSED_REASON)
                    return
                except Exception as exc:
                    why = exc.message if isinstance(exc, KernelGWError) else str(exc) or type(exc).__name__
                    reason = f"{LEASE_ENDED_REASON}; it was to be paused, but could not be: {why}"
            await self.delete(session.id, reason=reason)
        except SessionNotFound:
            pass  # deleted meanwhile
        except Exception:
            log.exception("ending session %s, whose lease ran out, failed; retrying", session.id)
            # held in `_lease_ends` meanwhile: the keeper does not start it again at once
            await asyncio.sleep(LEASE_RETRY_S)

    async def _pause_for_lease(self, session: KernelSession) -> None:
        """Pause a session whose lease ran out. E2B pauses a sandbox whatever runs
        in it (its memory is frozen mid-cell); a kernelgw pause needs the kernel
        between cells, so the running cell is interrupted first (it ends
        ``interrupted``, its variables kept), for a cell queued behind it too, up
        to `LEASE_PAUSE_TRIES` times; then the pause's own refusal stands."""
        for attempt in range(LEASE_PAUSE_TRIES):
            try:
                await self.pause(session, reason=LEASE_PAUSED_REASON)
                return
            except SessionBusy:
                if attempt == LEASE_PAUSE_TRIES - 1 or session.state in ("paused", "closed"):
                    raise
                await session.interrupt_and_wait(self.settings.interrupt_grace_s)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            try:
                await self.reap_idle()
            except Exception:
                log.exception("idle reaping failed")
