"""Idempotency keys, run against the in-process store and the Redis one.

The Redis store expires leases and responses with Redis's own timers, so
`advance` really sleeps there (short leases keep it quick) and moves the
fake clock for the in-process store."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from sluice.limits import (
    Began,
    Completed,
    IdempotencyStore,
    InFlight,
    InProcessIdempotencyStore,
    RedisIdempotencyStore,
)

LONG_S = 30.0  # a lease or TTL no test outlives
SHORT_S = 0.3  # one a test waits out


@dataclass
class Harness:
    store: IdempotencyStore
    advance: Callable[[float], Awaitable[None]]


@pytest.fixture(params=["in_process", "redis"])
async def env(request, clock, redis_session):
    if request.param == "in_process":

        async def advance(seconds: float) -> None:
            clock.advance(seconds)

        yield Harness(InProcessIdempotencyStore(clock), advance)
        return
    async with redis_session() as (client, prefix):
        yield Harness(RedisIdempotencyStore(client, key_prefix=prefix), asyncio.sleep)


async def test_two_concurrent_begins_exactly_one_runs(env):
    results = await asyncio.gather(*(env.store.begin("acme", "key-1", LONG_S) for _ in range(20)))
    assert sum(isinstance(r, Began) for r in results) == 1
    assert all(isinstance(r, InFlight) for r in results if not isinstance(r, Began))


async def test_in_flight_while_the_first_attempt_holds_the_key(env):
    assert isinstance(await env.store.begin("acme", "key-1", LONG_S), Began)
    second = await env.store.begin("acme", "key-1", LONG_S)
    assert isinstance(second, InFlight)
    assert 0 < second.lease_remaining_s <= LONG_S


async def test_abandon_lets_a_retry_run(env):
    first = await env.store.begin("acme", "key-1", LONG_S)
    assert await env.store.abandon("acme", "key-1", owner=first.owner)
    retry = await env.store.begin("acme", "key-1", LONG_S)
    assert isinstance(retry, Began) and retry.owner != first.owner


async def test_completed_response_is_replayed_until_its_ttl(env):
    body = b'data: {"id": "x", "choices": []}\n\n\x00\xff binary-safe'
    first = await env.store.begin("acme", "key-1", LONG_S)
    assert await env.store.complete("acme", "key-1", body, SHORT_S, owner=first.owner)
    for _ in range(3):
        assert await env.store.begin("acme", "key-1", LONG_S) == Completed(response=body)
    await env.advance(SHORT_S + 0.1)
    assert isinstance(await env.store.begin("acme", "key-1", LONG_S), Began)


async def test_an_expired_lease_lets_a_new_attempt_begin(env):
    await env.store.begin("acme", "key-1", SHORT_S)  # the owner dies without a word
    await env.advance(SHORT_S + 0.1)
    assert isinstance(await env.store.begin("acme", "key-1", LONG_S), Began)


async def test_refresh_keeps_the_lease_while_streaming(env):
    first = await env.store.begin("acme", "key-1", SHORT_S)
    for _ in range(3):
        await env.advance(SHORT_S / 2)
        assert await env.store.refresh("acme", "key-1", SHORT_S, owner=first.owner)
    assert isinstance(await env.store.begin("acme", "key-1", LONG_S), InFlight)


async def test_a_stale_owner_cannot_touch_a_new_owners_attempt(env):
    stale = await env.store.begin("acme", "key-1", SHORT_S)
    await env.advance(SHORT_S + 0.1)
    current = await env.store.begin("acme", "key-1", LONG_S)
    assert isinstance(current, Began)

    assert not await env.store.complete("acme", "key-1", b"stale", LONG_S, owner=stale.owner)
    assert not await env.store.refresh("acme", "key-1", LONG_S, owner=stale.owner)
    assert not await env.store.abandon("acme", "key-1", owner=stale.owner)
    assert isinstance(await env.store.begin("acme", "key-1", LONG_S), InFlight)

    assert await env.store.complete("acme", "key-1", b"fresh", LONG_S, owner=current.owner)
    assert await env.store.begin("acme", "key-1", LONG_S) == Completed(response=b"fresh")


async def test_a_completed_response_is_not_overwritten_or_abandoned(env):
    first = await env.store.begin("acme", "key-1", LONG_S)
    assert await env.store.complete("acme", "key-1", b"one", LONG_S, owner=first.owner)
    assert not await env.store.complete("acme", "key-1", b"two", LONG_S, owner="someone-else")
    assert not await env.store.abandon("acme", "key-1", owner=first.owner)
    assert await env.store.begin("acme", "key-1", LONG_S) == Completed(response=b"one")


async def test_a_slow_owner_whose_lease_lapsed_unclaimed_may_still_complete(env):
    # Nobody retried in between, so the finished response is worth keeping.
    first = await env.store.begin("acme", "key-1", SHORT_S)
    await env.advance(SHORT_S + 0.1)
    assert await env.store.complete("acme", "key-1", b"late", LONG_S, owner=first.owner)
    assert await env.store.begin("acme", "key-1", LONG_S) == Completed(response=b"late")


async def test_keys_are_scoped_per_tenant(env):
    assert isinstance(await env.store.begin("acme", "key-1", LONG_S), Began)
    assert isinstance(await env.store.begin("globex", "key-1", LONG_S), Began)
    # No collision between ("a:b", "c") and ("a", "b:c").
    assert isinstance(await env.store.begin("a:b", "c", LONG_S), Began)
    assert isinstance(await env.store.begin("a", "b:c", LONG_S), Began)


async def test_non_positive_lease_or_ttl_is_rejected(env):
    with pytest.raises(ValueError):
        await env.store.begin("acme", "key-1", 0)
    first = await env.store.begin("acme", "key-1", LONG_S)
    with pytest.raises(ValueError):
        await env.store.complete("acme", "key-1", b"x", 0, owner=first.owner)
