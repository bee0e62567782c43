"""Sessions keep their kernel, so a restarted gateway can reattach to it.

The ``kernel`` column is JSON holding the kernel's connection dict with its
HMAC key: protect the store. All four are nullable: sessions stored before
this have no kernel to reattach (the store ends them at start).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = ("container_id", "kernel", "execution_count", "last_seq")


def upgrade() -> None:
    # nullable columns: a plain ALTER TABLE ... ADD COLUMN, on SQLite too
    op.add_column("kgw_sessions", sa.Column("container_id", sa.String(128), nullable=True))
    op.add_column("kgw_sessions", sa.Column("kernel", sa.Text(), nullable=True))
    op.add_column("kgw_sessions", sa.Column("execution_count", sa.Integer(), nullable=True))
    op.add_column("kgw_sessions", sa.Column("last_seq", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kgw_sessions") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
