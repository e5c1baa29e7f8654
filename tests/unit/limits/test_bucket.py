"""Token-bucket arithmetic (sluice.limits.bucket): pure, clock passed in."""

from __future__ import annotations

import math

import pytest

from sluice.limits.bucket import (
    BucketState,
    credit,
    estimate_tokens,
    full_bucket,
    idle_expiry_s,
    refill,
    try_take,
)

LIMIT = 600  # tokens per minute = 10 per second


def test_refill_adds_limit_over_60_per_second_up_to_the_limit():
    empty = BucketState(tokens=0.0, updated_at_s=100.0)
    assert refill(empty, LIMIT, 101.5) == BucketState(15.0, 101.5)
    assert refill(empty, LIMIT, 100.0 + 60.0) == BucketState(600.0, 160.0)
    assert refill(empty, LIMIT, 100.0 + 3600.0).tokens == 600.0


def test_refill_never_counts_time_twice_when_the_clock_steps_back():
    state = BucketState(tokens=10.0, updated_at_s=100.0)
    behind = refill(state, LIMIT, 95.0)
    assert behind == BucketState(10.0, 100.0)
    assert refill(behind, LIMIT, 101.0).tokens == 20.0


def test_refill_clamps_to_a_lowered_limit():
    assert refill(full_bucket(1000, 0.0), 100, 0.0).tokens == 100.0


def test_take_within_the_bucket():
    result = try_take(full_bucket(LIMIT, 0.0), 250, LIMIT, 0.0)
    assert result.allowed and not result.exceeds_capacity
    assert result.state.tokens == 350.0
    assert result.retry_after_s == 0.0


def test_take_the_whole_bucket_when_full():
    assert try_take(full_bucket(LIMIT, 0.0), LIMIT, LIMIT, 0.0).allowed


def test_refused_take_says_when_enough_will_be_there():
    state = BucketState(tokens=100.0, updated_at_s=0.0)
    result = try_take(state, 250, LIMIT, 2.0)  # 120 there, 130 missing at 10/s
    assert not result.allowed and not result.exceeds_capacity
    assert result.state == BucketState(120.0, 2.0)  # refilled, nothing taken
    assert result.retry_after_s == pytest.approx(13.0)
    assert try_take(result.state, 250, LIMIT, 2.0 + result.retry_after_s).allowed


def test_retry_after_counts_the_debt():
    result = try_take(BucketState(-50.0, 0.0), 10, LIMIT, 0.0)
    assert result.retry_after_s == pytest.approx(6.0)


def test_larger_than_the_bucket_is_never_satisfiable_even_when_full():
    result = try_take(full_bucket(LIMIT, 0.0), LIMIT + 1, LIMIT, 0.0)
    assert not result.allowed and result.exceeds_capacity
    assert result.retry_after_s == math.inf
    assert result.state.tokens == LIMIT


def test_negative_take_is_a_bug():
    with pytest.raises(ValueError):
        try_take(full_bucket(LIMIT, 0.0), -1, LIMIT, 0.0)


def test_credit_refunds_up_to_the_limit_and_debits_down_to_minus_the_limit():
    state = BucketState(100.0, 0.0)
    assert credit(state, 200, LIMIT, 0.0).tokens == 300.0
    assert credit(state, 10_000, LIMIT, 0.0).tokens == 600.0
    assert credit(state, -150, LIMIT, 0.0).tokens == -50.0
    assert credit(state, -10_000, LIMIT, 0.0).tokens == -600.0


def test_credit_refills_first():
    assert credit(BucketState(0.0, 0.0), -5, LIMIT, 1.0) == BucketState(5.0, 1.0)


def test_idle_expiry_is_the_time_to_full():
    assert idle_expiry_s(BucketState(300.0, 0.0), LIMIT) == pytest.approx(30.0)
    assert idle_expiry_s(BucketState(-600.0, 0.0), LIMIT) == pytest.approx(120.0)
    assert idle_expiry_s(full_bucket(LIMIT, 0.0), LIMIT) == 0.0


@pytest.mark.parametrize(
    ("prompt_chars", "max_output", "expected"),
    [(0, 0, 0), (1, 0, 1), (4, 0, 1), (5, 0, 2), (4000, 256, 1256)],
)
def test_estimate_is_a_quarter_of_the_characters_rounded_up_plus_the_output_bound(
    prompt_chars, max_output, expected
):
    assert estimate_tokens(prompt_chars, max_output) == expected


def test_estimate_rejects_negative_sizes():
    with pytest.raises(ValueError):
        estimate_tokens(-1, 10)
