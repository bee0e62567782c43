"""Sessions keep what a face gave them: labels, a lease and an access hash.

E2B's sandboxes carry metadata, a timeout that ends (or pauses) them, and an
access token their traffic must show. kernelgw keeps them with the session
(`kernelgw.runtime.lease`): ``session_metadata`` (JSON), ``lease_until`` and
``on_lease_end`` (what a restarted gateway enforces) and ``access_sha256``
(the token's sha256, never the token). Nullable: rows stored before this have
no labels, no lease and no token.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = ("session_metadata", "lease_until", "on_lease_end", "access_sha256")


def upgrade() -> None:
    op.add_column("kgw_sessions", sa.Column("session_metadata", sa.Text, nullable=True))
    op.add_column("kgw_sessions", sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("kgw_sessions", sa.Column("on_lease_end", sa.String(8), nullable=True))
    op.add_column("kgw_sessions", sa.Column("access_sha256", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kgw_sessions") as batch:
        for column in reversed(COLUMNS):
            batch.drop_column(column)
