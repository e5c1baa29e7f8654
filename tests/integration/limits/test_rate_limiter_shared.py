"""One behaviour, two implementations: every test here runs against the
in-process limiter and the Redis one (real Redis, the same fake clock sent
into the Lua script), so the two cannot drift apart."""

from __future__ import annotations

import asyncio

import pytest

from sluice.limits import (
    BucketStatus,
    InProcessRateLimiter,
    RedisRateLimiter,
    Refusal,
    Reservation,
    TenantLimits,
)


@pytest.fixture(params=["in_process", "redis"])
async def limiter(request, clock, redis_session):
    if request.param == "in_process":
        yield InProcessRateLimiter(clock)
        return
    async with redis_session() as (client, prefix):
        yield RedisRateLimiter(client, key_prefix=prefix, clock=clock)


TPM_1000 = TenantLimits(tokens_per_minute=1000)


async def test_no_limits_configured_always_allows(limiter):
    for _ in range(50):
        result = await limiter.reserve("acme", TenantLimits(), 10**9)
        assert isinstance(result, Reservation)
        await limiter.settle(result, 10**9 + 5)


async def test_token_limit_refuses_and_retry_after_is_exact(limiter, clock):
    assert isinstance(await limiter.reserve("acme", TPM_1000, 600), Reservation)

    refusal = await limiter.reserve("acme", TPM_1000, 600)
    assert isinstance(refusal, Refusal)
    assert (refusal.reason, refusal.limit) == ("rate_limit_exceeded", "tokens")
    # 400 left, 200 missing at 1000/60 per second.
    assert refusal.retry_after_s == pytest.approx(12.0)
    assert "Limit 1000, Remaining 400, Requested 600" in refusal.message

    clock.advance(11.9)
    assert isinstance(await limiter.reserve("acme", TPM_1000, 600), Refusal)
    clock.advance(0.1)
    assert isinstance(await limiter.reserve("acme", TPM_1000, 600), Reservation)


async def test_request_limit_refuses_with_its_own_retry_after(limiter, clock):
    limits = TenantLimits(requests_per_minute=3)
    for _ in range(3):
        assert isinstance(await limiter.reserve("acme", limits, 1), Reservation)
    refusal = await limiter.reserve("acme", limits, 1)
    assert isinstance(refusal, Refusal)
    assert refusal.limit == "requests"
    assert refusal.retry_after_s == pytest.approx(20.0)  # one request per 20 s
    clock.advance(20.0)
    assert isinstance(await limiter.reserve("acme", limits, 1), Reservation)


async def test_when_both_limits_refuse_the_longer_wait_is_reported(limiter):
    limits = TenantLimits(tokens_per_minute=600, requests_per_minute=1)
    assert isinstance(await limiter.reserve("acme", limits, 590), Reservation)
    refusal = await limiter.reserve("acme", limits, 100)
    # tokens: 90 missing at 10/s = 9 s; requests: 1 missing at 1/60 s = 60 s.
    assert refusal.limit == "requests"
    assert refusal.retry_after_s == pytest.approx(60.0)


async def test_a_refused_reservation_takes_nothing_from_either_bucket(limiter):
    limits = TenantLimits(tokens_per_minute=100, requests_per_minute=2)
    assert isinstance(await limiter.reserve("acme", limits, 80), Reservation)
    assert isinstance(await limiter.reserve("acme", limits, 80), Refusal)  # tokens short
    # Had the refusal taken a request, this second one would be refused.
    assert isinstance(await limiter.reserve("acme", limits, 20), Reservation)


async def test_request_larger_than_the_bucket_is_refused_for_good(limiter):
    refusal = await limiter.reserve("acme", TPM_1000, 1001)
    assert isinstance(refusal, Refusal)
    assert (refusal.reason, refusal.limit) == ("rate_limit_exceeded", "tokens")
    assert refusal.retry_after_s is None  # no wait would help
    assert "Request too large" in refusal.message
    # It took nothing: the full bucket still grants exactly its capacity.
    assert isinstance(await limiter.reserve("acme", TPM_1000, 1000), Reservation)
    assert isinstance(await limiter.reserve("acme", TPM_1000, 1), Refusal)


async def test_settle_refunds_the_unused_estimate(limiter):
    reservation = await limiter.reserve("acme", TPM_1000, 800)
    await limiter.settle(reservation, 200)  # 200 + 600 back = 800
    assert isinstance(await limiter.reserve("acme", TPM_1000, 800), Reservation)
    assert isinstance(await limiter.reserve("acme", TPM_1000, 1), Refusal)


