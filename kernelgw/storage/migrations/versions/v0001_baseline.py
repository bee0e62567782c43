"""The schema of the release before migrations (commit d7b8a43).

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

from alembic import op

from kernelgw.storage.migrations import baseline

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    baseline.metadata.create_all(op.get_bind(), checkfirst=False)


def downgrade() -> None:
    baseline.metadata.drop_all(op.get_bind(), checkfirst=False)
