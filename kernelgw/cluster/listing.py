"""Other gateways' sessions as a listing shows them, from their store rows.

A listing on any gateway shows the sessions of every live gateway for the
caller's key: its own from memory, the others' from the shared store (one
query, no fan-out). A row holds what the session was created with and its
counters as last recorded; ``state`` is ``idle`` (``paused`` when paused):
the live state is the owner's answer to ``GET /v1/sessions/{id}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kernelgw.kernels import DEFAULT_KERNEL
from kernelgw.runtime.lease import labels
from kernelgw.storage.records import as_utc, stored_metadata


@dataclass(frozen=True)
class RemoteSession:
    id: str
    gateway_name: str
    owner: str | None
    image: str
    kernel: str
    created_at: datetime
    execution_count: int
    last_seq: int
    runtime: str | None
    memory_mb: int | None
    cpus: float | None
    paused: bool
    auto_replay: bool
    metadata: dict[str, str]
    lease_until: datetime | None

    @classmethod
    def from_row(cls, row: Any) -> RemoteSession:
        try:
            kernel = json.loads(row.kernel or "{}")
        except ValueError:
            kernel = {}
        spec = kernel.get("spec") or {}
        return cls(
            id=row.id,
            gateway_name=row.gateway_name,
            owner=row.owner,
            image=row.image,
            kernel=row.kernel_name or DEFAULT_KERNEL,
            created_at=as_utc(row.created_at),
            execution_count=row.execution_count or 0,
            last_seq=row.last_seq or 0,
            runtime=spec.get("runtime"),
            memory_mb=spec.get("memory_mb"),
            cpus=spec.get("cpus"),
            paused=bool(kernel.get("paused")),
            auto_replay=bool(kernel.get("auto_replay")),
            metadata=stored_metadata(row.session_metadata),
            lease_until=as_utc(row.lease_until) if row.lease_until is not None else None,
        )

    def info(self) -> dict[str, Any]:
        """The /v1 ``SessionInfo`` shape."""
        return {
            "id": self.id,
            "state": "paused" if self.paused else "idle",
            "kernel": self.kernel,
            "image": self.image,
            "runtime": self.runtime,
            "memory_mb": self.memory_mb,
            "cpus": self.cpus,
            "created_at": self.created_at,
            "last_activity": None,
            "execution_count": self.execution_count,
            "queue_length": 0,
            "subscribers": 0,
            "last_seq": self.last_seq,
            "dead_reason": None,
            "owner": self.owner,
            "auto_replay": self.auto_replay,
            "metadata": labels(self.metadata),
            "lease_until": self.lease_until,
        }
