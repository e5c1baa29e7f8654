"""Whatever the Redis-backed stores write expires on its own: an idle
tenant, a dead gateway or an abandoned key leaves nothing behind."""

from __future__ import annotations

from sluice.limits import (
    RedisConcurrencyLimiter,
    RedisIdempotencyStore,
    RedisRateLimiter,
    TenantLimits,
)


async def test_every_key_written_has_an_expiry(redis_session):
    async with redis_session() as (client, prefix):
        rates = RedisRateLimiter(client, key_prefix=prefix)
        slots = RedisConcurrencyLimiter(client, key_prefix=prefix, lease_s=30.0)
        keys = RedisIdempotencyStore(client, key_prefix=prefix)

        reservation = await rates.reserve("acme", TenantLimits(1000, 10), 100)
        await rates.settle(reservation, 50)
        slot = await slots.acquire("acme", 3)
        await slots.refresh(slot)
        await slots.acquire("acme", 3)  # never released
        in_flight = await keys.begin("acme", "never-finished", 30.0)
        done = await keys.begin("acme", "finished", 30.0)
        await keys.complete("acme", "finished", b"response", 3600.0, owner=done.owner)
        assert in_flight is not None

        written = [key async for key in client.scan_iter(match=f"{prefix}:*")]
        assert len(written) == 5  # two buckets, one slot set, two idempotency keys
        for key in written:
            assert await client.pttl(key) > 0, key
