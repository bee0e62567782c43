"""The schema of the release before migrations (commit d7b8a43), frozen.

Never edit this to change the schema: add a revision. Revision ``0001``
creates these tables; `kernelgw.storage.migrate` also creates the ones an even
older database lacks (the first release had no keys, audit or owner column).
"""

from __future__ import annotations

from sqlalchemy import Boolean, Column, DateTime, Float, Index, Integer, MetaData, String, Table, Text

metadata = MetaData()

Table(
    "kgw_sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("gateway_name", String(255), nullable=False),
    Column("image", String(512), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("end_reason", Text, nullable=True),
    Column("language_info", Text, nullable=False),
    Column("owner", String(32), nullable=True),
    Index("kgw_sessions_ended", "ended_at"),
    Index("kgw_sessions_gateway_open", "gateway_name", "ended_at"),
)

Table(
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
    Column("state_lost", Boolean, nullable=False),
    Column("events", Text, nullable=False),
    Index("kgw_executions_session", "session_id", "position"),
)

Table(
    "kgw_notes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("session_id", String(64), nullable=False),
    Column("after_seq", Integer, nullable=False),
    Column("markdown", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("kgw_notes_session", "session_id", "after_seq"),
)

Table(
    "kgw_api_keys",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(255), nullable=False),
    Column("secret_sha256", String(64), nullable=False),
    Column("role", String(16), nullable=False),
    Column("quotas", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
)

Table(
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
