"""LedgerStore: the only code that writes or reads billing rows.

Synchronous on purpose: the gateway calls it from worker threads (and in
practice only through the outbox flusher), so a slow database never stalls
the event loop that streams tokens.

Both writes are idempotent inserts, so any write may be retried after any
failure, including one whose commit acknowledgement was lost:
    usage     ON CONFLICT (tenant_id, request_id) DO NOTHING  -> billed once
    attempts  ON CONFLICT (attempt_id) DO NOTHING             -> counted once
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from typing import Any, Literal

from sqlalchemy import Date, Engine, Select, and_, cast, func, select, update
from sqlalchemy.dialects import postgresql, sqlite

from sluice.ledger.database import create_ledger_engine
from sluice.ledger.records import AttemptRecord, AttemptRow, UsageRecord, UsageRow
from sluice.ledger.schema import Attempt, Tenant, Usage

GroupBy = Literal["model", "day", "tenant"]


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

    # -- reads -----------------------------------------------------------------

    def usage_summary(
        self,
        tenant: str | None,
        start: datetime,
        end: datetime,
        group_by: GroupBy | None = None,
    ) -> list[UsageRow]:
        """Billed requests and token sums with start <= finished_at < end.

        `tenant=None` covers every tenant (an admin view). Day buckets are UTC
        calendar days. Groups come back sorted by their key; with no grouping
        there is exactly one row, zeros when nothing matched.
        """
        for name, value in (("start", start), ("end", end)):
            if value.tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware")
        columns: list[Any] = []
        if group_by == "model":
            columns = [Usage.model.label("key")]
        elif group_by == "day":
            columns = [self._utc_day(Usage.finished_at).label("key")]
        elif group_by == "tenant":
            columns = [Tenant.name.label("key")]
        elif group_by is not None:
            raise ValueError(f"group_by must be 'model', 'day', 'tenant' or None, got {group_by!r}")

        query: Select[Any] = select(
            *columns,
            func.count().label("requests"),
            func.coalesce(func.sum(Usage.prompt_tokens), 0).label("prompt_tokens"),
            func.coalesce(func.sum(Usage.cached_tokens), 0).label("cached_tokens"),
            func.coalesce(func.sum(Usage.output_tokens), 0).label("output_tokens"),
        ).select_from(Usage).join(Tenant, Tenant.id == Usage.tenant_id).where(
            and_(Usage.finished_at >= start, Usage.finished_at < end))
        if tenant is not None:
            query = query.where(Tenant.name == tenant)
        if columns:
            query = query.group_by(columns[0]).order_by(columns[0])

        with self.engine.connect() as connection:
            result = connection.execute(query).all()
        return [self._usage_row(row, tenant, group_by) for row in result]

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

    @staticmethod
    def _usage_row(row: Any, tenant: str | None, group_by: GroupBy | None) -> UsageRow:
        key = row.key if group_by is not None else None
        day = None
        if group_by == "day":
            day = key if isinstance(key, date) else date.fromisoformat(key)
        return UsageRow(
            tenant=key if group_by == "tenant" else tenant,
            model=key if group_by == "model" else None,
            day=day,
            requests=int(row.requests),
            prompt_tokens=int(row.prompt_tokens),
            cached_tokens=int(row.cached_tokens),
            output_tokens=int(row.output_tokens),
        )
