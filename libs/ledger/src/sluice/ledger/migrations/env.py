"""Alembic environment for the ledger, for Postgres (psycopg 3) and SQLite.

upgrade_database() passes an open connection in `config.attributes`; the
plain `alembic` command line (with a URL in the config) works too.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from sluice.ledger.database import create_ledger_engine
from sluice.ledger.schema import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds the
        # table instead, so later revisions work on both dialects.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    engine = create_ledger_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.begin() as own_connection:
            _configure(own_connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
