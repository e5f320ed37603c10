"""Alembic environment: runs on the connection `gpupool.staging.db.upgrade` hands over."""

from alembic import context

from gpupool.staging.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only `alembic` run by hand from a shell
    raise RuntimeError("run migrations with `gpupool db upgrade`, which passes the connection")

context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
