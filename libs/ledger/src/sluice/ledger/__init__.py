"""Sluice usage ledger: billing rows, unbilled attempts, API keys, and the
durable local outbox that carries records from the gateway to the database.

    gateway thread ──append──> Outbox (local SQLite, fsync'd)
                                  │  OutboxFlusher (background thread)
                                  v
                               LedgerStore ──> Postgres / SQLite
"""

from sluice.ledger.database import create_ledger_engine, default_database_url, resolve_database_url
from sluice.ledger.keys import ApiKeyRecord, KeyStore, hash_key
from sluice.ledger.migrate import upgrade_database
from sluice.ledger.outbox import Outbox, OutboxFlusher
from sluice.ledger.pricing import Price, cost_of
from sluice.ledger.records import AttemptRecord, AttemptRow, UsageRecord, UsageRow
from sluice.ledger.store import LedgerStore

__all__ = [
    "ApiKeyRecord",
    "AttemptRecord",
    "AttemptRow",
    "KeyStore",
    "LedgerStore",
    "Outbox",
    "OutboxFlusher",
    "Price",
    "UsageRecord",
    "UsageRow",
    "cost_of",
    "create_ledger_engine",
    "default_database_url",
    "hash_key",
    "resolve_database_url",
    "upgrade_database",
]
