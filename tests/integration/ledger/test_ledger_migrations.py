"""Migrations: apply on both dialects, are idempotent, match the models,
and 0002 gives rows written under 0001 their defaults."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import insert, inspect, select, text
from sqlalchemy.exc import IntegrityError

from sluice.ledger.database import create_ledger_engine
from sluice.ledger.migrate import current_revision, head_revision, upgrade_database
from sluice.ledger.schema import ApiKey, Attempt, Base, Tenant, Usage

LEDGER_TABLES = {"tenants", "api_keys", "usage", "attempts", "prices"}
HEAD = "0002"
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def test_upgrade_creates_the_ledger_at_head(ledger_url):
    upgrade_database(ledger_url)
    engine = create_ledger_engine(ledger_url)
    try:
        assert LEDGER_TABLES <= set(inspect(engine).get_table_names())
        with engine.connect() as connection:
            assert current_revision(connection) == head_revision() == HEAD
    finally:
        engine.dispose()


def test_upgrade_twice_is_a_no_op(ledger_url):
    upgrade_database(ledger_url)
    upgrade_database(ledger_url)
    engine = create_ledger_engine(ledger_url)
    try:
        with engine.connect() as connection:
            assert current_revision(connection) == HEAD
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
            assert current_revision(connection) == HEAD
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
        "cached_tokens", "output_tokens", "finish_reason", "finished_at", "service_class"}
    assert columns["attempts"] == {
        "id", "attempt_id", "tenant_id", "request_id", "model", "model_version",
        "prompt_tokens", "output_tokens", "outcome", "at", "service_class"}


def _usage_row(request_id: str, **overrides: object) -> dict[str, object]:
    return {"tenant_id": 1, "request_id": request_id, "model": "m", "model_version": "v1",
            "prompt_tokens": 3, "cached_tokens": 0, "output_tokens": 5, "finish_reason": "stop",
            "finished_at": T0, **overrides}


def test_0002_gives_rows_from_0001_their_defaults(ledger_url):
    upgrade_database(ledger_url, revision="0001")
    engine = create_ledger_engine(ledger_url)
    try:
        # Plain SQL naming the 0001 columns only (the models would add the
        # new columns' Python defaults), as a 0001 gateway wrote them.
        with engine.begin() as connection:
            connection.execute(text("INSERT INTO tenants (id, name) VALUES (1, 'acme')"))
            connection.execute(text(
                "INSERT INTO usage (tenant_id, request_id, model, model_version, prompt_tokens,"
                " cached_tokens, output_tokens, finish_reason, finished_at)"
                " VALUES (1, 'r1', 'm', 'v1', 3, 0, 5, 'stop', :at)"), {"at": T0})
            connection.execute(text(
                "INSERT INTO attempts (attempt_id, tenant_id, request_id, model, model_version,"
                " prompt_tokens, output_tokens, outcome, at)"
                " VALUES ('a1', 1, 'r0', 'm', 'v1', 3, 0, 'error', :at)"), {"at": T0})
            connection.execute(text(
                "INSERT INTO api_keys (key_hash, key_prefix, tenant_id) VALUES ('h', 'sk-sluice-x', 1)"))
        upgrade_database(ledger_url)
        with engine.connect() as connection:
            assert connection.execute(select(Usage.service_class)).scalar_one() == "interactive"
            assert connection.execute(select(Attempt.service_class)).scalar_one() == "interactive"
            key = connection.execute(
                select(ApiKey.priority, ApiKey.degradable, ApiKey.allow_fallback)).one()
            assert tuple(key) == ("normal", False, False)
    finally:
        engine.dispose()


def test_0002_checks_are_enforced_and_0001_checks_survive_the_rebuild(ledger_url):
    # On SQLite 0002 rebuilds usage, attempts and api_keys; their old CHECKs
    # must come through the copy.
    upgrade_database(ledger_url)
    engine = create_ledger_engine(ledger_url)
    bad_rows = [
        (Usage, _usage_row("r2", service_class="bulk")),
        (Usage, _usage_row("r3", finish_reason="cancelled")),
        (Usage, _usage_row("r4", cached_tokens=9)),
        (ApiKey, {"key_hash": "h", "key_prefix": "p", "tenant_id": 1, "priority": "urgent"}),
        (Attempt, {"attempt_id": "a", "tenant_id": 1, "request_id": "r", "model": "m",
                   "model_version": "v1", "prompt_tokens": 1, "output_tokens": 0,
                   "outcome": "error", "at": T0, "service_class": "bulk"}),
    ]
    try:
        with engine.begin() as connection:
            connection.execute(insert(Tenant.__table__).values(id=1, name="acme"))
        for model, row in bad_rows:
            with pytest.raises(IntegrityError), engine.begin() as connection:
                connection.execute(insert(model.__table__).values(row))
    finally:
        engine.dispose()


def test_downgrade_to_0001_and_back(ledger_url):
    from alembic import command

    from sluice.ledger.migrate import alembic_config

    upgrade_database(ledger_url)
    command.downgrade(alembic_config(ledger_url), "0001")
    engine = create_ledger_engine(ledger_url)
    try:
        inspector = inspect(engine)
        assert "prices" not in inspector.get_table_names()
        assert "service_class" not in {c["name"] for c in inspector.get_columns("usage")}
        assert "priority" not in {c["name"] for c in inspector.get_columns("api_keys")}
    finally:
        engine.dispose()
    upgrade_database(ledger_url)
