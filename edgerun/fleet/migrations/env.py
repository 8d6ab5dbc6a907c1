"""Alembic environment: the server passes an open connection in config.attributes['connection']."""

from __future__ import annotations

from alembic import context

from edgerun.fleet.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
