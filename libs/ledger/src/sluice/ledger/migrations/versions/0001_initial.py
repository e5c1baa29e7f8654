"""Initial ledger: tenants, api_keys, usage, attempts.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Spelled out table by table rather than built from the models, so this
revision keeps meaning the same thing when the models change later. Names
are wrapped in op.f(): they are final, the metadata's naming convention must
not prefix them again.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# BIGINT identity on Postgres; INTEGER PRIMARY KEY (the auto-assigned rowid)
# on SQLite. Same as sluice.ledger.schema.BigIdentity.
_BIG_IDENTITY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIMESTAMPTZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", _BIG_IDENTITY, sa.Identity(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("is_admin", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at", _TIMESTAMPTZ, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
        sa.UniqueConstraint("name", name=op.f("uq_tenants_name")),
    )
    op.create_table(
        "api_keys",
        sa.Column("key_hash", sa.Text(), nullable=False),
        sa.Column("key_prefix", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.Column("tokens_per_minute", sa.Integer(), nullable=True),
        sa.Column("requests_per_minute", sa.Integer(), nullable=True),
        sa.Column("max_concurrency", sa.Integer(), nullable=True),
        sa.Column("created_at", _TIMESTAMPTZ, server_default=sa.func.now(), nullable=False),
        sa.Column("revoked_at", _TIMESTAMPTZ, nullable=True),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"],
                                name=op.f("fk_api_keys_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("key_hash", name=op.f("pk_api_keys")),
    )
    op.create_index(op.f("ix_api_keys_tenant_id"), "api_keys", ["tenant_id"])
    op.create_table(
        "usage",
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("model_version", sa.Text(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.Text(), nullable=False),
        sa.Column("finished_at", _TIMESTAMPTZ, nullable=False),
        sa.CheckConstraint("finish_reason IN ('stop', 'length')",
                           name=op.f("ck_usage_finish_reason")),
        sa.CheckConstraint(
            "prompt_tokens >= 0 AND cached_tokens >= 0 AND output_tokens >= 0"
            " AND cached_tokens <= prompt_tokens",
            name=op.f("ck_usage_token_counts")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"],
                                name=op.f("fk_usage_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("tenant_id", "request_id", name=op.f("pk_usage")),
    )
    op.create_index(op.f("ix_usage_finished_at"), "usage", ["finished_at"])
    op.create_index(op.f("ix_usage_tenant_id_finished_at"), "usage", ["tenant_id", "finished_at"])
    op.create_table(
        "attempts",
        sa.Column("id", _BIG_IDENTITY, sa.Identity(), nullable=False),
        sa.Column("attempt_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.BigInteger(), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("model_version", sa.Text(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("at", _TIMESTAMPTZ, nullable=False),
        sa.CheckConstraint("outcome IN ('cancelled', 'error')", name=op.f("ck_attempts_outcome")),
        sa.CheckConstraint("prompt_tokens >= 0 AND output_tokens >= 0",
                           name=op.f("ck_attempts_token_counts")),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"],
                                name=op.f("fk_attempts_tenant_id_tenants")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("attempt_id", name=op.f("uq_attempts_attempt_id")),
    )
    op.create_index(op.f("ix_attempts_tenant_id"), "attempts", ["tenant_id"])
    op.create_index(op.f("ix_attempts_at"), "attempts", ["at"])


def downgrade() -> None:
    op.drop_table("attempts")
    op.drop_table("usage")
    op.drop_table("api_keys")
    op.drop_table("tenants")
