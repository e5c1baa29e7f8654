"""Prices and costed usage summaries against real SQLite and Postgres."""

from __future__ import annotations

from datetime import date, datetime, timezone
from decimal import Decimal

import pytest
from ledger_factories import make_attempt, make_usage
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from sluice.ledger.schema import Attempt, Usage

D = Decimal
START = datetime(2025, 1, 1, tzinfo=timezone.utc)
END = datetime(2026, 1, 1, tzinfo=timezone.utc)
DAY2 = datetime(2025, 3, 2, 9, 0, tzinfo=timezone.utc)


def test_set_price_inserts_then_replaces(ledger_store):
    first = ledger_store.set_price("v1", D("0.15"), D("0.075"), D("0.6"))
    assert (first.input_per_mtok, first.batch_discount, first.currency) == (D("0.15"), 0, "USD")
    assert first.updated_at is not None and first.updated_at.utcoffset().total_seconds() == 0

    second = ledger_store.set_price("v1", D("0.2"), D("0.1"), D("0.8"), batch_discount=D("0.5"))
    ledger_store.set_price("v2", D("1"), D("0.5"), D("2"))
    prices = ledger_store.prices()
    assert set(prices) == {"v1", "v2"}
    assert prices["v1"] == second
    assert (prices["v1"].input_per_mtok, prices["v1"].cached_input_per_mtok,
            prices["v1"].output_per_mtok, prices["v1"].batch_discount) == (
        D("0.2"), D("0.1"), D("0.8"), D("0.5"))
    assert second.updated_at >= first.updated_at


def test_prices_with_six_decimals_come_back_exactly(ledger_store):
    ledger_store.set_price("v1", D("123456.000001"), D("0.000001"), D("9999999.999999"),
                           batch_discount=D("0.333333"))
    price = ledger_store.prices()["v1"]
    assert (price.input_per_mtok, price.cached_input_per_mtok, price.output_per_mtok,
            price.batch_discount) == (D("123456.000001"), D("0.000001"), D("9999999.999999"),
                                      D("0.333333"))


def test_a_second_currency_is_refused(ledger_store):
    ledger_store.set_price("v1", D("1"), D("1"), D("1"), currency="USD")
    with pytest.raises(ValueError, match="one currency"):
        ledger_store.set_price("v2", D("1"), D("1"), D("1"), currency="EUR")
    # Repricing the same version is not a second currency.
    ledger_store.set_price("v1", D("2"), D("1"), D("1"), currency="USD")
    assert set(ledger_store.prices()) == {"v1"}


@pytest.mark.parametrize("bad", [
    "input_micros_per_mtok = -1", "batch_discount_ppm = 1000001", "currency = 'DOLLARS'"])
def test_the_table_refuses_what_price_would(ledger_store, bad):
    # The database's checks hold even for a writer that skips Price.
    ledger_store.set_price("v1", D("1"), D("1"), D("1"))
    with pytest.raises(IntegrityError), ledger_store.engine.begin() as connection:
        connection.execute(text(f"UPDATE prices SET {bad}"))


def test_service_class_is_written(ledger_store):
    ledger_store.write_usage([make_usage("r1", service_class="batch"), make_usage("r2")])
    ledger_store.write_attempts([make_attempt("r3")])
    with ledger_store.engine.connect() as connection:
        classes = dict(connection.execute(select(Usage.request_id, Usage.service_class)).all())
        attempt_class = connection.execute(select(Attempt.service_class)).scalar_one()
    assert classes == {"r1": "batch", "r2": "interactive"}
    assert attempt_class == "interactive"


