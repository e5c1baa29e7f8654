"""The ledger tables, as SQLAlchemy 2 typed declarative models.

Migrations (sluice/ledger/migrations) create these tables; the models are
what the store queries with. tests/unit/ledger/test_ledger_schema.py checks
that the migrated database and these models agree, so a model change without
a revision fails there.

    tenants   1 ──< api_keys    key_hash = sha256 hex of the key, never the key
              1 ──< usage       PK (tenant_id, request_id): billed at most once
              1 ──< attempts    unbilled, many per request; attempt_id unique
    prices                      PK model_version; read by usage summaries
                                (usage.model_version -> prices, no FK: a
                                version may be billed before it is priced)

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
    __table_args__ = (CheckConstraint("priority IN ('normal', 'critical')", name="priority"),)

    key_hash: Mapped[str] = mapped_column(Text, primary_key=True)
    # The first characters of the key, so a human can tell keys apart in a
    # listing; too short to help guess the rest.
    key_prefix: Mapped[str] = mapped_column(Text)
    tenant_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("tenants.id"), index=True)
    # None means "no per-key limit" (the gateway's defaults apply).
    tokens_per_minute: Mapped[int | None] = mapped_column(Integer)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer)
    max_concurrency: Mapped[int | None] = mapped_column(Integer)
    # Overload policy, read by the gateway's auth and overload control:
    # 'critical' keys are shed last; `degradable` lets overload control cap
    # the key's output; `allow_fallback` lets it serve the key's requests
    # from a smaller fallback model version.
    priority: Mapped[str] = mapped_column(Text, default="normal", server_default="normal")
    degradable: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    allow_fallback: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(
        UtcDateTime, default=utc_now, server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class Usage(Base):
    __tablename__ = "usage"
    __table_args__ = (
        CheckConstraint("finish_reason IN ('stop', 'length')", name="finish_reason"),
        CheckConstraint("service_class IN ('interactive', 'batch')", name="service_class"),
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
    # Rows from before revision 0002 are interactive: batch did not exist.
    service_class: Mapped[str] = mapped_column(Text, default="interactive", server_default="interactive")
    finished_at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (
        CheckConstraint("outcome IN ('cancelled', 'error')", name="outcome"),
        CheckConstraint("service_class IN ('interactive', 'batch')", name="service_class"),
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
    service_class: Mapped[str] = mapped_column(Text, default="interactive", server_default="interactive")
    at: Mapped[datetime] = mapped_column(UtcDateTime, index=True)


class Price(Base):
    """What one model version costs, in integer millionths of `currency`
    per million tokens (see sluice.ledger.pricing for why integers)."""

    __tablename__ = "prices"
    __table_args__ = (
        CheckConstraint(
            "input_micros_per_mtok >= 0 AND cached_input_micros_per_mtok >= 0"
            " AND output_micros_per_mtok >= 0",
            name="non_negative"),
        CheckConstraint("batch_discount_ppm >= 0 AND batch_discount_ppm <= 1000000",
                        name="batch_discount"),
        CheckConstraint("length(currency) = 3", name="currency"),
    )

    model_version: Mapped[str] = mapped_column(Text, primary_key=True)
    input_micros_per_mtok: Mapped[int] = mapped_column(BigInteger)
    cached_input_micros_per_mtok: Mapped[int] = mapped_column(BigInteger)
    output_micros_per_mtok: Mapped[int] = mapped_column(BigInteger)
    # The fraction taken off a batch request's cost, in millionths:
    # 500000 = batch costs half.
    batch_discount_ppm: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    currency: Mapped[str] = mapped_column(Text, default="USD", server_default="USD")
    updated_at: Mapped[datetime] = mapped_column(
        UtcDateTime, default=utc_now, server_default=func.now())
