"""The tables, defined once (SQLAlchemy Core); the same on SQLite and PostgreSQL.

No foreign keys on purpose: a row must never be refused because an earlier
write (say the session's own row, while the database was down) was lost.
Purging deletes a session's executions and notes explicitly.

A change here needs a migration (kernelgw/storage/migrations/versions): the
store upgrades existing databases to the head revision at start, and a test
fails while this metadata and the head revision disagree.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

sessions = Table(
    "kgw_sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("gateway_name", String(255), nullable=False),
    Column("image", String(512), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("end_reason", Text, nullable=True),
    Column("language_info", Text, nullable=False, default="{}"),  # JSON, from kernel_info
    Column("owner", String(32), nullable=True),  # the API key id that created it
    Column("kernel_name", String(64), nullable=True),  # kernelgw.kernels name; NULL: python3 (before 0004)
    # what a restarted gateway needs to reattach the kernel; ``kernel`` is JSON
    # holding the connection dict with the kernel's HMAC key: protect the store
    Column("container_id", String(128), nullable=True),
    Column("kernel", Text, nullable=True),
    Column("execution_count", Integer, nullable=True),
    Column("last_seq", Integer, nullable=True),
    # what a face gave the session (kernelgw.runtime.lease): free labels (JSON),
    # a lease (NULL: none runs; on_lease_end NULL: end) and the sha256 of its
    # access token (never the token); NULL in rows stored before 0008
    Column("session_metadata", Text, nullable=True),
    Column("lease_until", DateTime(timezone=True), nullable=True),
    Column("on_lease_end", String(8), nullable=True),
    Column("access_sha256", String(64), nullable=True),
    Index("kgw_sessions_ended", "ended_at"),
    Index("kgw_sessions_gateway_open", "gateway_name", "ended_at"),
)

executions = Table(
    "kgw_executions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", String(64), nullable=False),
    Column("position", Integer, nullable=False),
    Column("execution_id", String(128), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("code", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("execution_count", Integer, nullable=True),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("duration_ms", Float, nullable=False),
    Column("reason", Text, nullable=True),
    Column("state_lost", Boolean, nullable=False, default=False),
    Column("events", Text, nullable=False),  # JSON array of the execution's events
    # recovery by replay: the kernel it ran in (its lineage), the execution a
    # replayed one re-ran, and a cell marked not to replay; NULL in older rows
    Column("kernel_id", String(64), nullable=True),
    Column("replay_of", String(128), nullable=True),
    Column("no_replay", Boolean, nullable=True),
    # a Jupyter client's cell: its session_id, its request's header (JSON), and
    # whether its answer went to an open connection (what a reconnect replays)
    Column("client_session", String(255), nullable=True),
    Column("client_header", Text, nullable=True),
    Column("client_answered", Boolean, nullable=True),
    Index("kgw_executions_session", "session_id", "position"),
)

execution_chunks = Table(
    "kgw_execution_chunks",
    metadata,
    # a cell's output in the order it came, written as it came and never
    # rewritten: the cell's events are its chunks by part, then its row's own
    # ``events`` (the tail). A cell of small output has no chunks.
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", String(64), nullable=False),
    Column("execution_id", String(128), nullable=False),
    Column("position", Integer, nullable=False),  # the cell's row's position (ids may repeat)
    Column("part", Integer, nullable=False),
    Column("events", Text, nullable=False),  # JSON array of consecutive events of the cell
    Column("bytes", Integer, nullable=False),  # len(events): a replay's worth is counted without loading them
    Index("kgw_execution_chunks_cell", "session_id", "execution_id", "part"),
)

notes = Table(
    "kgw_notes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", String(64), nullable=False),
    Column("after_seq", Integer, nullable=False),
    Column("markdown", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("kgw_notes_session", "session_id", "after_seq"),
)

api_keys = Table(
    "kgw_api_keys",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(255), nullable=False),
    Column("secret_sha256", String(64), nullable=False),  # never the secret itself
    Column("role", String(16), nullable=False),
    Column("quotas", Text, nullable=False, default="{}"),  # JSON, see kernelgw.keys.KeyQuotas
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
)

audit = Table(
    "kgw_audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("key_id", String(32), nullable=True),
    Column("session_id", String(64), nullable=True),
    Column("execution_id", String(128), nullable=True),
    Column("code", Text, nullable=True),
    Column("code_sha256", String(64), nullable=True),
    Column("duration_ms", Float, nullable=True),
    Column("status", String(16), nullable=True),
    Column("output_bytes", Integer, nullable=True),
    Column("error_name", String(255), nullable=True),
    Column("detail", Text, nullable=True),
    Index("kgw_audit_at", "at"),
    Index("kgw_audit_key", "key_id", "at"),
    Index("kgw_audit_session", "session_id", "at"),
)

gateways = Table(
    "kgw_gateways",
    metadata,
    # the registry of gateways sharing this store (kernelgw.cluster.registry):
    # each live one rewrites its row every few seconds
    Column("name", String(255), primary_key=True),
    Column("advertise_url", String(1024), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False),
    Column("stopped_at", DateTime(timezone=True), nullable=True),  # a clean stop; NULL while it runs
    Column("sessions", Integer, nullable=False, default=0),
    Column("free_memory_mb", Integer, nullable=True),
)
