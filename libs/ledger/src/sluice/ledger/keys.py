"""API keys: minted once, stored only as a hash, looked up by hash.

A key is 'sk-sluice-' + 32 random bytes (url-safe base64). With 256 bits of
entropy a plain SHA-256 is enough: there is nothing to brute-force, so a slow
salted hash (bcrypt, argon2) would only slow every request's lookup.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from sqlalchemy import Row, Select, insert, select, update

from sluice.ledger.schema import ApiKey, Tenant
from sluice.ledger.store import LedgerStore

KEY_PREFIX = "sk-sluice-"
# 'sk-sluice-' plus 8 random characters: enough for a human to tell two keys
# apart in a listing, far too little to help guess the rest.
DISPLAY_PREFIX_CHARS = len(KEY_PREFIX) + 8

KeyPriority = Literal["normal", "critical"]
KEY_PRIORITIES: tuple[str, ...] = ("normal", "critical")


def hash_key(key: str) -> str:
    """SHA-256 hex of the key; what api_keys.key_hash holds."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(slots=True, frozen=True)
class ApiKeyRecord:
    """What the gateway needs to admit a request made with a key. A limit
    of None means the key sets none (the gateway's defaults apply).

    The overload policy (read by the gateway's auth, acted on by overload
    control; the defaults are what every key had before there was one):
    `priority` 'critical' keys are shed last; `degradable` lets overload
    control cap this key's output; `allow_fallback` lets it serve this key's
    requests from a smaller fallback model version.
    """

    tenant: str
    is_admin: bool
    tokens_per_minute: int | None
    requests_per_minute: int | None
    max_concurrency: int | None
    priority: KeyPriority = "normal"
    degradable: bool = False
    allow_fallback: bool = False

    def __post_init__(self) -> None:
        _check_policy(self.priority, self.degradable, self.allow_fallback)


def _check_limit(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


def _check_policy(priority: str, degradable: bool, allow_fallback: bool) -> None:
    if priority not in KEY_PRIORITIES:
        raise ValueError(f"priority must be one of {KEY_PRIORITIES}, got {priority!r}")
    for name, value in (("degradable", degradable), ("allow_fallback", allow_fallback)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool, got {value!r}")


class KeyStore:
    """Keys in the ledger database, through a LedgerStore's engine."""

    def __init__(self, store: LedgerStore) -> None:
        self._store = store

    def create_key(
        self,
        tenant: str,
        tokens_per_minute: int | None = None,
        requests_per_minute: int | None = None,
        max_concurrency: int | None = None,
        is_admin: bool = False,
        *,
        priority: KeyPriority = "normal",
        degradable: bool = False,
        allow_fallback: bool = False,
    ) -> str:
        """Mint a key for `tenant` (created if new; promoted to admin when
        `is_admin`) with the overload policy ApiKeyRecord describes.
        Returns the plaintext key: this is the only time it exists."""
        _check_limit("tokens_per_minute", tokens_per_minute)
        _check_limit("requests_per_minute", requests_per_minute)
        _check_limit("max_concurrency", max_concurrency)
        _check_policy(priority, degradable, allow_fallback)
        tenant_id = self._store.ensure_tenant(tenant, is_admin=is_admin)
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        with self._store.engine.begin() as connection:
            connection.execute(insert(ApiKey).values(
                key_hash=hash_key(key),
                key_prefix=key[:DISPLAY_PREFIX_CHARS],
                tenant_id=tenant_id,
                tokens_per_minute=tokens_per_minute,
                requests_per_minute=requests_per_minute,
                max_concurrency=max_concurrency,
                priority=priority,
                degradable=degradable,
                allow_fallback=allow_fallback,
                created_at=datetime.now(timezone.utc),
            ))
        return key

    def revoke_key(self, key: str) -> bool:
        """True if an active key was revoked; False if unknown or already revoked."""
        with self._store.engine.begin() as connection:
            result = connection.execute(
                update(ApiKey)
                .where(ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None))
                .values(revoked_at=datetime.now(timezone.utc)))
        return result.rowcount == 1

    def lookup(self, key: str) -> ApiKeyRecord | None:
        """The key's record, or None when the key is unknown or revoked."""
        query = self._active_query().where(ApiKey.key_hash == hash_key(key))
        with self._store.engine.connect() as connection:
            row = connection.execute(query).first()
        return None if row is None else _record(row)

    def active_keys(self) -> dict[str, ApiKeyRecord]:
        """Every unrevoked key, by key hash: a snapshot for the gateway's
        cache, which hashes the presented key and looks it up here."""
        with self._store.engine.connect() as connection:
            rows = connection.execute(self._active_query()).all()
        return {row.key_hash: _record(row) for row in rows}

    @staticmethod
    def _active_query() -> Select[Any]:
        return (
            select(ApiKey.key_hash, Tenant.name, Tenant.is_admin, ApiKey.tokens_per_minute,
                   ApiKey.requests_per_minute, ApiKey.max_concurrency, ApiKey.priority,
                   ApiKey.degradable, ApiKey.allow_fallback)
            .join(Tenant, Tenant.id == ApiKey.tenant_id)
            .where(ApiKey.revoked_at.is_(None))
        )


def _record(row: Row[Any]) -> ApiKeyRecord:
    # `row` comes from KeyStore._active_query.
    return ApiKeyRecord(
        tenant=row.name,
        is_admin=bool(row.is_admin),
        tokens_per_minute=row.tokens_per_minute,
        requests_per_minute=row.requests_per_minute,
        max_concurrency=row.max_concurrency,
        priority=row.priority,
        degradable=bool(row.degradable),
        allow_fallback=bool(row.allow_fallback),
    )
