"""LedgerStore: the only code that writes or reads billing rows and prices.

Synchronous on purpose: the gateway calls it from worker threads (and in
practice only through the outbox flusher), so a slow database never stalls
the event loop that streams tokens.

Both usage writes are idempotent inserts, so any write may be retried after
any failure, including one whose commit acknowledgement was lost:
    usage     ON CONFLICT (tenant_id, request_id) DO NOTHING  -> billed once
    attempts  ON CONFLICT (attempt_id) DO NOTHING             -> counted once
A price is an upsert on model_version (ON CONFLICT DO UPDATE): the latest
`set_price` wins, and usage summaries price every row at the current price.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, Date, Engine, Select, and_, cast, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from sluice.ledger.database import create_ledger_engine
from sluice.ledger.pricing import DEFAULT_CURRENCY, Price, from_micros, to_micros
from sluice.ledger.records import AttemptRecord, AttemptRow, UsageRecord, UsageRow
from sluice.ledger.schema import Attempt, Tenant, Usage, utc_now
from sluice.ledger.schema import Price as PriceRow
from sluice.ledger.summary import GROUPINGS, GroupBy, UsagePart, fold_usage

class LedgerStore:
    """Owns one SQLAlchemy engine (and its pool). Thread-safe."""

    def __init__(self, url: str) -> None:
        self.engine: Engine = create_ledger_engine(url)
        self._dialect = self.engine.dialect.name
        if self._dialect not in ("postgresql", "sqlite"):
            raise ValueError(f"unsupported database dialect {self._dialect!r} (postgresql or sqlite)")
        # Tenants are never deleted or renamed, so a name->id entry stays true
        # for the life of the process; guarded by _tenant_lock.
        self._tenant_ids: dict[str, int] = {}
        self._tenant_lock = threading.Lock()

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> LedgerStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- tenants ---------------------------------------------------------------

    def ensure_tenant(self, name: str, is_admin: bool = False) -> int:
        """The tenant's id, creating the tenant if new. `is_admin=True`
        promotes an existing tenant; `False` never demotes one."""
        if not name:
            raise ValueError("tenant name must be non-empty")
        with self._tenant_lock:
            cached = self._tenant_ids.get(name)
        if cached is not None and not is_admin:
            return cached
        with self.engine.begin() as connection:
            connection.execute(
                self._insert(Tenant).values(name=name, is_admin=is_admin)
                .on_conflict_do_nothing(index_elements=[Tenant.name]))
            if is_admin:
                connection.execute(update(Tenant).where(Tenant.name == name).values(is_admin=True))
            tenant_id = connection.execute(select(Tenant.id).where(Tenant.name == name)).scalar_one()
        with self._tenant_lock:
            self._tenant_ids[name] = tenant_id
        return tenant_id

    def _tenant_ids_for(self, names: Iterable[str]) -> dict[str, int]:
        return {name: self.ensure_tenant(name) for name in set(names)}

    # -- writes ----------------------------------------------------------------

    def write_usage(self, records: Sequence[UsageRecord]) -> int:
        """Insert billing rows; returns how many were new (duplicates of an
        existing (tenant, request_id) are skipped, never updated)."""
        if not records:
            return 0
        tenant_ids = self._tenant_ids_for(r.tenant for r in records)
        rows = [
            {
                "tenant_id": tenant_ids[r.tenant],
                "request_id": r.request_id,
                "model": r.model,
                "model_version": r.model_version,
                "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens,
                "output_tokens": r.output_tokens,
                "finish_reason": r.finish_reason,
                "service_class": r.service_class,
                "finished_at": r.finished_at,
            }
            for r in records
        ]
        statement = self._insert(Usage).on_conflict_do_nothing(
            index_elements=[Usage.tenant_id, Usage.request_id])
        return self._insert_counting(statement, Usage.request_id, rows)

    def write_attempts(self, records: Sequence[AttemptRecord]) -> int:
        """Insert unbilled attempts; returns how many were new."""
        if not records:
            return 0
        tenant_ids = self._tenant_ids_for(r.tenant for r in records)
        rows = [
            {
                "attempt_id": r.attempt_id,
                "tenant_id": tenant_ids[r.tenant],
                "request_id": r.request_id,
                "model": r.model,
                "model_version": r.model_version,
                "prompt_tokens": r.prompt_tokens,
                "output_tokens": r.output_tokens,
                "outcome": r.outcome,
                "service_class": r.service_class,
                "at": r.at,
            }
            for r in records
        ]
        statement = self._insert(Attempt).on_conflict_do_nothing(index_elements=[Attempt.attempt_id])
        return self._insert_counting(statement, Attempt.attempt_id, rows)

    def _insert(self, model: type) -> Any:
        # ON CONFLICT is dialect syntax; both dialects spell it the same way
        # in SQLAlchemy, but each needs its own insert construct.
        if self._dialect == "postgresql":
            return postgresql.insert(model)
        return sqlite.insert(model)

    def _insert_counting(self, statement: Any, key: Any, rows: list[dict[str, Any]]) -> int:
        # RETURNING yields a row for each row actually inserted (none for a
        # conflict), on both dialects; SQLAlchemy sends the batch as multi-row
        # VALUES ("insertmanyvalues"). Plain rowcount is not reliable for
        # INSERT executemany on either driver.
        with self.engine.begin() as connection:
            result = connection.execute(statement.returning(key), rows)
            return len(result.all())

    # -- prices ----------------------------------------------------------------

    def set_price(
        self,
        model_version: str,
        input_per_mtok: Decimal,
        cached_input_per_mtok: Decimal,
        output_per_mtok: Decimal,
        batch_discount: Decimal = Decimal(0),
        currency: str = DEFAULT_CURRENCY,
    ) -> Price:
        """Create or replace `model_version`'s price; returns it as stored.

        The ledger bills in one currency (a summary adds costs across
        versions), so a price in a currency other than the other versions'
        is refused. Two operators setting different currencies at the same
        instant could both pass the check; prices are set by hand, rarely.
        """
        price = Price(model_version, input_per_mtok, cached_input_per_mtok, output_per_mtok,
                      batch_discount, currency)
        values = {
            "input_micros_per_mtok": to_micros(price.input_per_mtok),
            "cached_input_micros_per_mtok": to_micros(price.cached_input_per_mtok),
            "output_micros_per_mtok": to_micros(price.output_per_mtok),
            "batch_discount_ppm": to_micros(price.batch_discount),
            "currency": price.currency,
            "updated_at": utc_now(),
        }
        statement = self._insert(PriceRow).values(model_version=model_version, **values)
        statement = statement.on_conflict_do_update(index_elements=[PriceRow.model_version], set_=values)
        with self.engine.begin() as connection:
            others = connection.execute(
                select(PriceRow.currency).where(PriceRow.model_version != model_version,
                                                PriceRow.currency != price.currency).limit(1)
            ).scalar_one_or_none()
            if others is not None:
                raise ValueError(f"other versions are priced in {others}; the ledger bills in one currency")
            connection.execute(statement)
            return self._read_prices(connection)[model_version]

    def prices(self) -> dict[str, Price]:
        """Every price, by model version."""
        with self.engine.connect() as connection:
            return self._read_prices(connection)

    @staticmethod
    def _read_prices(connection: Connection) -> dict[str, Price]:
        # Core rows (a Connection has no ORM identity map): one named tuple per price.
        rows = connection.execute(select(PriceRow.__table__).order_by(PriceRow.model_version)).all()
        return {
            row.model_version: Price(
                model_version=row.model_version,
                input_per_mtok=from_micros(row.input_micros_per_mtok),
                cached_input_per_mtok=from_micros(row.cached_input_micros_per_mtok),
                output_per_mtok=from_micros(row.output_micros_per_mtok),
                batch_discount=from_micros(row.batch_discount_ppm),
                currency=row.currency,
                updated_at=row.updated_at,
            )
            for row in rows
        }

    # -- reads -----------------------------------------------------------------

    def usage_summary(
        self,
        tenant: str | None,
        start: datetime,
        end: datetime,
        group_by: GroupBy | None = None,
    ) -> list[UsageRow]:
        """Billed requests, token sums and cost with start <= finished_at < end.

        `tenant=None` covers every tenant (an admin view). Day buckets are UTC
        calendar days; `model_day` gives one row per (day, model), sorted by
        day then model. Groups come back sorted by their key; with no
        grouping there is exactly one row, zeros when nothing matched. Cost
        is at the current price of each row's model version and class (see
        sluice.ledger.summary); None where a version has no price.
        """
        for name, value in (("start", start), ("end", end)):
            if value.tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware")
        if group_by is not None and group_by not in GROUPINGS:
            raise ValueError(f"group_by must be one of {GROUPINGS} or None, got {group_by!r}")
        keys = self._group_columns(group_by)
        query: Select[Any] = select(
            *keys,
            Usage.model_version,
            Usage.service_class,
            func.count().label("requests"),
            func.sum(Usage.prompt_tokens).label("prompt_tokens"),
            func.sum(Usage.cached_tokens).label("cached_tokens"),
            func.sum(Usage.output_tokens).label("output_tokens"),
        ).select_from(Usage).join(Tenant, Tenant.id == Usage.tenant_id).where(
            and_(Usage.finished_at >= start, Usage.finished_at < end))
        if tenant is not None:
            query = query.where(Tenant.name == tenant)
        query = query.group_by(*keys, Usage.model_version, Usage.service_class)

        # One connection, one read of each: the prices that cost the rows are
        # the ones in the table while the rows were read.
        with self.engine.connect() as connection:
            result = connection.execute(query).all()
            prices = self._read_prices(connection)
        parts = [
            UsagePart(
                key=tuple(self._key_value(row[i], group_by, i) for i in range(len(keys))),
                model_version=row.model_version,
                service_class=row.service_class,
                requests=int(row.requests),
                prompt_tokens=int(row.prompt_tokens),
                cached_tokens=int(row.cached_tokens),
                output_tokens=int(row.output_tokens),
            )
            for row in result
        ]
        return fold_usage(parts, prices, tenant, group_by)

    def _group_columns(self, group_by: GroupBy | None) -> list[Any]:
        # In the order of summary.GroupKey.
        day = self._utc_day(Usage.finished_at).label("day")
        return {
            None: [],
            "model": [Usage.model.label("model")],
            "day": [day],
            "tenant": [Tenant.name.label("tenant")],
            "model_day": [day, Usage.model.label("model")],
        }[group_by]

    @staticmethod
    def _key_value(value: Any, group_by: GroupBy | None, position: int) -> Any:
        # SQLite hands a day back as "YYYY-MM-DD" text, Postgres as a date.
        is_day = group_by == "day" or (group_by == "model_day" and position == 0)
        if is_day and not isinstance(value, date):
            return date.fromisoformat(value)
        return value

    def attempt_summary(self, tenant: str | None, start: datetime, end: datetime) -> list[AttemptRow]:
        """Unbilled attempts with start <= at < end, one row per outcome."""
        query = (
            select(Attempt.outcome, func.count(), func.sum(Attempt.prompt_tokens),
                   func.sum(Attempt.output_tokens))
            .select_from(Attempt).join(Tenant, Tenant.id == Attempt.tenant_id)
            .where(and_(Attempt.at >= start, Attempt.at < end))
            .group_by(Attempt.outcome).order_by(Attempt.outcome)
        )
        if tenant is not None:
            query = query.where(Tenant.name == tenant)
        with self.engine.connect() as connection:
            result = connection.execute(query).all()
        return [AttemptRow(outcome=row[0], attempts=int(row[1]), prompt_tokens=int(row[2]),
                           output_tokens=int(row[3])) for row in result]

    def _utc_day(self, column: Any) -> Any:
        if self._dialect == "postgresql":
            # timestamptz -> wall clock in UTC -> date, independent of the
            # session's TimeZone setting.
            return cast(func.timezone("UTC", column), Date)
        # SQLite stores UTC text ("YYYY-MM-DD HH:MM:SS..."); date() keeps the day.
        return func.date(column)
