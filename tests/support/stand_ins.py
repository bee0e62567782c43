"""What the store reads of a session and of a finished cell, without a kernel:
for tests of the history storage alone."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from kernelgw import events as ev
from kernelgw.runtime.session import Published, QueuedExecution


def stand_in_session(session_id: str) -> Any:
    """What the store reads of a KernelSession (no kernel needed to record one)."""
    return SimpleNamespace(
        id=session_id,
        spec=SimpleNamespace(image="img:test", memory_mb=512, cpus=1.0, runtime="runc", kernel="python3"),
        owner=None,
        created_at=datetime.now(UTC),
        kernel_info={"language_info": {"name": "python", "version": "3.11"}},
        handle=None,  # no kernel to reattach: a restart of the store's gateway ends it
        paused_from=None,
        lineage_kernels=(),
        metadata={},
        lease_until=None,
        on_lease_end="end",
        access_sha256=None,
    )


def finished_execution(execution_id: str, code: str) -> QueuedExecution:
    rec = QueuedExecution(execution_id=execution_id, code=code, timeout=10)
    for seq, event in enumerate(
        [
            ev.Queued(execution_id=execution_id, code=code),
            ev.Stream(execution_id=execution_id, name="stdout", text="ünïcode ✓\n"),
            ev.Done(execution_id=execution_id, status="ok", execution_count=1, duration_ms=4.5),
        ],
        start=1,
    ):
        event = event.model_copy(update={"seq": seq})
        rec.published.append(Published(seq, event, event.model_dump_json()))
    rec.done.set_result(rec.published[-1].event)  # type: ignore[arg-type]
    return rec
