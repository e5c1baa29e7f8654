"""What only the Redis limiter has: Redis's own clock, shared state between
gateways, and keys that expire once they carry no information."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from sluice.limits import RedisRateLimiter, Refusal, Reservation, TenantLimits


async def test_without_a_clock_the_script_uses_redis_time(redis_session):
    async with redis_session() as (client, prefix):
        limiter = RedisRateLimiter(client, key_prefix=prefix)  # clock=None: Redis TIME
        limits = TenantLimits(tokens_per_minute=600)  # 10 tokens per second
        assert isinstance(await limiter.reserve("acme", limits, 600), Reservation)
        refusal = await limiter.reserve("acme", limits, 3)
        assert isinstance(refusal, Refusal)
        # 3 missing at 10/s, less the little that refilled since the first call.
        assert 0.2 < refusal.retry_after_s <= 0.3
        await asyncio.sleep(refusal.retry_after_s + 0.05)
        assert isinstance(await limiter.reserve("acme", limits, 3), Reservation)


async def test_two_gateways_share_one_budget(redis_session, redis_url, clock):
    async with redis_session() as (client, prefix):
        # A second client with its own connections, as a second gateway has.
        other_client = Redis.from_url(redis_url)
        try:
            gateways = [
                RedisRateLimiter(client, key_prefix=prefix, clock=clock),
                RedisRateLimiter(other_client, key_prefix=prefix, clock=clock),
            ]
            limits = TenantLimits(tokens_per_minute=1000)
            results = await asyncio.gather(
                *(gateways[i % 2].reserve("acme", limits, 100) for i in range(40))
            )
            assert sum(isinstance(r, Reservation) for r in results) == 10
        finally:
            await other_client.aclose()


async def test_bucket_keys_expire_once_they_would_be_full_again(redis_session, clock):
    async with redis_session() as (client, prefix):
        limiter = RedisRateLimiter(client, key_prefix=prefix, clock=clock)
        limits = TenantLimits(tokens_per_minute=600, requests_per_minute=60)
        reservation = await limiter.reserve("acme", limits, 300)
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
        assert len(keys) == 2
        for key in keys:
            ttl_ms = await client.pttl(key)
            assert 0 < ttl_ms <= 31_000  # tokens: 300 missing at 10/s = 30 s, + 1 s slack
        await limiter.settle(reservation, 1_000_000)  # debt floor: full again in 120 s
        tokens_key = next(k for k in keys if k.endswith(b":tokens"))
        assert 119_000 < await client.pttl(tokens_key) <= 121_000


async def test_no_keys_written_for_an_unlimited_tenant(redis_session):
    async with redis_session() as (client, prefix):
        limiter = RedisRateLimiter(client, key_prefix=prefix)
        await limiter.settle(await limiter.reserve("acme", TenantLimits(), 50), 10)
        assert [key async for key in client.scan_iter(match=f"{prefix}:*")] == []


@pytest.mark.parametrize("tenant", ["a:b", "{a}", "ünïcode tenant"])
async def test_awkward_tenant_names_get_their_own_buckets(redis_session, clock, tenant):
    async with redis_session() as (client, prefix):
        limiter = RedisRateLimiter(client, key_prefix=prefix, clock=clock)
        limits = TenantLimits(tokens_per_minute=10)
        assert isinstance(await limiter.reserve(tenant, limits, 10), Reservation)
        assert isinstance(await limiter.reserve(tenant, limits, 1), Refusal)
        assert isinstance(await limiter.reserve("a", limits, 10), Reservation)
