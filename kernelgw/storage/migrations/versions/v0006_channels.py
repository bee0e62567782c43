"""Executions say which Jupyter client sent them, and whether it got the answer.

A channels client that reconnects with the same ``session_id`` after a
gateway restart is sent what it missed from the stored cells it sent (their
events, then their reply and idle): the client's ``session_id``, the
request's header (the parent of every replayed message) and whether the
answer reached an open connection are kept on the execution's row. All
nullable: /v1 cells and rows stored before this have none.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("kgw_executions") as batch:
        batch.add_column(sa.Column("client_session", sa.String(255), nullable=True))
        batch.add_column(sa.Column("client_header", sa.Text, nullable=True))
        batch.add_column(sa.Column("client_answered", sa.Boolean, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kgw_executions") as batch:
        batch.drop_column("client_answered")
        batch.drop_column("client_header")
        batch.drop_column("client_session")
