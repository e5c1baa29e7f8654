"""Migrations: apply on both dialects, are idempotent, match the models."""

from __future__ import annotations

import subprocess
import sys

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from sluice.ledger.database import create_ledger_engine
from sluice.ledger.migrate import current_revision, head_revision, upgrade_database
from sluice.ledger.schema import Base

LEDGER_TABLES = {"tenants", "api_keys", "usage", "attempts"}


def test_upgrade_creates_the_ledger_at_head(ledger_url):
    upgrade_database(ledger_url)
    engine = create_ledger_engine(ledger_url)
    try:
        assert LEDGER_TABLES <= set(inspect(engine).get_table_names())
        with engine.connect() as connection:
            assert current_revision(connection) == head_revision() == "0001"
    finally:
        engine.dispose()


def test_upgrade_twice_is_a_no_op(ledger_url):
    upgrade_database(ledger_url)
    upgrade_database(ledger_url)
    engine = create_ledger_engine(ledger_url)
    try:
        with engine.connect() as connection:
            assert current_revision(connection) == "0001"
    finally:
        engine.dispose()


def test_concurrent_upgrades_from_separate_processes_all_succeed(ledger_url):
    # Gateway pods starting at once against a fresh database: each process
    # migrates, the database lock makes the others wait and find it at head.
    script = "import sys; from sluice.ledger.migrate import upgrade_database; upgrade_database(sys.argv[1])"
    processes = [subprocess.Popen([sys.executable, "-c", script, ledger_url],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    for process in processes:
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
    engine = create_ledger_engine(ledger_url)
    try:
        with engine.connect() as connection:
            assert current_revision(connection) == "0001"
    finally:
        engine.dispose()


def test_migrated_schema_matches_the_models(ledger_url):
    upgrade_database(ledger_url)
    engine = create_ledger_engine(ledger_url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_no_table_has_room_for_prompt_or_output_text(ledger_url):
    upgrade_database(ledger_url)
    engine = create_ledger_engine(ledger_url)
    try:
        inspector = inspect(engine)
        columns = {table: {c["name"] for c in inspector.get_columns(table)}
                   for table in ("usage", "attempts")}
    finally:
        engine.dispose()
    assert columns["usage"] == {
        "tenant_id", "request_id", "model", "model_version", "prompt_tokens",
        "cached_tokens", "output_tokens", "finish_reason", "finished_at"}
    assert columns["attempts"] == {
        "id", "attempt_id", "tenant_id", "request_id", "model", "model_version",
        "prompt_tokens", "output_tokens", "outcome", "at"}
