"""A throwaway Postgres database per test session, on the real local server
(SLUICE_TEST_POSTGRES_URL, default postgres@127.0.0.1:5432, trust auth),
created through the `postgres` maintenance database and dropped at the end.
Parallel or repeated runs never see each other's rows."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def admin_url() -> str:
    return os.environ.get("SLUICE_TEST_POSTGRES_URL", DEFAULT_ADMIN_URL)


def libpq_conninfo(url: str, database: str | None = None) -> str:
    parsed = make_url(url)
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def throwaway_database() -> Iterator[str]:
    """SQLAlchemy URL of a database created for this test session."""
    server_url = admin_url()
    try:
        admin = psycopg.connect(libpq_conninfo(server_url), autocommit=True, connect_timeout=3)
    except psycopg.Error as exc:
        pytest.skip(f"Postgres unreachable at {make_url(server_url).render_as_string()}: {exc}")
    database = f"sluice_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    try:
        yield make_url(server_url).set(database=database).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(libpq_conninfo(server_url), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