async def test_settle_never_refunds_above_capacity(limiter, clock):
    reservation = await limiter.reserve("acme", TPM_1000, 100)
    clock.advance(60.0)  # refilled to full meanwhile
    await limiter.settle(reservation, 0)
    assert isinstance(await limiter.reserve("acme", TPM_1000, 1000), Reservation)
    assert isinstance(await limiter.reserve("acme", TPM_1000, 1), Refusal)


async def test_settle_above_the_estimate_leaves_a_debt_that_delays_the_next_request(limiter):
    limits = TenantLimits(tokens_per_minute=600)  # 10 tokens per second
    reservation = await limiter.reserve("acme", limits, 100)
    await limiter.settle(reservation, 700)  # 500 left - 600 more = -100
    refusal = await limiter.reserve("acme", limits, 10)
    assert refusal.retry_after_s == pytest.approx(11.0)  # 110 missing at 10/s
    assert "Remaining 0" in refusal.message


async def test_debt_is_floored_at_one_minute_of_allowance(limiter):
    limits = TenantLimits(tokens_per_minute=600)
    reservation = await limiter.reserve("acme", limits, 100)
    await limiter.settle(reservation, 1_000_000)
    refusal = await limiter.reserve("acme", limits, 600)
    assert refusal.retry_after_s == pytest.approx(120.0)  # from -600 to +600


async def test_tenants_have_separate_buckets(limiter):
    assert isinstance(await limiter.reserve("acme", TPM_1000, 1000), Reservation)
    assert isinstance(await limiter.reserve("acme", TPM_1000, 1), Refusal)
    assert isinstance(await limiter.reserve("globex", TPM_1000, 1000), Reservation)


async def test_concurrent_reservations_never_over_grant(limiter):
    limits = TenantLimits(tokens_per_minute=1000, requests_per_minute=100)
    results = await asyncio.gather(*(limiter.reserve("acme", limits, 150) for _ in range(20)))
    granted = [r for r in results if isinstance(r, Reservation)]
    assert len(granted) == 6  # 6 * 150 = 900 <= 1000 < 7 * 150
    assert all(r.limit == "tokens" for r in results if isinstance(r, Refusal))


async def test_concurrent_requests_never_over_grant_the_request_bucket(limiter):
    limits = TenantLimits(tokens_per_minute=10_000, requests_per_minute=7)
    results = await asyncio.gather(*(limiter.reserve("acme", limits, 1) for _ in range(20)))
    assert sum(isinstance(r, Reservation) for r in results) == 7


async def test_a_lowered_limit_applies_at_once(limiter):
    assert isinstance(await limiter.reserve("acme", TenantLimits(tokens_per_minute=10_000), 1), Reservation)
    lowered = TenantLimits(tokens_per_minute=100)
    assert isinstance(await limiter.reserve("acme", lowered, 100), Reservation)
    assert isinstance(await limiter.reserve("acme", lowered, 1), Refusal)


async def test_a_reservation_reports_both_buckets_after_taking(limiter, clock):
    limits = TenantLimits(tokens_per_minute=1000, requests_per_minute=60)
    first = await limiter.reserve("acme", limits, 250)
    assert isinstance(first, Reservation)
    assert first.status.tokens == BucketStatus(1000, pytest.approx(750))
    assert first.status.requests == BucketStatus(60, pytest.approx(59))
    assert first.status.tokens.reset_s == pytest.approx(15.0)  # 250 tokens at 1000/60 per second
    clock.advance(3.0)  # 50 tokens and 3 requests refilled
    second = await limiter.reserve("acme", limits, 100)
    assert second.status.tokens.remaining == pytest.approx(700)
    assert second.status.requests.remaining == pytest.approx(60 - 1)
    headers = second.status.headers()
    assert headers == {
        "x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "700", "x-ratelimit-reset-tokens": "18s",
    }


async def test_a_refusal_reports_the_buckets_as_they_stand(limiter):
    limits = TenantLimits(tokens_per_minute=1000, requests_per_minute=60)
    assert isinstance(await limiter.reserve("acme", limits, 900), Reservation)
    refusal = await limiter.reserve("acme", limits, 200)
    assert isinstance(refusal, Refusal)
    assert refusal.rate_status.tokens.remaining == pytest.approx(100)  # nothing taken by the refusal
    assert refusal.rate_status.requests.remaining == pytest.approx(59)


async def test_a_tenant_without_a_limit_reports_no_bucket(limiter):
    only_rpm = await limiter.reserve("acme", TenantLimits(requests_per_minute=10), 10**6)
    assert only_rpm.status.tokens is None and only_rpm.status.requests.limit == 10
    assert set(only_rpm.status.headers()) == {
        "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"}
    assert (await limiter.reserve("acme", TenantLimits(), 5)).status.headers() == {}
