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

from support.postgres import libpq_conninfo

BACKENDS = ("sqlite", "postgresql")


def postgres_schema_url(session_url: str, schema: str) -> str:
    """The session database, with `schema` first on the search path, so the
    ledger's tables and alembic_version land in it."""
    options = quote(f"-csearch_path={schema}", safe="")
    return f"{session_url}?options={options}"


@pytest.fixture
def postgres_url(postgres_session_url: str) -> Iterator[str]:
    """A fresh, empty schema for one test."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    conninfo = libpq_conninfo(postgres_session_url)
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
