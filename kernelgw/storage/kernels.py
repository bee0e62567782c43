"""What a restarted gateway reattaches from: each open session's kernel, in its row.

The session row keeps the kernel's container id, its connection dict (with the
kernel's HMAC key: protect the store), socket directory, spec and timeout, the
counters the session had reached, and its terms (labels, lease, access hash). A
gateway of the same name reads them back at start (`Store.open_sessions`) and
reattaches or ends each session.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Row, select, update

from kernelgw.runtime.backends.base import KernelHandle, KernelSpec
from kernelgw.runtime.recorder import FollowedCell, StoredSession
from kernelgw.storage import schema
from kernelgw.storage.records import as_utc, stored_metadata
from kernelgw.storage.thread_engine import StoreConnection

if TYPE_CHECKING:
    from kernelgw.runtime.recorder import RecordedSession

CRASHED_REASON = "the gateway stopped without ending the session"


def kernel_values(session: RecordedSession) -> dict[str, Any]:
    """The session row's columns a restarted gateway reattaches from (the
    connection dict holds the kernel's HMAC key)."""
    handle = session.handle or session.paused_from
    if handle is None:
        return {}
    kernel = {
        "kernel_id": handle.kernel_id,
        "conn_dir": str(handle.conn_dir),
        "connection": handle.connection,
        # a session kept in the store has a container of its own: no host (only children have one)
        "spec": {k: v for k, v in dataclasses.asdict(session.spec).items() if k != "host"},
        "exec_timeout_s": session.config.exec_timeout_s,
        "auto_replay": session.config.auto_replay,
        "paused": session.paused_from is not None,
        # a paused session's lineage is that of the kernel it was paused from
        "lineage_kernels": list(session.lineage_kernels),
        # a cell left running in the kept kernel: the next gateway follows it
        "following": dataclasses.asdict(following) if (following := getattr(session, "following", None)) else None,
    }
    return {
        "container_id": handle.container_id,
        "kernel": json.dumps(kernel),
        "execution_count": session.execution_count,
        # where a successor's numbering continues: a reservation ahead of
        # what was sent, exact after a clean stop (`runtime.fanout.SEQ_BLOCK`)
        "last_seq": session.resume_seq,
    }


def lease_values(session: RecordedSession) -> dict[str, Any]:
    """The session row's lease columns (written at creation, at each lease change
    and with the kernel: a pause stops the lease)."""
    until = session.lease_until
    return {"lease_until": until.astimezone(UTC) if until is not None else None, "on_lease_end": session.on_lease_end}


def terms_values(session: RecordedSession) -> dict[str, Any]:
    """The session row's terms columns: labels, lease, the access token's hash."""
    metadata = session.metadata
    return {
        "session_metadata": json.dumps(metadata) if metadata else None,
        "access_sha256": session.access_sha256,
        **lease_values(session),
    }


def stored_session(row: Any) -> StoredSession:
    """A session row back as what the manager reattaches; raises ValueError,
    KeyError or TypeError when its kernel column is unreadable."""
    kernel = json.loads(row.kernel)
    spec = KernelSpec(**kernel["spec"])
    handle = KernelHandle(
        kernel_id=kernel["kernel_id"],
        session_id=row.id,
        container_id=row.container_id,
        conn_dir=Path(kernel["conn_dir"]),
        connection=dict(kernel["connection"]),
    )
    return StoredSession(
        session_id=row.id,
        owner=row.owner,
        created_at=as_utc(row.created_at) if row.created_at is not None else datetime.now(UTC),
        handle=handle,
        spec=spec,
        exec_timeout_s=float(kernel["exec_timeout_s"]),
        execution_count=row.execution_count or 0,
        last_seq=row.last_seq or 0,
        auto_replay=bool(kernel.get("auto_replay", False)),
        paused=bool(kernel.get("paused", False)),
        lineage_kernels=tuple(str(k) for k in kernel.get("lineage_kernels") or [kernel["kernel_id"]]),
        following=_followed(kernel.get("following")),
        metadata=stored_metadata(row.session_metadata),
        lease_until=as_utc(row.lease_until) if row.lease_until is not None else None,
        on_lease_end="pause" if row.on_lease_end == "pause" else "end",
        access_sha256=row.access_sha256,
    )


def _followed(value: Any) -> FollowedCell | None:
    """The stored cell to follow, or None (none stored, or unreadable: then the
    cell's record stays as the previous gateway left it)."""
    if not isinstance(value, dict):
        return None
    try:
        return FollowedCell(
            execution_id=str(value["execution_id"]),
            msg_id=str(value["msg_id"]),
            nonce=str(value["nonce"]),
            timeout_s=float(value["timeout_s"]),
            sent_at=float(value["sent_at"]),
            output_bytes=int(value.get("output_bytes", 0)),
            truncated=bool(value.get("truncated", False)),
            late_parts=int(value.get("late_parts", 0)),
        )
    except (KeyError, TypeError, ValueError):
        return None


async def open_session_rows(conn: StoreConnection, gateway_name: str) -> Sequence[Row[Any]]:
    """The open sessions of ``gateway_name``, after ending those stored without a
    kernel (by a release before reattachment: nothing to reattach)."""
    s = schema.sessions
    await conn.execute(
        update(s)
        .where(s.c.gateway_name == gateway_name, s.c.ended_at.is_(None), s.c.kernel.is_(None))
        .values(ended_at=datetime.now(UTC), end_reason=CRASHED_REASON)
    )
    return (await conn.execute(select(s).where(s.c.gateway_name == gateway_name, s.c.ended_at.is_(None)))).all()
