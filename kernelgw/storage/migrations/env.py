"""Alembic's entry point: runs the revisions on the connection the store hands over.

Only online, on a connection already in a transaction (`kernelgw.storage.migrate`
opens it, takes the lock and commits): no ``alembic.ini``, no URL here.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from kernelgw.storage import schema
from kernelgw.storage.migrations import VERSION_TABLE, MigrationsNeedAConnection, include_name


def run() -> None:
    connection = context.config.attributes.get("connection")
    if context.is_offline_mode() or not isinstance(connection, Connection):
        raise MigrationsNeedAConnection("run the store's migrations through kernelgw.storage.migrate")
    context.configure(
        connection=connection,
        target_metadata=schema.metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run()
