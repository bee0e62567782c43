"""Alembic migrations of the history store's schema, run by `kernelgw.storage.migrate`.

Shipped in the package (no ``alembic.ini``): the store builds its Alembic
configuration in code and upgrades its database to the head revision at start.

Revisions (``versions/``):

- ``0001``: the schema of the release before migrations (commit d7b8a43):
  sessions with their owner, executions, notes, API keys, audit.
- ``0002``: each session keeps its kernel, so a restarted gateway can reattach.
- ``0003``: each execution names its kernel, the execution it replayed, and
  whether it may be replayed (recovery by replay).
- ``0004``: each session names its kernel (language).
- ``0005``: the registry of gateways sharing one store (many gateways as one service).
- ``0006``: each Jupyter client's cell keeps the client's session id, its request
  header and whether its answer was delivered (reconnect after a restart).
- ``0007``: a cell's output is stored in chunks as it comes (``kgw_execution_chunks``),
  so no write of it is large and the gateway need not hold it until the cell ends.
- ``0008``: each session keeps its labels (metadata), lease and access token's
  hash, what a face (E2B's) gave it.

To change the schema: change `kernelgw.storage.schema` and add a revision after
the head here (copy the latest file; ``down_revision`` names the one before).
tests/unit/storage/test_migrations.py fails while the two disagree.
"""

from __future__ import annotations

VERSION_TABLE = "kgw_alembic_version"
"""Not Alembic's default ``alembic_version``: the store may share a PostgreSQL
database with an application that has migrations of its own."""
TABLE_PREFIX = "kgw_"
"""Tables that are the store's; migrations look at nothing else in the database."""
BASELINE = "0001"
"""The schema of the release before migrations (d7b8a43)."""
REATTACH = "0002"
"""The schema of the last release without migrations: kernels kept for reattachment."""
REPLAY = "0003"
"""Executions name their kernel and what they replayed (recovery by replay)."""
KERNEL_NAME = "0004"
"""Sessions name their kernel (language): python3, deno, ir, ..."""
GATEWAYS = "0005"
"""The registry of gateways sharing the store (many gateways as one service)."""
CHANNELS = "0006"
"""Executions name the Jupyter client that sent them (its return is sent what it missed)."""
OUTPUT_CHUNKS = "0007"
"""A cell's output is stored in append-only chunks as it comes."""
SESSION_TERMS = "0008"
"""Sessions keep their metadata, lease and access token's hash."""
HEAD = SESSION_TERMS
"""The newest revision, what this release's databases are at. Named here so that a
start on an up-to-date database need not import Alembic to know it; a new revision
moves it (tests/unit/storage/test_migrations.py checks Alembic's scripts agree)."""


class MigrationsNeedAConnection(RuntimeError):
    """The migrations were run without the store's connection (Alembic's own CLI, offline mode)."""


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Compare only the store's tables: the database may hold other applications' tables."""
    return type_ != "table" or (name or "").startswith(TABLE_PREFIX)
