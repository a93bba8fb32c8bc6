"""Alembic environment: runs against the engine handed over by harness.store.migrate."""

from alembic import context
from sqlalchemy import Engine

engine: Engine = context.config.attributes["engine"]
with engine.connect() as connection:
    context.configure(connection=connection, render_as_batch=engine.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