def write_mixed_usage(ledger_store) -> None:
    """Two priced versions of one model in both classes, an unpriced model,
    another tenant, over two days."""
    ledger_store.set_price("alpha-v1", D("1"), D("0.5"), D("2"), batch_discount=D("0.5"))
    ledger_store.set_price("alpha-v2", D("3"), D("1"), D("4"))  # no batch discount
    ledger_store.write_usage([
        # alpha-v1 interactive: 600 x 1 + 400 x 0.5 + 1000 x 2 = 2800 -> 0.0028
        make_usage("a", model="alpha", model_version="alpha-v1", prompt_tokens=1000,
                   cached_tokens=400, output_tokens=1000),
        # alpha-v1 batch: 1000 x 1 + 1000 x 2 = 3000, halved -> 0.0015
        make_usage("b", model="alpha", model_version="alpha-v1", prompt_tokens=1000,
                   cached_tokens=0, output_tokens=1000, service_class="batch"),
        # alpha-v2 batch (day 2): 100 x 3 + 100 x 1 + 100 x 4 = 800 -> 0.0008
        make_usage("c", model="alpha", model_version="alpha-v2", prompt_tokens=200,
                   cached_tokens=100, output_tokens=100, service_class="batch", finished_at=DAY2),
        # beta-v1 has no price (day 2)
        make_usage("d", model="beta", model_version="beta-v1", finished_at=DAY2),
        # globex on alpha-v1, default counts: 6 x 1 + 4 x 0.5 + 20 x 2 = 48 -> 0.000048
        make_usage("e", tenant="globex", model="alpha", model_version="alpha-v1"),
    ])


def test_summary_by_model_costs_each_version_and_class_at_its_price(ledger_store):
    write_mixed_usage(ledger_store)
    alpha, beta = ledger_store.usage_summary("acme", START, END, group_by="model")
    assert (alpha.model, alpha.requests, alpha.prompt_tokens, alpha.output_tokens) == (
        "alpha", 3, 2200, 2100)
    assert (alpha.cost, alpha.currency, alpha.unpriced_versions) == (D("0.0051"), "USD", ())
    assert (beta.model, beta.requests, beta.cost, beta.currency, beta.unpriced_versions) == (
        "beta", 1, None, None, ("beta-v1",))


def test_a_total_with_an_unpriced_version_has_no_cost_and_says_why(ledger_store):
    write_mixed_usage(ledger_store)
    [total] = ledger_store.usage_summary("acme", START, END)
    assert (total.requests, total.cost, total.unpriced_versions) == (4, None, ("beta-v1",))
    [first_day] = ledger_store.usage_summary("acme", START, DAY2.replace(hour=0))
    assert (first_day.requests, first_day.cost, first_day.unpriced_versions) == (2, D("0.0043"), ())


def test_summary_by_model_and_day(ledger_store):
    write_mixed_usage(ledger_store)
    rows = ledger_store.usage_summary("acme", START, END, group_by="model_day")
    assert [(r.day, r.model, r.requests, r.cost, r.unpriced_versions) for r in rows] == [
        (date(2025, 3, 1), "alpha", 2, D("0.0043"), ()),
        (date(2025, 3, 2), "alpha", 1, D("0.0008"), ()),
        (date(2025, 3, 2), "beta", 1, None, ("beta-v1",)),
    ]
    assert all(r.tenant == "acme" for r in rows)


def test_summary_by_tenant_costs_each_tenant(ledger_store):
    write_mixed_usage(ledger_store)
    acme, globex = ledger_store.usage_summary(None, START, END, group_by="tenant")
    assert (acme.tenant, acme.cost) == ("acme", None)
    assert (globex.tenant, globex.requests, globex.cost) == ("globex", 1, D("0.000048"))


def test_repricing_changes_the_reported_cost(ledger_store):
    # Costs are at the current price: a summary is a report, not an invoice.
    ledger_store.set_price("v1", D("1"), D("1"), D("1"))
    ledger_store.write_usage([make_usage("r1", prompt_tokens=10, cached_tokens=0, output_tokens=10)])
    [before] = ledger_store.usage_summary("acme", START, END)
    ledger_store.set_price("v1", D("2"), D("2"), D("2"))
    [after] = ledger_store.usage_summary("acme", START, END)
    assert (before.cost, after.cost) == (D("0.00002"), D("0.00004"))


def test_nothing_used_costs_zero_in_the_ledger_currency(ledger_store):
    [row] = ledger_store.usage_summary("nobody", START, END)
    assert (row.requests, row.cost, row.currency, row.unpriced_versions) == (0, 0, "USD", ())
    assert ledger_store.usage_summary("nobody", START, END, group_by="model_day") == []


def test_unknown_grouping_is_refused(ledger_store):
    with pytest.raises(ValueError, match="group_by"):
        ledger_store.usage_summary("acme", START, END, group_by="version")  # type: ignore[arg-type]
