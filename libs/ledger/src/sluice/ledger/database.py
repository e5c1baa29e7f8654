"""Where the ledger lives and how to connect to it.

SLUICE_DATABASE_URL is an SQLAlchemy URL (`postgresql+psycopg://...` in a
cluster); unset means an SQLite file `.sluice/ledger.db` under the current
directory, for a laptop or a single-node dev stack.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

DATABASE_URL_ENV = "SLUICE_DATABASE_URL"
DEFAULT_SQLITE_RELATIVE_PATH = Path(".sluice") / "ledger.db"

# How long an SQLite writer waits for another writer's lock before failing.
# Writes are a few ms each, so this only trips when something holds the lock
# abnormally long; the outbox flusher then retries with backoff.
SQLITE_BUSY_TIMEOUT_S = 30.0

# How long a Postgres connect may take before it counts as an outage. Short,
# because the flusher retries anyway and a key lookup should fail fast.
POSTGRES_CONNECT_TIMEOUT_S = 5


def default_database_url(cwd: Path) -> str:
    """The SQLite URL used when SLUICE_DATABASE_URL is unset; creates the folder."""
    path = (cwd / DEFAULT_SQLITE_RELATIVE_PATH).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def resolve_database_url(environ: Mapping[str, str], cwd: Path) -> str:
    url = environ.get(DATABASE_URL_ENV, "").strip()
    return url or default_database_url(cwd)


def create_ledger_engine(url: str) -> Engine:
    """A synchronous engine configured for the ledger's access pattern:
    short transactions from several threads (callers use threads, not asyncio)."""
    parsed = make_url(url)
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}
    elif parsed.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S}
        # After a database restart every pooled connection is dead; check on
        # checkout instead of failing the next write on a stale socket.
        kwargs["pool_pre_ping"] = True
    engine = create_engine(parsed, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_on_connect)
    return engine


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # SQLite ignores foreign keys unless asked, per connection.
        cursor.execute("PRAGMA foreign_keys=ON")
        _use_wal(cursor)
    finally:
        cursor.close()


def _use_wal(cursor: Any) -> None:
    """WAL lets summaries read while the flusher writes; the mode is stored in
    the file, so only the first connection to a new database changes it.
    Changing it needs the exclusive lock, and SQLite answers "database is
    locked" at once (no busy wait) while another process holds the write
    lock, e.g. a second gateway migrating the new file: retry until the busy
    timeout. In-memory databases answer "memory", which is fine."""
    deadline_s = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            mode = str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            if mode not in ("wal", "memory"):
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline_s:
                raise
            time.sleep(0.05)
