"""Ledger test databases: a fresh SQLite file, or a fresh schema in a
throwaway Postgres database, per test.

Postgres is the real local server (SLUICE_TEST_POSTGRES_URL, default
postgres@127.0.0.1:5432, trust auth). Each test session creates its own
database `sluice_test_<random>` through the `postgres` maintenance database
and drops it at the end; each test gets its own schema in it. Parallel or
repeated runs therefore never see each other's rows. If the server cannot be
reached the Postgres cases skip, saying why.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from sqlalchemy.engine import make_url

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
BACKENDS = ("sqlite", "postgresql")


def _admin_url() -> str:
    return os.environ.get("SLUICE_TEST_POSTGRES_URL", DEFAULT_ADMIN_URL)


def _libpq_conninfo(url: str, database: str | None = None) -> str:
    parsed = make_url(url)
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def postgres_session_url() -> Iterator[str]:
    """SQLAlchemy URL of a database created for this test session."""
    admin_url = _admin_url()
    try:
        admin = psycopg.connect(_libpq_conninfo(admin_url), autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        pytest.skip(f"Postgres unreachable at {make_url(admin_url).render_as_string()}: {exc}")
    database = f"sluice_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    try:
        yield make_url(admin_url).set(database=database).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(_libpq_conninfo(admin_url), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def postgres_schema_url(session_url: str, schema: str) -> str:
    """The session database, with `schema` first on the search path, so the
    ledger's tables and alembic_version land in it."""
    options = quote(f"-csearch_path={schema}", safe="")
    return f"{session_url}?options={options}"


@pytest.fixture
def postgres_url(postgres_session_url: str) -> Iterator[str]:
    """A fresh, empty schema for one test."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    conninfo = _libpq_conninfo(postgres_session_url)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'CREATE SCHEMA "{schema}"')
    yield postgres_schema_url(postgres_session_url, schema)
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture(params=BACKENDS)
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database (not yet migrated), once per backend."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def ledger_store(ledger_url: str):
    """A LedgerStore on a migrated, empty database."""
    from sluice.ledger.migrate import upgrade_database
    from sluice.ledger.store import LedgerStore

    upgrade_database(ledger_url)
    store = LedgerStore(ledger_url)
    yield store
    store.close()
