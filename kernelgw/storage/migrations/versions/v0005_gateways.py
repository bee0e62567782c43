"""The registry of gateways sharing one store (many gateways as one service).

Each gateway with ``cluster_secret`` set keeps a row: where peers reach it
(``advertise_url``), when it started and last heartbeat, its load (running
sessions, free memory) and a clean stop. A session's owner is its row's
``gateway_name``; peers forward its requests to that gateway's URL.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "kgw_gateways",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("advertise_url", sa.String(1024), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sessions", sa.Integer(), nullable=False),
        sa.Column("free_memory_mb", sa.Integer(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("kgw_gateways")
