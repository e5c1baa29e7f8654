"""In-process specifics the shared Redis/in-process suites cannot see:
validation, and that forgotten state really is forgotten."""

from __future__ import annotations

import pytest

from sluice.limits import (
    InProcessConcurrencyLimiter,
    InProcessIdempotencyStore,
    InProcessRateLimiter,
    Refusal,
    Reservation,
    TenantLimits,
)


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.mark.parametrize("bad", [0, -5])
def test_tenant_limits_must_be_positive_or_none(bad):
    with pytest.raises(ValueError):
        TenantLimits(tokens_per_minute=bad)
    with pytest.raises(ValueError):
        TenantLimits(requests_per_minute=bad)


async def test_negative_estimate_is_a_bug():
    with pytest.raises(ValueError):
        await InProcessRateLimiter(Clock()).reserve("acme", TenantLimits(100), -1)


async def test_buckets_idle_long_enough_to_be_full_are_forgotten():
    clock = Clock()
    limiter = InProcessRateLimiter(clock)
    limits = TenantLimits(tokens_per_minute=100, requests_per_minute=100)
    for i in range(50):
        await limiter.reserve(f"tenant-{i}", limits, 10)
    clock.now_s += 121.0  # longer than a refill from the debt floor
    for _ in range(InProcessRateLimiter._SWEEP_EVERY):
        assert isinstance(await limiter.reserve("busy", TenantLimits(), 1), Reservation)
    assert limiter._token_buckets == {} and limiter._request_buckets == {}


async def test_released_slots_leave_no_tenant_behind():
    slots = InProcessConcurrencyLimiter(Clock())
    slot = await slots.acquire("acme", 1)
    await slots.release(slot)
    assert slots._slots == {}


async def test_expired_idempotency_entries_are_swept():
    clock = Clock()
    store = InProcessIdempotencyStore(clock)
    for i in range(10):
        await store.begin("acme", f"key-{i}", 1.0)
    clock.now_s += 2.0
    for i in range(InProcessIdempotencyStore._SWEEP_EVERY):
        await store.begin("acme", "live", 60.0)
    assert list(store._entries) == [("acme", "live")]


@pytest.mark.parametrize(
    ("retry_after_s", "header"), [(None, None), (0.0, "1"), (0.2, "1"), (12.0, "12"), (12.01, "13")]
)
def test_retry_after_header_is_whole_seconds_rounded_up(retry_after_s, header):
    refusal = Refusal(
        reason="rate_limit_exceeded", limit="tokens", retry_after_s=retry_after_s, message=""
    )
    assert refusal.retry_after_header() == header
