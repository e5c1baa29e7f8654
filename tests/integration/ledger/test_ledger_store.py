"""LedgerStore against real SQLite and Postgres: idempotent billing,
attempts kept apart, summaries by model, day and tenant."""

from __future__ import annotations

import threading
from datetime import date, datetime, timedelta, timezone

import pytest
from ledger_factories import T0, make_attempt, make_usage
from sqlalchemy import func, select

from sluice.ledger.schema import Attempt, Tenant, Usage
from sluice.ledger.store import LedgerStore

START = datetime(2025, 1, 1, tzinfo=timezone.utc)
END = datetime(2026, 1, 1, tzinfo=timezone.utc)


def count(store: LedgerStore, model: type) -> int:
    with store.engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(model)).scalar_one()


def test_usage_is_inserted_once_per_tenant_and_request(ledger_store):
    assert ledger_store.write_usage([make_usage("r1"), make_usage("r2")]) == 2
    # A retry of a finished stream, even with different counts, bills nothing new.
    assert ledger_store.write_usage([make_usage("r1", output_tokens=999)]) == 0
    # The same request id under another tenant is another bill.
    assert ledger_store.write_usage([make_usage("r1", tenant="globex")]) == 1
    assert count(ledger_store, Usage) == 3
    [total] = ledger_store.usage_summary("acme", START, END, group_by=None)
    assert (total.requests, total.output_tokens) == (2, 40)


def test_duplicates_inside_one_batch_are_billed_once(ledger_store):
    assert ledger_store.write_usage([make_usage("r1"), make_usage("r1")]) == 1
    assert count(ledger_store, Usage) == 1


def test_eight_concurrent_writers_of_one_request_leave_one_row(ledger_store):
    barrier = threading.Barrier(8)
    inserted: list[int] = []
    errors: list[BaseException] = []

    def write() -> None:
        try:
            barrier.wait()
            inserted.append(ledger_store.write_usage([make_usage("same-key", tenant="fresh")]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(inserted) == [0] * 7 + [1]
    assert count(ledger_store, Usage) == 1
    assert count(ledger_store, Tenant) == 1


def test_attempts_are_recorded_apart_and_never_billed(ledger_store):
    ledger_store.write_attempts([make_attempt("r1", outcome="cancelled"),
                                 make_attempt("r1", outcome="cancelled"),
                                 make_attempt("r2", outcome="error", output_tokens=0)])
    ledger_store.write_usage([make_usage("r1")])  # the retry that finished

    [billed] = ledger_store.usage_summary("acme", START, END)
    assert (billed.requests, billed.prompt_tokens, billed.output_tokens) == (1, 10, 20)
    waste = {row.outcome: row for row in ledger_store.attempt_summary("acme", START, END)}
    assert waste["cancelled"].attempts == 2 and waste["cancelled"].output_tokens == 6
    assert waste["error"].attempts == 1
    assert count(ledger_store, Attempt) == 3


def test_an_attempt_written_twice_is_counted_once(ledger_store):
    attempt = make_attempt("r1")
    assert ledger_store.write_attempts([attempt]) == 1
    assert ledger_store.write_attempts([attempt]) == 0
    assert count(ledger_store, Attempt) == 1


def test_summary_by_model(ledger_store):
    ledger_store.write_usage([
        make_usage("a", model="alpha", prompt_tokens=5, cached_tokens=1, output_tokens=7),
        make_usage("b", model="alpha", prompt_tokens=6, cached_tokens=2, output_tokens=8),
        make_usage("c", model="beta", prompt_tokens=9, cached_tokens=0, output_tokens=1),
        make_usage("d", model="beta", tenant="globex"),
    ])
    rows = ledger_store.usage_summary("acme", START, END, group_by="model")
    assert [(r.model, r.requests, r.prompt_tokens, r.cached_tokens, r.output_tokens, r.tenant)
            for r in rows] == [("alpha", 2, 11, 3, 15, "acme"), ("beta", 1, 9, 0, 1, "acme")]


def test_summary_by_day_uses_utc_days_and_a_half_open_range(ledger_store):
    new_york = timezone(timedelta(hours=-5))
    ledger_store.write_usage([
        make_usage("a", finished_at=datetime(2025, 3, 1, 0, 0, tzinfo=timezone.utc)),
        make_usage("b", finished_at=datetime(2025, 3, 1, 23, 59, 59, tzinfo=timezone.utc)),
        # 20:30 in New York on Mar 1 is 01:30 UTC on Mar 2.
        make_usage("c", finished_at=datetime(2025, 3, 1, 20, 30, tzinfo=new_york)),
        make_usage("d", finished_at=datetime(2025, 3, 3, 0, 0, tzinfo=timezone.utc)),
    ])
    rows = ledger_store.usage_summary(
        "acme", datetime(2025, 3, 1, tzinfo=timezone.utc), datetime(2025, 3, 3, tzinfo=timezone.utc),
        group_by="day")
    assert [(r.day, r.requests) for r in rows] == [(date(2025, 3, 1), 2), (date(2025, 3, 2), 1)]


def test_summary_for_all_tenants_and_by_tenant(ledger_store):
    ledger_store.write_usage([make_usage("a"), make_usage("b", tenant="globex"),
                              make_usage("c", tenant="globex")])
    [total] = ledger_store.usage_summary(None, START, END)
    assert (total.tenant, total.requests, total.output_tokens) == (None, 3, 60)
    by_tenant = ledger_store.usage_summary(None, START, END, group_by="tenant")
    assert [(r.tenant, r.requests) for r in by_tenant] == [("acme", 1), ("globex", 2)]


def test_summary_of_nothing_is_one_row_of_zeros(ledger_store):
    [row] = ledger_store.usage_summary("nobody", START, END)
    assert (row.requests, row.prompt_tokens, row.cached_tokens, row.output_tokens) == (0, 0, 0, 0)
    assert ledger_store.usage_summary("nobody", START, END, group_by="model") == []


def test_timestamps_come_back_as_aware_utc(ledger_store):
    ledger_store.write_usage([make_usage("a", finished_at=T0.astimezone(timezone(timedelta(hours=9))))])
    with ledger_store.engine.connect() as connection:
        finished_at = connection.execute(select(Usage.finished_at)).scalar_one()
    assert finished_at == T0 and finished_at.utcoffset() == timedelta(0)


def test_ensure_tenant_is_stable_and_promotes_to_admin(ledger_store):
    first = ledger_store.ensure_tenant("acme")
    assert ledger_store.ensure_tenant("acme") == first
    assert ledger_store.ensure_tenant("acme", is_admin=True) == first
    assert ledger_store.ensure_tenant("acme") == first  # never demotes
    with ledger_store.engine.connect() as connection:
        assert connection.execute(select(Tenant.is_admin).where(Tenant.id == first)).scalar_one()
    assert ledger_store.ensure_tenant("globex") != first


def test_naive_range_is_rejected(ledger_store):
    with pytest.raises(ValueError, match="timezone-aware"):
        ledger_store.usage_summary("acme", datetime(2025, 1, 1), END)
