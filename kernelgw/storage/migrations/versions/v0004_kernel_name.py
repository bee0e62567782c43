"""Sessions say which kernel (language) they ran.

A session's notebook export names its kernelspec and language; the stored
``language_info`` comes from the kernel itself and can be empty, so the
gateway's own name for the kernel is kept beside it. Nullable: rows stored
before this ran Python (``python3``).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column("kgw_sessions", sa.Column("kernel_name", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kgw_sessions") as batch:
        batch.drop_column("kernel_name")
