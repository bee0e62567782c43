"""The revisions, oldest first by ``down_revision`` (Alembic reads these files by path)."""
