"""The kinds of audit record (`kernelgw.storage.audit`).

Apart from the audit log so that ``kernelgw audit --kind``'s choices, made when
the CLI is imported, do not import the storage (SQLAlchemy and the whole store:
0.3-0.4 s of every ``kernelgw`` command's start, ``serve``'s before it pauses
the cyclic collector, and ``run``'s, which never opens a database).
"""

from __future__ import annotations

KINDS = (
    "execution",
    "execution_late_output",
    "session_created",
    "session_deleted",
    "session_reaped",
    "session_ended",
    "kernel_died",
    "kernel_restarted",
    "kernel_anomaly",
    "key_created",
    "key_revoked",
)
