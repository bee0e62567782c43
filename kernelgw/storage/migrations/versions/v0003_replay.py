"""Executions say which kernel ran them, what they replayed, and whether they may be replayed.

Recovery by replay re-runs the cells that built a kernel's state; a restarted
gateway finds them by ``kernel_id``. ``replay_of`` names the execution a
replayed one re-ran (the notebook export leaves those out); ``no_replay``
marks a cell its client asked never to replay. All nullable: rows stored
before this have no kernel id, so they are in no lineage.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = ("kernel_id", "replay_of", "no_replay")


def upgrade() -> None:
    # nullable columns: a plain ALTER TABLE ... ADD COLUMN, on SQLite too
    op.add_column("kgw_executions", sa.Column("kernel_id", sa.String(64), nullable=True))
    op.add_column("kgw_executions", sa.Column("replay_of", sa.String(128), nullable=True))
    op.add_column("kgw_executions", sa.Column("no_replay", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kgw_executions") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
