"""Per-tenant concurrency caps, run against the in-process limiter and the
Redis one (real Redis, the fake clock sent into the scripts)."""

from __future__ import annotations

import asyncio

import pytest

from sluice.limits import (
    ConcurrencySlot,
    InProcessConcurrencyLimiter,
    RedisConcurrencyLimiter,
    Refusal,
)

LEASE_S = 10.0


@pytest.fixture(params=["in_process", "redis"])
async def slots(request, clock, redis_session):
    if request.param == "in_process":
        yield InProcessConcurrencyLimiter(clock, lease_s=LEASE_S)
        return
    async with redis_session() as (client, prefix):
        yield RedisConcurrencyLimiter(client, key_prefix=prefix, clock=clock, lease_s=LEASE_S)


async def test_no_cap_always_grants(slots):
    held = [await slots.acquire("acme", None) for _ in range(100)]
    assert all(isinstance(slot, ConcurrencySlot) for slot in held)
    for slot in held:
        assert await slots.refresh(slot)
        await slots.release(slot)


async def test_cap_refuses_until_a_slot_is_released(slots):
    first = await slots.acquire("acme", 2)
    second = await slots.acquire("acme", 2)
    assert isinstance(first, ConcurrencySlot) and isinstance(second, ConcurrencySlot)
    refusal = await slots.acquire("acme", 2)
    assert isinstance(refusal, Refusal)
    assert (refusal.reason, refusal.limit) == ("tenant_concurrency", "concurrent_requests")
    assert refusal.retry_after_s is not None and refusal.retry_after_s > 0
    await slots.release(first)
    assert isinstance(await slots.acquire("acme", 2), ConcurrencySlot)


async def test_releasing_twice_frees_one_slot_only(slots):
    first = await slots.acquire("acme", 2)
    await slots.acquire("acme", 2)
    await slots.release(first)
    await slots.release(first)
    assert isinstance(await slots.acquire("acme", 2), ConcurrencySlot)
    assert isinstance(await slots.acquire("acme", 2), Refusal)


async def test_a_crashed_holders_slots_come_back_after_the_lease(slots, clock):
    await slots.acquire("acme", 2)
    await slots.acquire("acme", 2)  # never released: the gateway died
    clock.advance(LEASE_S - 0.1)
    assert isinstance(await slots.acquire("acme", 2), Refusal)
    clock.advance(0.1)
    assert isinstance(await slots.acquire("acme", 2), ConcurrencySlot)


async def test_refresh_keeps_a_long_stream_counted(slots, clock):
    slot = await slots.acquire("acme", 1)
    for _ in range(5):
        clock.advance(LEASE_S * 0.8)
        assert await slots.refresh(slot)
    assert isinstance(await slots.acquire("acme", 1), Refusal)


async def test_refresh_after_the_lease_expired_reports_the_slot_lost(slots, clock):
    slot = await slots.acquire("acme", 1)
    clock.advance(LEASE_S)
    assert not await slots.refresh(slot)
    assert isinstance(await slots.acquire("acme", 1), ConcurrencySlot)


async def test_tenants_are_capped_separately(slots):
    assert isinstance(await slots.acquire("acme", 1), ConcurrencySlot)
    assert isinstance(await slots.acquire("acme", 1), Refusal)
    assert isinstance(await slots.acquire("globex", 1), ConcurrencySlot)


async def test_concurrent_acquires_never_over_grant(slots):
    results = await asyncio.gather(*(slots.acquire("acme", 5) for _ in range(20)))
    granted = [r for r in results if isinstance(r, ConcurrencySlot)]
    assert len(granted) == 5
    await asyncio.gather(*(slots.release(slot) for slot in granted))
    results = await asyncio.gather(*(slots.acquire("acme", 5) for _ in range(20)))
    assert sum(isinstance(r, ConcurrencySlot) for r in results) == 5


async def test_invalid_cap_is_rejected(slots):
    with pytest.raises(ValueError):
        await slots.acquire("acme", 0)
