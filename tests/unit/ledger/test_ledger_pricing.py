"""Prices validate at construction; cost_of is exact arithmetic on them."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sluice.ledger.pricing import Price, cost_of, from_micros, money_text, to_micros

D = Decimal


def make_price(**overrides: object) -> Price:
    fields: dict[str, object] = dict(model_version="v1", input_per_mtok=D("0.15"),
                                     cached_input_per_mtok=D("0.075"), output_per_mtok=D("0.60"),
                                     batch_discount=D("0.5"))
    return Price(**{**fields, **overrides})  # type: ignore[arg-type]


def test_uncached_prompt_cached_and_output_tokens_each_at_their_rate():
    # 600 uncached x 0.15 + 400 cached x 0.075 + 2000 output x 0.60, per million.
    cost = cost_of(make_price(), prompt_tokens=1000, cached_tokens=400, output_tokens=2000,
                   service_class="interactive")
    assert cost == D("0.00132")


def test_cached_tokens_are_not_billed_again_at_the_input_rate():
    everything_cached = cost_of(make_price(), 1000, 1000, 0, "interactive")
    nothing_cached = cost_of(make_price(), 1000, 0, 0, "interactive")
    assert (everything_cached, nothing_cached) == (D("0.000075"), D("0.00015"))


def test_batch_takes_the_discount_and_interactive_does_not():
    price = make_price(batch_discount=D("0.25"))
    interactive = cost_of(price, 1_000_000, 0, 1_000_000, "interactive")
    batch = cost_of(price, 1_000_000, 0, 1_000_000, "batch")
    assert (interactive, batch) == (D("0.75"), D("0.5625"))


def test_no_discount_means_batch_costs_the_same():
    price = make_price(batch_discount=D(0))
    assert cost_of(price, 10, 3, 7, "batch") == cost_of(price, 10, 3, 7, "interactive")


def test_large_counts_stay_exact_where_floats_drift():
    # About a trillion tokens at six-decimal prices. Expected, in integers:
    # 987654321987 * 123457 + 123456789123 * 1000001 = 245389752209338182
    # millionths of a unit per million tokens (floats give 245389.75220933816).
    price = make_price(input_per_mtok=D("0.123457"), output_per_mtok=D("1.000001"))
    cost = cost_of(price, prompt_tokens=987_654_321_987, cached_tokens=0,
                   output_tokens=123_456_789_123, service_class="interactive")
    assert cost == D("245389.752209338182")


def test_cost_of_summed_counts_is_the_sum_of_per_request_costs():
    # What lets a summary price a whole SQL group at once.
    price = make_price()
    requests = [(17, 5, 3, "batch"), (1000, 999, 1, "batch"), (7, 0, 0, "batch")]
    one_by_one = sum(cost_of(price, p, c, o, k) for p, c, o, k in requests)
    summed = cost_of(price, sum(r[0] for r in requests), sum(r[1] for r in requests),
                     sum(r[2] for r in requests), "batch")
    assert summed == one_by_one


def test_a_free_model_costs_zero():
    price = make_price(input_per_mtok=D(0), cached_input_per_mtok=D(0), output_per_mtok=D(0))
    assert cost_of(price, 10, 2, 10, "interactive") == 0


@pytest.mark.parametrize("overrides", [
    {"input_per_mtok": 0.15},              # a float: already inexact
    {"input_per_mtok": D("-0.01")},
    {"output_per_mtok": D("0.0000001")},   # seven decimals: the table holds six
    {"output_per_mtok": D("NaN")},
    {"cached_input_per_mtok": D("Infinity")},
    {"batch_discount": D("1.5")},
    {"batch_discount": D("-0.1")},
    {"currency": "usd"},
    {"currency": "US"},
    {"model_version": ""},
])
def test_bad_prices_are_refused(overrides):
    with pytest.raises(ValueError):
        make_price(**overrides)


@pytest.mark.parametrize(("counts", "service_class"), [
    ((10, 11, 0), "interactive"),  # more cached than prompt
    ((-1, 0, 0), "interactive"),
    ((10, 0, 0), "flex"),
])
def test_bad_counts_are_refused(counts, service_class):
    with pytest.raises(ValueError):
        cost_of(make_price(), *counts, service_class)


@pytest.mark.parametrize("value", [D("0"), D("0.15"), D("123456.000001"), D("1")])
def test_micros_round_trip_exactly(value):
    assert from_micros(to_micros(value)) == value


@pytest.mark.parametrize(("amount", "text"), [
    (D("0.001320"), "0.00132"), (D("1.2300E+1"), "12.3"), (D("100"), "100"), (D("0E-18"), "0"),
])
def test_money_text_is_plain_and_exact(amount, text):
    assert money_text(amount) == text
