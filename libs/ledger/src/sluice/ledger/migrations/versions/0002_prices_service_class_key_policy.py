"""Prices per model version; the service class of usage and attempts; key
overload policy (priority, degradable, allow_fallback).

Revision ID: 0002
Revises: 0001
Create Date: 2025-03-01

Existing rows take the server defaults: every usage row written before
this revision was interactive (there was no other class to bill), and every
existing key is a normal-priority key with no overload concessions.

On SQLite, adding a CHECK constraint rebuilds the table (batch mode); the
rebuilt table keeps 0001's constraints and indexes because the batch copies
them from the reflected table. On Postgres each step is a plain ALTER.
Spelled out rather than built from the models, as 0001 is.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TIMESTAMPTZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "prices",
        sa.Column("model_version", sa.Text(), nullable=False),
        sa.Column("input_micros_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_micros_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("output_micros_per_mtok", sa.BigInteger(), nullable=False),
        sa.Column("batch_discount_ppm", sa.Integer(), server_default="0", nullable=False),
        sa.Column("currency", sa.Text(), server_default="USD", nullable=False),
        sa.Column("updated_at", _TIMESTAMPTZ, server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint(
            "input_micros_per_mtok >= 0 AND cached_input_micros_per_mtok >= 0"
            " AND output_micros_per_mtok >= 0",
            name=op.f("ck_prices_non_negative")),
        sa.CheckConstraint("batch_discount_ppm >= 0 AND batch_discount_ppm <= 1000000",
                           name=op.f("ck_prices_batch_discount")),
        sa.CheckConstraint("length(currency) = 3", name=op.f("ck_prices_currency")),
        sa.PrimaryKeyConstraint("model_version", name=op.f("pk_prices")),
    )
    for table in ("usage", "attempts"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("service_class", sa.Text(), server_default="interactive",
                                       nullable=False))
            batch.create_check_constraint(
                op.f(f"ck_{table}_service_class"), "service_class IN ('interactive', 'batch')")
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("priority", sa.Text(), server_default="normal", nullable=False))
        batch.add_column(sa.Column("degradable", sa.Boolean(), server_default=sa.false(),
                                   nullable=False))
        batch.add_column(sa.Column("allow_fallback", sa.Boolean(), server_default=sa.false(),
                                   nullable=False))
        batch.create_check_constraint(
            op.f("ck_api_keys_priority"), "priority IN ('normal', 'critical')")


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_constraint(op.f("ck_api_keys_priority"), type_="check")
        batch.drop_column("allow_fallback")
        batch.drop_column("degradable")
        batch.drop_column("priority")
    for table in ("attempts", "usage"):
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(op.f(f"ck_{table}_service_class"), type_="check")
            batch.drop_column("service_class")
    op.drop_table("prices")
