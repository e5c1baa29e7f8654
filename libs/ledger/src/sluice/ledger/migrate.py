"""Applying the Alembic migrations that ship inside this package.

There is no alembic.ini: the script location is this package's
`migrations` folder and the connection is handed to env.py directly, so a
URL with `%` in a password needs no ini escaping. To write a new revision:

    from alembic import command
    from sluice.ledger.migrate import alembic_config
    command.revision(alembic_config("sqlite:///.sluice/ledger.db"),
                     message="...", autogenerate=True)
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text

from sluice.ledger.database import create_ledger_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Serializes concurrent upgrades against one Postgres database (two gateway
# pods starting together): the second waits, then finds nothing to do.
# Any constant works as long as nothing else in the database uses it.
_UPGRADE_ADVISORY_LOCK_KEY = 0x51_1CE_1ED9E

# Alembic's `context` and `op` are process-global proxies, so two upgrades in
# one process must not overlap (they crash, not merely race). The database
# locks above and below cover other processes.
_IN_PROCESS_UPGRADE_LOCK = threading.Lock()


def alembic_config(url: str | None = None) -> Config:
    # Alembic would print some command output to stdout; the CLI keeps stdout
    # for the API key alone.
    config = Config(stdout=sys.stderr)
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade_database(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision`; a no-op when it is there."""
    engine = create_ledger_engine(url)
    try:
        with _IN_PROCESS_UPGRADE_LOCK, engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                                   {"key": _UPGRADE_ADVISORY_LOCK_KEY})
            else:
                # Take SQLite's write lock before reading alembic_version, so a
                # second process waits here and then sees the new revision.
                # SQLite DDL is transactional, so the whole upgrade commits
                # or rolls back as one.
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            config = alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()
