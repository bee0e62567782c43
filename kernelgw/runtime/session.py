"""One kernel session: the façade the manager, pool, server and storage use.

A session is three parts with one job each: the kernel link
(`runtime.kernel_link`: container, ZMQ client, readers), the execution queue
(`runtime.execution_queue`: one cell at a time, timeouts, ``done``) and the
event fan-out (`runtime.fanout`: ``seq``, replay, subscribers). This module
wires them together and owns the session's lifecycle: start, restart and close
happen under one lock, so they never interleave. A restart may replay the
old kernel's cells into the new one (`kernelgw.runtime.lineage`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from kernelgw import events as ev
from kernelgw.errors import KernelGWError, KernelStartFailed, NotForThisKernel, SessionBusy
from kernelgw.events import ReplayTrigger
from kernelgw.kernels import profile
from kernelgw.runtime.backends.base import Backend, KernelHandle, KernelSpec
from kernelgw.runtime.execution import (
    ARTIFACTS_EXPRESSION,
    ARTIFACTS_KEY,
    END_KEY,
    ClientRequest,
    EndedCell,
    QueuedExecution,
    parse_artifacts,
)
from kernelgw.runtime.execution_queue import ExecutionQueue
from kernelgw.runtime.fanout import EventFanout, Published, Subscription
from kernelgw.runtime.kernel_link import KernelLink
from kernelgw.runtime.lease import SessionTerms, labels
from kernelgw.runtime.lineage import Lineage, LineageCell, ReplayJob, ReplayReport
from kernelgw.runtime.loop_share import LoopShare
from kernelgw.runtime.metrics import Metrics
from kernelgw.runtime.pause import (
    NamespaceSummary,
    SnapshotBudget,
    discard_namespace,
    load_namespace,
    refuse_if_nothing_saved,
    remove_snapshot,
    restore_files,
    save_files,
    save_namespace,
    snapshot_bytes,
)
from kernelgw.runtime.recorder import FollowedCell, Recorder, StoredSession
from kernelgw.runtime.session_config import SessionConfig
from kernelgw.runtime.session_state import SessionState, SessionStatus
from kernelgw.runtime.usage import KernelUsage, measure
from kernelgw.runtime.workspace import tree_caps

__all__ = [
    "KernelSession",
    "Published",
    "QueuedExecution",
    "SessionConfig",
    "SessionState",
    "Subscription",
    "parse_artifacts",
]

log = logging.getLogger(__name__)

WARM_UP_CODE = "get_ipython().display_formatter.format(1 + 1)"
"""Exercises the compiler and the formatters; assigns nothing."""

CUT_OFF_DONE_REASON = (
    "the gateway stopped while this cell ran; output it sent after the last stored event is lost "
    "(the kernel and its variables were kept)"
)
DETACHED_DONE_REASON = (
    "the gateway stopped while this cell ran; the kernel was kept and runs it on: the next gateway of "
    "this name follows it and records here its later output and how it ended (output sent while no "
    "gateway was connected is lost)"
)
DETACHED_QUEUED_REASON = "the gateway stopped before this cell ran; it did not run"
ENDED_CHILDREN_KEPT = 64
"""Ended children whose reason a session remembers (a later request for one is told why)."""
RECORD_TIMEOUT_S = 10.0
"""Longest a cell's ``done`` waits for its record to be committed; after it the
``done`` goes out marked as not stored rather than hanging the session."""


@dataclass(frozen=True)
class Paused:
    namespace: NamespaceSummary
    stored_bytes: int
    duration_ms: float


@dataclass(frozen=True)
class Resumed:
    namespace: NamespaceSummary
    restored_bytes: int
    duration_ms: float
    replay: ReplayReport | None


class KernelSession:
    def __init__(
        self,
        session_id: str,
        spec: KernelSpec,
        backend: Backend,
        config: SessionConfig,
        recorder: Recorder | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.id = session_id
        self.owner: str | None = None
        """The id of the API key the session belongs to (None without authentication)."""
        self.recorder = recorder
        self.metrics = metrics
        self.backend = backend
        self.created_at = datetime.now(UTC)
        self.last_activity = time.monotonic()
        self.last_activity_at = self.created_at
        self._status = SessionStatus()
        self._lifecycle = asyncio.Lock()
        self._link = KernelLink(session_id, spec, backend, config)
        if metrics is not None:
            self._link.on_paced = metrics.output_paced.inc
        self._fanout = EventFanout(config)
        self._fanout.on_reserve = self.kernel_changed
        self._executions = ExecutionQueue(session_id, self._link, self._fanout, self._status, config, self, metrics)
        self._config = config
        self._snapshot: Path | None = None
        """Where a paused session's state lies (see `pause`)."""
        self._paused_lineage: tuple[LineageCell, ...] = ()
        self._paused_from: KernelHandle | None = None
        self._paused_kernels: tuple[str, ...] = ()
        self.paused_at: datetime | None = None
        """When the session was paused (``paused_ttl_s`` counts from here)."""
        self._budget: SnapshotBudget | None = None
        self._snapshot_bytes = 0
        """What the snapshot holds of ``_budget``, given back when it is removed."""
        self._resuming: asyncio.Task[None] | None = None
        self._replay: ReplayJob | None = None
        """The replay a restart queued (its cells rebuild the new kernel's state after the lifecycle lock)."""
        self.lineage_kernels: tuple[str, ...] = ()
        """The kernels whose stored cells make the lineage: the running one, and
        those it was resumed from (a resume carries the state without re-running)."""
        self._files_kept = False
        """The backend was told to keep the files past the kernel (`keep_files`)."""
        self._following: FollowedCell | None = None
        """A cell a gateway left running in the kept kernel, until it is followed to its end."""
        self._terms = SessionTerms()
        """Labels, lease and access hash (`terms`)."""
        self.parent: KernelSession | None = None
        """A child session's parent: the session whose container its kernel runs in
        (an E2B context besides the sandbox's own kernel). Children are the
        manager's to make (`SessionManager.create_child`); none is stored."""
        self._children: dict[str, KernelSession] = {}
        self.children_lock = asyncio.Lock()
        """Held while a child is made (`SessionManager.create_child`): one at a time."""
        self.child_name: str | None = None
        """A child's name, unique among its parent's (a face's default context for a language)."""
        self.child_label = ""
        """A child's label, a face's word for it (E2B: the language it was asked for)."""
        self._ended_children: OrderedDict[str, str] = OrderedDict()
        """Why each of its latest ended children ended, by id."""
        self._link.on_stop = self._children_gone

    # ------------------------------------------------------------- attributes
    @property
    def config(self) -> SessionConfig:
        return self._config

    @config.setter
    def config(self, config: SessionConfig) -> None:
        self._config = self._link.config = self._fanout.config = self._executions.config = config

    @property
    def spec(self) -> KernelSpec:
        """What the kernel container is started from (again on a restart)."""
        return self._link.spec

    @spec.setter
    def spec(self, spec: KernelSpec) -> None:
        self._link.spec = spec

    @property
    def state(self) -> SessionState:
        return self._status.state

    @state.setter
    def state(self, state: SessionState) -> None:
        self._status.state = state

    @property
    def dead_reason(self) -> str | None:
        return self._status.dead_reason

    @dead_reason.setter
    def dead_reason(self, reason: str | None) -> None:
        self._status.dead_reason = reason

    @property
    def execution_count(self) -> int:
        return self._status.execution_count

    @execution_count.setter
    def execution_count(self, count: int) -> None:
        self._status.execution_count = count

    @property
    def kernel_info(self) -> dict[str, Any]:
        """The kernel's kernel_info reply (language, versions)."""
        return self._link.kernel_info

    @property
    def output_share(self) -> LoopShare | None:
        """The event loop's share its kernel's output may take (None: not read now)."""
        return self._link.output_share

    @property
    def paused_from(self) -> KernelHandle | None:
        """While paused: the kernel it was paused from (its lineage is stored under it)."""
        return self._paused_from

    @property
    def following(self) -> FollowedCell | None:
        """A cell left running in the kernel by a gateway that stopped keeping it,
        stored for the next gateway, until one followed it to its end."""
        return self._following

    @property
    def handle(self) -> KernelHandle | None:
        """The running kernel's container, or None while (re)starting or closed."""
        return self._link.handle

    # ------------------------------------------------------------- terms
    @property
    def terms(self) -> SessionTerms:
        """Its labels, lease and access hash (`kernelgw.runtime.lease`): the manager's
        to set (at creation, restore, `SessionManager.set_lease`); faces read the
        properties below."""
        return self._terms

    @terms.setter
    def terms(self, terms: SessionTerms) -> None:
        self._terms = terms

    @property
    def metadata(self) -> dict[str, str]:
        """Free labels kept with the session (a copy: change them through the manager)."""
        return dict(self._terms.metadata)

    @property
    def lease_until(self) -> datetime | None:
        """When its lease runs out (UTC); None: no lease runs (none set, or paused)."""
        return self._terms.lease_until

    @property
    def on_lease_end(self) -> str:
        """``end`` or ``pause``: what the manager does when the lease runs out."""
        return self._terms.on_lease_end

    @property
    def access_sha256(self) -> str | None:
        """The sha256 of its access token (None: it has none); for the store only."""
        return self._terms.access_sha256

    def check_access(self, token: str) -> bool:
        """Whether ``token`` is the access token the session was created with
        (constant-time; False when it has none)."""
        return self._terms.check_access(token)

    # ------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        async with self._lifecycle:
            try:
                await self._start_kernel()
            except BaseException:
                if not self.spec.child:  # a child's files are its parent's
                    await asyncio.shield(self.backend.end_session(self.id))
                raise
        self._executions.start()

    async def _start_kernel(self) -> None:
        self.state = "starting"
        await self._link.start()
        self.state = "idle"
        self.dead_reason = None
        handle = self._link.handle
        self._executions.lineage.new_kernel(handle.kernel_id if handle is not None else None)
        self.lineage_kernels = (handle.kernel_id,) if handle is not None else ()

    async def warm_up(self, timeout: float = 10.0) -> None:
        """Run a kernel's first-use work before anyone waits on it: IPython's first
        cell costs about 30 ms (compiler, display formatters, user expressions)
        against under 1 ms later (measured in-process, ipykernel 7.4). Silent, with
        a real cell's user expressions: no execution count, history, output,
        pre/post-run hooks or names in the user's namespace. Other languages' kernels
        get an empty cell: the shim in front of them answers the expressions."""
        code = WARM_UP_CODE if profile(self.spec.kernel).python else ""
        await self._link.silent_request(
            code, {ARTIFACTS_KEY: ARTIFACTS_EXPRESSION, END_KEY: "'warm-up'"}, timeout=timeout
        )

    async def restart(
        self, reason: str = "the session was restarted", *, replay: bool = False, timeout: float = 300.0
    ) -> ReplayReport | None:
        """A fresh kernel in place of the old one; all variables are lost.

        ``replay``: then the old kernel's lineage runs again in the new one,
        ahead of any cell queued, and this returns the replay's report once it
        ended (None without replay, or when the session was closed). A paused
        session keeps its files and packages (`_restart_paused`; ``timeout``
        bounds their copy)."""
        async with self._lifecycle:
            if self.state == "closed":
                return None
            if self.state == "paused":
                job = await self._restart_paused(reason, replay, timeout)
            else:
                job = await self._restart_running(reason, replay)
            self._replay = job
        return await job.report if job is not None else None

    async def _restart_running(self, reason: str, replay: bool) -> ReplayJob | None:
        """`restart` of a session that has a kernel (or had one: dead), under the
        lifecycle lock; returns the replay queued, if any."""
        if replay:
            self._executions.hold()  # cells sent from now on run after the replay
        try:
            self._executions.abort_current(reason)
            await self.keep_files()
            await self.end_children("the sandbox's main kernel was restarted, and its contexts with it")
            await self._link.stop()
            self.kernel_event("kernel_restarted", reason)
            if self.metrics is not None:
                self.metrics.restarts.labels("requested").inc()
            cells = self._executions.lineage.cells
            try:
                await self._start_kernel()
            except BaseException as exc:
                self.state = "dead"
                self.dead_reason = f"restart failed: {exc}"
                raise
            self.execution_count = 0
            self.kernel_changed()
            return self._executions.replay(cells, "requested") if replay else None
        finally:
            if replay:
                self._executions.release()

    async def _restart_paused(self, reason: str, replay: bool, timeout: float) -> ReplayJob | None:
        """`restart` of a paused session, under the lifecycle lock: a new kernel
        with the snapshot's files and packages but not its variables (a restart
        means fresh variables, not lost files); with ``replay`` the cells that
        built the paused state run in it (after the files: they may read them),
        before any cell sent meanwhile. Once the files are in, the snapshot is
        removed and its bytes given back (the session is no longer paused, for the
        store too). A restart that fails leaves the session paused, its snapshot
        untouched, as a resume that fails does."""
        directory = self._snapshot
        assert directory is not None
        cells = self._paused_lineage
        self._executions.hold()  # cells sent while paused run in the new kernel, after the replay
        try:
            try:
                await self._start_kernel()
                handle = self._link.handle
                assert handle is not None
                restored = await restore_files(self.backend, handle, directory, timeout)
                await discard_namespace(self._link)  # the pickled variables came with the workspace
                await self.keep_files()
            except BaseException as exc:
                await self._link.stop()
                await self.backend.end_session(self.id)
                self.state = "paused"
                self.lineage_kernels = self._paused_kernels  # not the kernel that failed
                if isinstance(exc, Exception) and not isinstance(exc, KernelGWError):
                    raise KernelStartFailed(f"The paused session could not be restarted: {exc}") from exc
                raise
            self.kernel_event("kernel_restarted", f"{reason}; it was paused: {restored} bytes of files restored")
            if self.metrics is not None:
                self.metrics.restarts.labels("requested").inc()
            self.execution_count = 0
            self._paused_from, self._paused_lineage = None, ()
            self.kernel_changed()
            await self._drop_snapshot()
            return self._executions.replay(cells, "requested") if replay else None
        finally:
            self._executions.release()

    @property
    def lineage(self) -> tuple[LineageCell, ...]:
        """The cells that built the running kernel's state, oldest first."""
        return self._executions.lineage.cells

    async def replay(self, cells: tuple[LineageCell, ...], trigger: ReplayTrigger) -> ReplayReport:
        """Run ``cells`` in this kernel before any queued cell (a fork rebuilds its
        source's state this way); returns once they ran, or the first did not end ok."""
        return await self._executions.replay(cells, trigger).report

    async def keep_files(self) -> None:
        """Have the backend keep the workspace and packages past this kernel, from
        the session's first file on (an upload, an install, a cell that wrote one)
        and before any restart. Once per session; a failure is logged, and the
        next call tries again."""
        if self._files_kept or self.state == "closed":
            return  # closed: its store was removed, and must not come back
        try:
            await self.backend.keep_workspace(self.spec)
        except Exception as exc:
            log.warning("session %s: its files may not outlive its kernel: %s", self.id, exc)
            return
        self._files_kept = True

    # ------------------------------------------------------------- pause
    async def pause(
        self,
        directory: Path,
        max_bytes: int,
        timeout: float,
        budget: SnapshotBudget | None = None,
        reason: str | None = None,
    ) -> Paused:
        """Save the namespace, the workspace and the packages into ``directory`` and
        remove the container (memory and CPU freed). Only between cells: a cell
        running or queued is a 409. Cells sent meanwhile wait and resume it. The
        snapshot is capped by the session's tmpfs sizes and takes its bytes from
        ``budget``; a pause that fails for either (413, 507) or anything else
        leaves the session running as it was. A lease stops while paused
        (cleared). ``reason``: why it was paused, for the audit log."""
        if not profile(self.spec.kernel).python:
            raise NotForThisKernel(
                f"Only Python sessions can be paused (their variables are pickled); this one runs {self.spec.kernel}. "
                "Its files outlive restarts; restart with replay rebuilds its state."
            )
        async with self._lifecycle:
            if self.state == "paused":
                raise SessionBusy("The session is already paused.")
            handle = self._link.handle
            if self.state != "idle" or handle is None or self._executions.current is not None or self.queue_length:
                raise SessionBusy(f"Only an idle session can be paused (it is {self.state}); try again after its cell.")
            if budget is not None:
                budget.check()  # a full budget is refused before any work
            self._executions.hold()
            try:
                started = time.perf_counter()
                try:
                    namespace = await save_namespace(self._link, max_bytes, timeout)
                    refuse_if_nothing_saved(namespace)
                    stored = await save_files(self.backend, handle, directory, timeout, tree_caps(self.spec), budget)
                except BaseException:
                    # the session goes on as it was
                    await remove_snapshot(directory)
                    with contextlib.suppress(Exception):
                        await discard_namespace(self._link)
                    raise
                self._paused_lineage = self.lineage
                self._paused_kernels = self.lineage_kernels
                self._paused_from = handle
                await self.end_children("the sandbox was paused: contexts besides its default are not kept by a pause")
                await self._link.stop()
                await self.backend.end_session(self.id)
                self._files_kept = False
                self.state = "paused"
                self._terms.lease_until = None  # no lease runs while paused
                self.kernel_changed()  # a restarted gateway brings it back paused
                saved = f"{stored} bytes saved"
                self.kernel_event("session_paused", f"{reason}; {saved}" if reason else saved)
            finally:
                self._executions.release()
            self._snapshot = directory
            self._budget, self._snapshot_bytes = budget, stored
            self.paused_at = datetime.now(UTC)
            # cells sent while it was pausing were held, not run: they resume it
            # (once the lock is free), as a cell sent to the paused session does
            self._resume_if_queued()
            return Paused(namespace, stored, (time.perf_counter() - started) * 1000)

    async def resume(self, *, replay: bool = False, timeout: float = 300.0) -> Resumed | None:
        """A new kernel with what ``pause`` saved: files and packages, then the
        namespace. ``replay``: the cells that built the state run first, so what
        could not be pickled comes back too; the saved values are loaded over
        what they rebuilt. None when the session was not paused."""
        async with self._lifecycle:
            directory = self._snapshot
            if self.state != "paused" or directory is None:
                return None
            started = time.perf_counter()
            cells = self._paused_lineage
            self._executions.hold()  # cells sent meanwhile run in the restored state
            try:
                try:
                    await self._start_kernel()
                    handle = self._link.handle
                    assert handle is not None
                    restored = await restore_files(self.backend, handle, directory, timeout)
                    await self.keep_files()
                    job = self._executions.replay(cells, "resume") if replay and cells else None
                    report = await job.report if job is not None else None
                    namespace = await load_namespace(self._link, timeout)
                except BaseException as exc:
                    # the snapshot stays on disk: no half-restored kernel, still paused
                    await self._link.stop()
                    await self.backend.end_session(self.id)
                    self.state = "paused"
                    self.lineage_kernels = self._paused_kernels  # not the kernel that failed
                    if isinstance(exc, Exception) and not isinstance(exc, KernelGWError):
                        raise KernelStartFailed(f"The session could not be resumed: {exc}") from exc
                    raise
            finally:
                self._executions.release()
            self._executions.lineage = Lineage(handle.kernel_id, cells)
            self.lineage_kernels = (*self._paused_kernels, handle.kernel_id)
            self.execution_count = 0
            self._paused_from = None
            self.kernel_changed()
            self.kernel_event("session_resumed", f"{restored} bytes restored")
            self._paused_lineage = ()
            await self._drop_snapshot()
        return Resumed(namespace, restored, (time.perf_counter() - started) * 1000, report)

    async def _drop_snapshot(self) -> None:
        """Remove the snapshot (under the lifecycle lock) and give back its bytes."""
        directory, self._snapshot = self._snapshot, None
        if directory is None:
            return
        await remove_snapshot(directory)
        if self._budget is not None:
            self._budget.give_back(self._snapshot_bytes)
        self._budget, self._snapshot_bytes, self.paused_at = None, 0, None

    async def settled(self) -> None:
        """Return once no start, restart, pause or resume of the session is under
        way: a restart or resume gives its kernel (`handle`) and an idle state
        before its files are back in it, so one that reads them (a fork) waits."""
        async with self._lifecycle:
            pass

    async def usage(self) -> KernelUsage | None:
        """What its kernel uses of its limits now (`kernelgw.runtime.usage`, about a
        quarter of a second to read); None while no kernel runs (paused, starting)."""
        handle = self._link.handle
        if self.state in ("paused", "closed") or handle is None:
            return None
        return await measure(self.backend, handle, self.spec)

    async def files_handle(self) -> KernelHandle | None:
        """The kernel to read or write the session's files in, once they are in
        it: a paused session is resumed first, and a (re)start or resume under way
        is waited for (its new kernel is the session's before the snapshot's
        files are back, and an upload then would be overwritten, a download not
        found). None when no kernel runs (dead, closed)."""
        if self.state == "paused":
            await self.resume()
        await self.settled()
        return self._link.handle

    async def rebuilt(self) -> None:
        """Return once the kernel's state is whole: no start, pause or resume under
        way (`settled`), and the replay a restart queued has run (a fork copies
        the lineage, which a replay still running holds only in part)."""
        await self.settled()
        job = self._replay
        if job is not None and not job.report.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(job.report)

    async def fork_snapshot_into(self, target: KernelSession, timeout: float) -> tuple[int, NamespaceSummary] | None:
        """While paused: put the snapshot (files, packages, then variables) into
        ``target``'s new kernel, a fork without replay; returns the bytes copied
        and what the kernel restored, or None when the session is not paused (a
        resume or delete came first). This session stays paused, its snapshot kept."""
        async with self._lifecycle:
            directory = self._snapshot
            handle = target.handle
            if self.state != "paused" or directory is None or handle is None:
                return None
            copied = await restore_files(target.backend, handle, directory, timeout)
            await target.keep_files()
            return copied, await load_namespace(target._link, timeout)

    async def copy_state_into(
        self, target: KernelSession, directory: Path, max_bytes: int, timeout: float
    ) -> tuple[int, NamespaceSummary] | None:
        """A fork without replay from this running session: its variables pickled
        (as a pause does), its files and packages copied through ``directory`` (the
        caller removes it), then all of it put into ``target``'s new kernel, as
        `fork_snapshot_into` does from a paused session. Cells are held for the
        copy only; this session runs on. None when there is nothing to copy that
        way: not a Python kernel, or not idle (a cell runs or waits), or no kernel."""
        if not profile(self.spec.kernel).python or target.handle is None:
            return None
        async with self._lifecycle:
            handle = self._link.handle
            if self.state != "idle" or handle is None or self._executions.current is not None or self.queue_length:
                return None
            self._executions.hold()
            try:
                try:
                    await save_namespace(self._link, max_bytes, timeout)
                    await save_files(self.backend, handle, directory, timeout, tree_caps(self.spec))
                finally:
                    with contextlib.suppress(Exception):
                        await discard_namespace(self._link)  # the pickle is the copy's, not this workspace's
            finally:
                self._executions.release()
        copied = await restore_files(target.backend, target.handle, directory, timeout)
        await target.keep_files()
        return copied, await load_namespace(target._link, timeout)

    async def restart_after_death(self) -> str | None:
        """Replace a kernel that died under a cell, to replay into it
        (``auto_replay``; the queue's worker calls this); returns why it failed, if it did."""
        async with self._lifecycle:
            if self.state == "closed":
                return "the session was deleted"
            await self.end_children("the sandbox's main kernel died, and its contexts with it")
            await self._link.stop()
            self.kernel_event("kernel_restarted", "auto_replay: the kernel died")
            if self.metrics is not None:
                self.metrics.restarts.labels("died").inc()
            try:
                await self._start_kernel()
            except Exception as exc:
                self.state = "dead"
                self.dead_reason = f"restarting the kernel after it died failed: {exc}"
                return str(exc)
            self.execution_count = 0
            self.kernel_changed()
            return None

    async def restart_after_timeout(self) -> str | None:
        """Replace a kernel that ignored an interrupt (the queue's worker calls
        this); returns why it failed, if it did."""
        async with self._lifecycle:
            if self.state == "closed":
                return None
            await self.keep_files()
            await self.end_children("the sandbox's main kernel was restarted after a timeout, and its contexts with it")
            await self._link.stop()
            self.kernel_event("kernel_restarted", "the kernel ignored an interrupt after a timeout")
            if self.metrics is not None:
                self.metrics.restarts.labels("timeout").inc()
            try:
                await self._start_kernel()
            except Exception as exc:
                self.state = "dead"
                self.dead_reason = f"restarting the kernel after a timeout failed: {exc}"
                return str(exc)
            self.execution_count = 0
            self.kernel_changed()
            return None

    async def reattach(self, stored: StoredSession, timeout: float) -> None:
        """Take over a kernel a previous gateway process left running: connect to
        its handle (already sealed), check it answers within ``timeout`` seconds,
        and carry on from the stored execution count and event stream.

        The replay buffer is refilled from the stored cells, and numbering goes
        on after the stored reservation: a client resuming from its last
        ``seq`` gets what it missed, and a ``gap`` for what a crash lost. A cell
        the previous process was running when it died gets its ``done`` here."""
        async with self._lifecycle:
            self.state = "starting"
            await self._link.reattach(stored.handle, timeout)
            self.state = "idle"
            self.execution_count = stored.execution_count
            self._status.count_unknown = True
            self._executions.lineage = Lineage(stored.handle.kernel_id, stored.lineage)
            self.lineage_kernels = stored.lineage_kernels or (stored.handle.kernel_id,)
            self._seed(stored)
            if (cell := stored.following) is not None:
                # the cell the previous gateway left running: followed to its end first
                self._following = cell
                interim = ev.Done(
                    execution_id=cell.execution_id,
                    status="dead",
                    reason=DETACHED_DONE_REASON,
                    duration_ms=0.0,
                    state_lost=False,
                )
                self._executions.follow(cell, interim)
        self._executions.start()

    async def restore_paused(
        self, stored: StoredSession, directory: Path, budget: SnapshotBudget | None = None
    ) -> None:
        """Take over a session a previous gateway process left paused: no kernel
        until it is resumed, its snapshot in ``directory`` (counted in ``budget``,
        paused since the snapshot was written), its events replayable."""
        size, mtime = await asyncio.to_thread(lambda: (snapshot_bytes(directory), directory.stat().st_mtime))
        async with self._lifecycle:
            self.state = "paused"
            self._snapshot = directory
            self._budget, self._snapshot_bytes = budget, size
            if budget is not None:
                budget.hold(size)
            self.paused_at = datetime.fromtimestamp(mtime, UTC)
            self._paused_from = stored.handle
            self._paused_lineage = tuple(stored.lineage)
            self._paused_kernels = stored.lineage_kernels or (stored.handle.kernel_id,)
            self.execution_count = stored.execution_count
            self._seed(stored)
        self._executions.start()

    def _seed(self, stored: StoredSession) -> None:
        """The replay buffer refilled from the stored cells; numbering goes on
        after the stored reservation; cells a crash cut off get their ``done``."""
        self._fanout.seed(
            (
                (event.seq, event.model_dump_json())
                for cell in stored.cells
                for event in cell.events
                if event.seq is not None
            ),
            stored.last_seq,
        )
        for cell in stored.cells:
            if cell.cut_off:
                self._fanout.publish(
                    ev.Done(
                        execution_id=cell.execution_id,
                        status="dead",
                        reason=CUT_OFF_DONE_REASON,
                        duration_ms=0.0,
                        state_lost=False,
                    )
                )

    async def detach(self) -> None:
        """Leave the kernel running for the next gateway process (on_shutdown=keep):
        stop reading, disconnect, end subscriptions; the container stays."""
        async with self._lifecycle:
            if self.state == "closed":
                return
            self.state = "closed"
            running = self._executions.current
            unrecorded = await self._executions.stop(
                reason=DETACHED_DONE_REASON, queued_reason=DETACHED_QUEUED_REASON, detaching=True
            )
            await self.end_children(
                "the gateway stopped: contexts do not outlive the gateway process that started them"
            )
            await self._link.stop(keep_container=True)
            # what the running cell sent until the link stopped is in its record;
            # the next gateway follows it from there
            await self._executions.close_late(RECORD_TIMEOUT_S)
            self._following = self._executions.followed_by_next(running)
            # the counters as they are now, for the next gateway: its numbering
            # goes on right after the last event sent (no gap after a clean stop)
            self._fanout.reserved = self._fanout.seq
            self.kernel_changed()
            self._link.handle = None
            self._fanout.close_all()
        for rec in unrecorded:
            await self.record_execution(rec)

    async def close(self) -> None:
        async with self._lifecycle:
            if self.state == "closed":
                return
            self.state = "closed"
            unrecorded = await self._executions.stop()
            await self.end_children("the sandbox ended")
            await self._link.stop()
            if not self.spec.child:  # a child's files are its parent's
                await self.backend.end_session(self.id)
            await self._drop_snapshot()
            self._fanout.close_all()
        # History keeps every execution, including those the deletion ended.
        for rec in unrecorded:
            await self.record_execution(rec)

    async def adopt(self, config: SessionConfig, recorder: Recorder | None, env: dict[str, str]) -> None:
        """Take over a warm kernel from the pool as a new session.

        Per-session environment variables reach the kernel's ``os.environ`` with a
        silent request (no restart; nothing is bound in the user namespace)."""
        self.config = config
        self.recorder = recorder
        self.created_at = datetime.now(UTC)
        self.touch()
        if env:
            if not profile(self.spec.kernel).python:  # the manager starts these cold instead
                raise KernelStartFailed("Only Python kernels take environment variables after they started.")
            reply = await self._link.silent_request(f"__import__('os').environ.update({json.dumps(env)})")
            if not reply or reply.get("status") != "ok":
                raise KernelStartFailed("Could not set the session's environment variables in the kernel.")
            self.spec = dataclasses.replace(self.spec, env=dict(env))

    # ------------------------------------------------------------- recording
    def kernel_event(self, kind: str, detail: str) -> None:
        """Tell the recorder (the audit log) that the kernel died or was restarted."""
        hook = getattr(self.recorder, "session_event", None)
        if hook is None:
            return
        try:
            hook(self, kind, detail)
        except Exception:
            log.exception("recording %s for session %s failed", kind, self.id)

    def kernel_changed(self) -> None:
        """Tell the recorder what reaching the kernel again needs (a new container
        after a restart; the counters before a shutdown that keeps the kernel)."""
        if self.recorder is None:
            return
        try:
            self.recorder.kernel_changed(self)
        except Exception:
            log.exception("recording the kernel of session %s failed", self.id)

    def execution_started(self, rec: QueuedExecution) -> None:
        """Tell the recorder a cell started (a ``running`` row; queued, never awaited)."""
        if self.recorder is None:
            return
        try:
            self.recorder.execution_started(self, rec)
        except Exception:
            log.exception("recording the start of execution %s failed", rec.execution_id)

    def execution_progress(self, rec: QueuedExecution) -> None:
        """Tell the recorder a running cell's output so far (queued, never awaited)."""
        if self.recorder is None:
            return
        try:
            self.recorder.execution_progress(self, rec)
        except Exception:
            log.exception("recording the output so far of execution %s failed", rec.execution_id)

    async def record_execution(self, rec: QueuedExecution, done: Published | None = None) -> bool:
        """Store an ended execution, once, and wait for the commit.

        ``done`` is its end before it is published (the queue publishes it after
        this returns); without it the execution's ``done`` was already published.
        Returns False when the recorder failed or took longer than
        `RECORD_TIMEOUT_S` (logged): the caller must not claim it is stored."""
        if self.recorder is None or rec.recorded:
            return True
        if done is None and not rec.done.done():
            return True
        rec.recorded = True
        try:
            async with asyncio.timeout(RECORD_TIMEOUT_S):
                await self.recorder.execution_finished(self, rec, done)
        except TimeoutError:
            log.error(
                "recording execution %s took over %gs; answered as not stored", rec.execution_id, RECORD_TIMEOUT_S
            )
            return False
        except Exception:
            log.exception("recording execution %s failed", rec.execution_id)
            return False
        return True

    async def record_late(self, cell: EndedCell, events: Sequence[Published]) -> bool:
        """Append output that came after a cell's end to its record and wait for the
        commit (`kernelgw.runtime.late_output`); False when not stored (logged)."""
        if self.recorder is None:
            return True
        part, cell.late_parts = cell.late_parts, cell.late_parts + 1
        # a followed cell's error is how it ended (its real end sets the status), not a forgery
        error = cell.late_error and not cell.followed
        try:
            async with asyncio.timeout(RECORD_TIMEOUT_S):
                await self.recorder.execution_late(self, cell.execution_id, events, part, error)
        except Exception:
            log.exception("recording the late output of execution %s failed", cell.execution_id)
            return False
        return True

    async def followed_ended(self, rec: QueuedExecution, done: ev.Done) -> None:
        """A followed cell ended (`ExecutionQueue.follow`): its real end replaces its
        interim record (only that one: a record completed already is left), and
        the store no longer names it for the next gateway to follow."""
        hook = getattr(self.recorder, "execution_followed", None)
        try:
            if hook is not None:
                async with asyncio.timeout(RECORD_TIMEOUT_S):
                    await hook(self, rec.execution_id, done, DETACHED_DONE_REASON)
        except Exception:
            log.exception("recording the end of followed execution %s failed", rec.execution_id)
        finally:
            # after the record: a gateway killed in between follows it again and
            # finds it completed (the store completes an interim record only)
            self._following = None
            self.kernel_changed()

    # ------------------------------------------------------------- executing
    @property
    def queue_length(self) -> int:
        return self._executions.length

    def submit(
        self,
        code: str,
        execution_id: str | None = None,
        timeout: float | None = None,
        client: ClientRequest | None = None,
        *,
        replayable: bool = True,
    ) -> QueuedExecution:
        """Queue a cell; returns at once. Await ``execution.done`` for the end.

        ``client``: a Jupyter client's request (the channels WebSocket). Both
        faces share one queue, so a cell's timeout starts when the kernel gets
        it, and every cell is in the history, the event stream and the notebook.
        ``replayable=False``: a replay never runs it again (side effects)."""
        rec = self._executions.submit(code, execution_id, timeout, client, replayable=replayable)
        self.touch()
        self._resume_if_queued()
        return rec

    def _resume_if_queued(self) -> None:
        """The queue takes no cell while paused: a paused session with cells queued
        is resumed for them (once)."""
        if self.state == "paused" and self.queue_length and (self._resuming is None or self._resuming.done()):
            self._resuming = asyncio.create_task(self._resume_for_queued(), name=f"resume-{self.id}")

    async def _resume_for_queued(self) -> None:
        try:
            await self.resume()
        except Exception as exc:
            log.warning("session %s could not be resumed for its queued cells: %s", self.id, exc)
            await self._executions.fail_queued(f"the session is paused and could not be resumed: {exc}")

    def send_message(self, channel: Literal["shell", "stdin"], msg: dict[str, Any]) -> bool:
        """A Jupyter client's message on the session's own socket: an ``input_reply``
        for the running cell's ``input_request``, or a reply-less shell message in
        order with the cells (`KernelLink.send_message`)."""
        return self._link.send_message(channel, msg)

    @property
    def current_execution(self) -> QueuedExecution | None:
        return self._executions.current

    async def interrupt(self) -> bool:
        """SIGINT to the kernel if a cell is running; True if one was."""
        return await self._executions.interrupt()

    async def interrupt_and_wait(self, timeout: float) -> None:
        """Interrupt the running cell, if any, and wait (at most ``timeout``) for its
        end to be out: what a pause that must happen now (a lease's) does first."""
        running = self._executions.current
        if running is None or not await self.interrupt():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await asyncio.shield(running.done)
                await self._executions.between_cells()

    # ------------------------------------------------------------- pub/sub
    def subscribe(self, last_seq: int | None = None) -> Subscription:
        """A live subscription; with ``last_seq``, first the events after it."""
        sub = self._fanout.subscribe(last_seq, closed=self.state == "closed")
        self.touch()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._fanout.unsubscribe(sub)
        self.touch()

    def events_since(self, seq: int) -> list[tuple[int, str]]:
        """(seq, JSON) of the events after ``seq`` the replay buffer still holds."""
        return [(n, text) for n, text in self._fanout.replay if n > seq]

    @property
    def subscriber_count(self) -> int:
        return self._fanout.subscriber_count

    @property
    def last_seq(self) -> int:
        return self._fanout.seq

    @property
    def resume_seq(self) -> int:
        """Where a successor gateway's numbering must continue (see `SEQ_BLOCK`)."""
        return max(self._fanout.reserved, self._fanout.seq)

    def touch(self) -> None:
        self.last_activity = time.monotonic()
        self.last_activity_at = datetime.now(UTC)
        if self.parent is not None:  # a context's work keeps its sandbox from being idle
            self.parent.touch()

    # ------------------------------------------------------------- children
    @property
    def children(self) -> tuple[KernelSession, ...]:
        """Its child sessions (E2B contexts), oldest first."""
        return tuple(self._children.values())

    def child(self, child_id: str) -> KernelSession | None:
        return self._children.get(child_id)

    def child_ended(self, child_id: str) -> str | None:
        """Why the child ``child_id`` ended, while remembered (None: not known to have been one)."""
        return self._ended_children.get(child_id)

    def add_child(self, child: KernelSession) -> None:
        """Hold ``child`` (before its kernel starts: a stop of this kernel meanwhile ends it too)."""
        child.parent = self
        self._children[child.id] = child

    async def end_child(self, child_id: str, reason: str) -> bool:
        """Close the child ``child_id`` (its kernel process only); False when it is none of ours."""
        child = self._children.pop(child_id, None)
        if child is None:
            return False
        self._remember_ended(child_id, reason)
        await child.close()
        return True

    async def end_children(self, reason: str) -> None:
        """Close every child: its kernel runs in this kernel's container, which is
        going (restarted, paused, ended) or which the gateway leaves."""
        if not self._children:
            return
        children, self._children = list(self._children.values()), {}
        for child in children:
            self._remember_ended(child.id, reason)
        results = await asyncio.gather(*(child.close() for child in children), return_exceptions=True)
        for child, result in zip(children, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("session %s: closing its context %s failed: %s", self.id, child.id, result)

    def _remember_ended(self, child_id: str, reason: str) -> None:
        self._ended_children[child_id] = reason
        while len(self._ended_children) > ENDED_CHILDREN_KEPT:
            self._ended_children.popitem(last=False)

    async def _children_gone(self) -> None:
        """The link stops the kernel: children still held (a path that did not end
        them first) end with it."""
        await self.end_children("the sandbox's main kernel stopped, and its contexts with it")

    # ------------------------------------------------------------- info
    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "kernel": self.spec.kernel,
            "image": self.spec.image,
            "runtime": self.spec.runtime,
            "memory_mb": self.spec.memory_mb,
            "cpus": self.spec.cpus,
            "created_at": self.created_at,
            "last_activity": self.last_activity_at,
            "execution_count": self.execution_count,
            "queue_length": self.queue_length,
            "subscribers": self.subscriber_count,
            "last_seq": self.last_seq,
            "dead_reason": self.dead_reason,
            "owner": self.owner,
            "auto_replay": self.config.auto_replay,
            "metadata": labels(self.metadata),
            "lease_until": self.lease_until,
        }
