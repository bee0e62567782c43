"""A cell's output is stored in chunks, as it comes.

A cell's events were one JSON array in its row, rewritten whole at every
checkpoint and held in the gateway's memory until the cell ended: a 16 MiB
output made 16 MiB commits that other sessions' answers queued behind. Now
the output goes into append-only rows of ``kgw_execution_chunks`` (about
256 KiB each) while the cell runs, and the cell's row keeps only what came
after its last chunk. Rows stored before this have no chunks and read as
before.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "kgw_execution_chunks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("session_id", sa.String(64), nullable=False),
        sa.Column("execution_id", sa.String(128), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("part", sa.Integer, nullable=False),
        sa.Column("events", sa.Text, nullable=False),
        sa.Column("bytes", sa.Integer, nullable=False),
    )
    op.create_index("kgw_execution_chunks_cell", "kgw_execution_chunks", ["session_id", "execution_id", "part"])


def downgrade() -> None:
    op.drop_index("kgw_execution_chunks_cell", table_name="kgw_execution_chunks")
    op.drop_table("kgw_execution_chunks")
