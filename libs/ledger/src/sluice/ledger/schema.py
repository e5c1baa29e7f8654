"""The ledger tables, as SQLAlchemy 2 typed declarative models.

Migrations (sluice/ledger/migrations) create these tables; the models are
what the store queries with. tests/unit/ledger/test_ledger_schema.py checks
that the migrated database and these models agree, so a model change without
a revision fails there.

    tenants   1 ──< api_keys    key_hash = sha256 hex of the key, never the key
              1 ──< usage       PK (tenant_id, request_id): billed at most once
              1 ──< attempts    unbilled, many per request; attempt_id unique

No table holds prompt or output text.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    Text,
    TypeDecorator,
    false,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Deterministic constraint names on both dialects, so later revisions can
# drop or alter a constraint by name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# BIGINT identity on Postgres. SQLite only auto-assigns ids to a column
# declared exactly INTEGER PRIMARY KEY (the rowid alias), so it gets INTEGER,
# which is 64-bit there anyway.
BigIdentity = BigInteger().with_variant(Integer(), "sqlite")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class UtcDateTime(TypeDecorator[datetime]):
    """TIMESTAMP WITH TIME ZONE that always hands back aware UTC datetimes.

    Postgres stores the instant. SQLite has no time zone type: values are
    converted to UTC before they are written (so stored text sorts and
    buckets by UTC day) and marked UTC when read back.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the ledger stores instants, pass tzinfo")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(BigIdentity, Identity(), primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(
        UtcDateTime, default=utc_now, server_default=func.now())


class ApiKey(Base):
    __tablename__ = "api_keys"

    key_hash: Mapped[str] = mapped_column(Text, primary_key=True)
    # The first characters of the key, so a human can tell keys apart in a
    # listing; too short to help guess the rest.
    key_prefix: Mapped[str] = mapped_column(Text)
    tenant_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("tenants.id"), index=True)
    # None means "no per-key limit" (the gateway's defaults apply).
    tokens_per_minute: Mapped[int | None] = mapped_column(Integer)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer)
    max_concurrency: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(
        UtcDateTime, default=utc_now, server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class Usage(Base):
    __tablename__ = "usage"
    __table_args__ = (
        CheckConstraint("finish_reason IN ('stop', 'length')", name="finish_reason"),
        CheckConstraint(
            "prompt_tokens >= 0 AND cached_tokens >= 0 AND output_tokens >= 0"
            " AND cached_tokens <= prompt_tokens",
            name="token_counts"),
        # A tenant's bill for a period; the PK already serves per-request lookups.
        Index("ix_usage_tenant_id_finished_at", "tenant_id", "finished_at"),
    )

    tenant_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("tenants.id"), primary_key=True)
    request_id: Mapped[str] = mapped_column(Text, primary_key=True)
    model: Mapped[str] = mapped_column(Text)
    model_version: Mapped[str] = mapped_column(Text)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    cached_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    finish_reason: Mapped[str] = mapped_column(Text)
    finished_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (
        CheckConstraint("outcome IN ('cancelled', 'error')", name="outcome"),
        CheckConstraint("prompt_tokens >= 0 AND output_tokens >= 0", name="token_counts"),
    )

    id: Mapped[int] = mapped_column(BigIdentity, Identity(), primary_key=True)
    # Made by the producer (AttemptRecord), unique so retried inserts are no-ops.
    attempt_id: Mapped[str] = mapped_column(Text, unique=True)
    tenant_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("tenants.id"), index=True)
    request_id: Mapped[str] = mapped_column(Text)
    model: Mapped[str] = mapped_column(Text)
    model_version: Mapped[str] = mapped_column(Text)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
