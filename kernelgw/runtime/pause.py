"""Pause and resume: a session's state moved out of its container and back.

A paused session has no container: its workspace, installed packages and the
kernel's namespace lie in a directory of the gateway's disk (``snapshot_dir``),
as tar streams made by ``tar`` in the container, as the kernel's user. The
namespace is pickled inside the kernel by the image's ``kernelgw_kernel.namespace``
(cloudpickle, one variable at a time, so what cannot be pickled is reported by
name); the gateway only moves its bytes and reads the JSON summary. Nothing the
kernel made is ever unpickled outside a kernel: a resume hands the file to the
new kernel, which loads it in its own sandbox.

Snapshots are bounded twice: each part by the session's tmpfs size (`tree_caps`:
tar runs with ``--sparse``, so a file's holes take no room, and the bytes are
counted as they stream), and all snapshots of the gateway together by its
`SnapshotBudget` (``paused_budget_mb``). A pause past either stops, removes what
it wrote and leaves the session running as it was.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from kernelgw.errors import BackendError, KernelGWError, QuotaExceeded
from kernelgw.runtime.backends.base import PACKAGES_DIR, WORKSPACE_DIR, Backend, KernelHandle
from kernelgw.runtime.kernel_link import KernelLink
from kernelgw.runtime.workspace import TreeTooLarge, read_tree, write_tree

NAMESPACE_FILE = f"{WORKSPACE_DIR}/.kernelgw-namespace"
"""Where the kernel writes its pickled variables for a pause and reads them on a
resume: in the workspace (the session's largest tmpfs), so it travels with it."""
PARTS = {"workspace.tar": WORKSPACE_DIR, "packages.tar": PACKAGES_DIR}
"""The snapshot's files: which directory of the kernel each holds."""
MAX_SUMMARY_CHARS = 1 << 20
MAX_NAMES_REPORTED = 1000


class SnapshotFailed(BackendError):
    code = "snapshot_failed"


class SnapshotTooLarge(QuotaExceeded):
    """A session's snapshot would be larger than its tmpfs sizes allow."""

    code = "snapshot_too_large"


class PausedBudgetExceeded(KernelGWError):
    """The gateway's disk budget for paused sessions (``paused_budget_mb``) has no
    room for this snapshot: 507 Insufficient Storage."""

    status_code = 507
    code = "paused_budget_exceeded"


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


@dataclass
class SnapshotBudget:
    """The bytes of this gateway's disk that paused sessions' snapshots hold,
    within ``limit``. A pause takes its bytes as they stream, so pauses running
    at once never pass the limit together; a snapshot's bytes are given back
    when it is removed (resume, delete, expiry)."""

    limit: int
    used: int = 0
    on_change: Callable[[int], None] | None = None
    """Called with ``used`` after each change (the metric)."""

    def check(self, wanted: int = 1) -> None:
        """Refuse, before any work, a pause that would not find ``wanted`` bytes."""
        if self.used + wanted > self.limit:
            raise PausedBudgetExceeded(self._message())

    def take(self, n: int) -> None:
        self.check(n)
        self.hold(n)

    def hold(self, n: int) -> None:
        """Count ``n`` bytes, even past the limit (a snapshot already on disk)."""
        self.used += n
        if self.on_change is not None:
            self.on_change(self.used)

    def give_back(self, n: int) -> None:
        self.hold(-min(n, self.used))

    def _message(self) -> str:
        return (
            f"The gateway's disk budget for paused sessions (setting paused_budget_mb, {_mib(self.limit)}) "
            f"has no room for this snapshot: paused sessions hold {_mib(self.used)}. The session was not "
            "paused and goes on running as it was; resume or delete paused sessions to make room."
        )


@dataclass(frozen=True)
class NamespaceSummary:
    """What the kernel's snapshot module said it saved or restored."""

    done: list[str] = field(default_factory=list)
    """Names saved (pause) or restored (resume)."""
    modules: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    """Name: why it could not be saved or restored."""
    bytes: int = 0


def parse_summary(reply: dict[str, Any] | None, key: str, done_key: str) -> NamespaceSummary:
    """The snapshot module's JSON answer from an execute reply's user_expressions,
    checked as the untrusted text it is."""
    if reply is None:
        raise SnapshotFailed("The kernel did not answer the snapshot request in time.")
    found = (reply.get("user_expressions") or {}).get(key) or {}
    if found.get("status") != "ok":
        raise SnapshotFailed(
            f"The kernel's snapshot helper failed: {found.get('ename', '?')}: {str(found.get('evalue', ''))[:300]}"
        )
    text = (found.get("data") or {}).get("text/plain", "")
    if not isinstance(text, str) or len(text) > MAX_SUMMARY_CHARS:
        raise SnapshotFailed("The kernel's snapshot helper gave no usable summary.")
    try:
        data = json.loads(text)
    except ValueError:
        raise SnapshotFailed("The kernel's snapshot helper gave no usable summary.") from None
    if not isinstance(data, dict):
        raise SnapshotFailed("The kernel's snapshot helper gave no usable summary.")

    def names(value: Any) -> list[str]:
        return [str(v)[:200] for v in value][:MAX_NAMES_REPORTED] if isinstance(value, list) else []

    def mapping(value: Any) -> dict[str, str]:
        if not isinstance(value, dict):
            return {}
        return {str(k)[:200]: str(v)[:500] for k, v in list(value.items())[:MAX_NAMES_REPORTED]}

    size = data.get("bytes", 0)
    return NamespaceSummary(
        done=names(data.get(done_key)),
        modules=mapping(data.get("modules")),
        failed=mapping(data.get("failed")),
        bytes=size if isinstance(size, int) and size >= 0 else 0,
    )


async def save_namespace(link: KernelLink, max_bytes: int, timeout: float) -> NamespaceSummary:
    expression = (
        f"__import__('kernelgw_kernel.namespace', fromlist=['save']).save({NAMESPACE_FILE!r}, {int(max_bytes)})"
    )
    reply = await link.silent_request("", {"snapshot": expression}, timeout=timeout)
    return parse_summary(reply, "snapshot", "saved")


def refuse_if_nothing_saved(summary: NamespaceSummary) -> None:
    """A pause whose variables could not be written at all (``failed["*"]``: the
    workspace, through which they pass, was full, or even an empty snapshot was
    past the limit) is refused: it answered 200 and the resume brought back none
    of them, ``y = 7`` beside 512 MiB of data included."""
    reason = summary.failed.get("*")
    if reason is not None:
        raise SnapshotTooLarge(
            f"The session cannot be paused: its variables could not be saved ({reason}). They are written into "
            f"the workspace on their way out, so they must fit in it (workspace_size_mb) beside its files; "
            "delete large variables or files, or ask for a larger workspace. "
            "It was not paused and goes on running as it was."
        )


async def load_namespace(link: KernelLink, timeout: float) -> NamespaceSummary:
    expression = f"__import__('kernelgw_kernel.namespace', fromlist=['load']).load({NAMESPACE_FILE!r})"
    reply = await link.silent_request("", {"snapshot": expression}, timeout=timeout)
    return parse_summary(reply, "snapshot", "restored")


async def discard_namespace(link: KernelLink) -> None:
    """Remove the namespace file a failed pause left in the workspace."""
    # an expression that raises (no such file) is only reported in the reply
    await link.silent_request("", {"discard": f"__import__('os').remove({NAMESPACE_FILE!r})"}, timeout=10.0)


async def save_files(
    backend: Backend,
    handle: KernelHandle,
    directory: Path,
    timeout: float,
    caps: dict[str, int],
    budget: SnapshotBudget | None = None,
) -> int:
    """The workspace (with the namespace file) and the packages, out of the kernel
    into ``directory`` (made afresh); returns the bytes written, which stay taken
    from ``budget``. Each part stops past its cap in ``caps`` (`SnapshotTooLarge`),
    the whole past the budget (`PausedBudgetExceeded`); then nothing stays taken,
    and the caller removes ``directory``."""
    await anyio.to_thread.run_sync(_fresh_dir, directory)
    written = 0
    try:
        for name, path in PARTS.items():
            async with (
                contextlib.aclosing(read_tree(backend, handle, path, timeout, max_bytes=caps.get(path))) as stream,
                await anyio.open_file(directory / name, "wb") as f,
            ):
                async for chunk in stream:
                    if budget is not None:
                        budget.take(len(chunk))
                    written += len(chunk)
                    await f.write(chunk)
    except TreeTooLarge as exc:
        if budget is not None:
            budget.give_back(written)
        raise SnapshotTooLarge(
            f"The session cannot be paused: {exc.message} It was not paused and goes on running as it was."
        ) from None
    except BaseException:
        if budget is not None:
            budget.give_back(written)
        raise
    return written


async def restore_files(backend: Backend, handle: KernelHandle, directory: Path, timeout: float) -> int:
    """Put what ``save_files`` wrote back into a (new) kernel; returns the bytes."""
    moved = 0
    for name, path in PARTS.items():
        async with contextlib.aclosing(_chunks(directory / name)) as stream:
            moved += await write_tree(backend, handle, path, stream, timeout)
    return moved


async def _chunks(path: Path, size: int = 1 << 20) -> AsyncGenerator[bytes, None]:
    async with await anyio.open_file(path, "rb") as f:
        while chunk := await f.read(size):
            yield chunk


def _fresh_dir(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True, mode=0o700)


async def remove_snapshot(directory: Path) -> None:
    await anyio.to_thread.run_sync(lambda: shutil.rmtree(directory, ignore_errors=True))


def snapshot_bytes(directory: Path) -> int:
    """The bytes a snapshot's files take (blocking: run it in a thread)."""
    return sum(f.stat().st_size for f in directory.iterdir() if f.is_file())
