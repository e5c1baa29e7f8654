"""API keys against real SQLite and Postgres: minted once, stored hashed,
looked up, revoked."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from sluice.ledger.keys import ApiKeyRecord, KeyStore, hash_key
from sluice.ledger.schema import ApiKey


def test_create_then_lookup_returns_the_limits(ledger_store):
    keys = KeyStore(ledger_store)
    key = keys.create_key("acme", tokens_per_minute=1000, requests_per_minute=60, max_concurrency=4)
    assert key.startswith("sk-sluice-") and len(key) > 40
    assert keys.lookup(key) == ApiKeyRecord(tenant="acme", is_admin=False, tokens_per_minute=1000,
                                            requests_per_minute=60, max_concurrency=4)


def test_unlimited_key_and_admin_tenant(ledger_store):
    keys = KeyStore(ledger_store)
    key = keys.create_key("ops", is_admin=True)
    assert keys.lookup(key) == ApiKeyRecord(tenant="ops", is_admin=True, tokens_per_minute=None,
                                            requests_per_minute=None, max_concurrency=None)


def test_keys_are_stored_only_as_hash_and_prefix(ledger_store):
    keys = KeyStore(ledger_store)
    key = keys.create_key("acme")
    with ledger_store.engine.connect() as connection:
        row = connection.execute(select(ApiKey)).one()
    assert row.key_hash == hash_key(key)
    assert key.startswith(row.key_prefix) and len(row.key_prefix) < len(key) // 2
    assert key not in {str(value) for value in row}


def test_revoke_hides_the_key_and_is_reported_once(ledger_store):
    keys = KeyStore(ledger_store)
    kept, revoked = keys.create_key("acme"), keys.create_key("acme")
    assert keys.revoke_key(revoked) is True
    assert keys.revoke_key(revoked) is False
    assert keys.revoke_key("sk-sluice-never-issued") is False
    assert keys.lookup(revoked) is None
    assert keys.lookup(kept) is not None
    assert set(keys.active_keys()) == {hash_key(kept)}


def test_unknown_key_is_none(ledger_store):
    assert KeyStore(ledger_store).lookup("sk-sluice-nope") is None


def test_active_keys_snapshot_covers_every_tenant(ledger_store):
    keys = KeyStore(ledger_store)
    minted = {keys.create_key("acme"): "acme", keys.create_key("globex", max_concurrency=2): "globex"}
    snapshot = keys.active_keys()
    assert {hash_key(k): tenant for k, tenant in minted.items()} == {
        key_hash: record.tenant for key_hash, record in snapshot.items()}


@pytest.mark.parametrize("limit", [0, -5, True])
def test_nonsense_limits_are_refused(ledger_store, limit):
    with pytest.raises(ValueError):
        KeyStore(ledger_store).create_key("acme", tokens_per_minute=limit)


def test_overload_policy_defaults_to_normal_with_no_concessions(ledger_store):
    keys = KeyStore(ledger_store)
    record = keys.lookup(keys.create_key("acme"))
    assert (record.priority, record.degradable, record.allow_fallback) == ("normal", False, False)


def test_overload_policy_round_trips_through_lookup_and_the_snapshot(ledger_store):
    keys = KeyStore(ledger_store)
    critical = keys.create_key("acme", priority="critical")
    flexible = keys.create_key("acme", degradable=True, allow_fallback=True)
    assert keys.lookup(critical) == ApiKeyRecord(
        tenant="acme", is_admin=False, tokens_per_minute=None, requests_per_minute=None,
        max_concurrency=None, priority="critical", degradable=False, allow_fallback=False)
    snapshot = keys.active_keys()
    assert (snapshot[hash_key(flexible)].degradable, snapshot[hash_key(flexible)].allow_fallback,
            snapshot[hash_key(flexible)].priority) == (True, True, "normal")


@pytest.mark.parametrize("policy", [{"priority": "urgent"}, {"degradable": 1}, {"allow_fallback": "yes"}])
def test_nonsense_policy_is_refused_before_anything_is_written(ledger_store, policy):
    keys = KeyStore(ledger_store)
    with pytest.raises(ValueError):
        keys.create_key("acme", **policy)
    assert keys.active_keys() == {}
