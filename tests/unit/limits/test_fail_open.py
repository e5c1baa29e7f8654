"""Limits that fail open: the in-process limiters stand in (with this
gateway's share of each limit) while the shared store raises, what was
taken locally is given back locally, and the shared store is tried again
after the retry interval."""

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from sluice.limits import (
    Began, InProcessConcurrencyLimiter, InProcessIdempotencyStore, InProcessRateLimiter, Refusal, Reservation,
    TenantLimits,
)
from sluice.limits.fail_open import (
    FailOpenConcurrencyLimiter, FailOpenIdempotencyStore, FailOpenRateLimiter, StoreHealth, share_of,
)


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class Flaky:
    """Wraps a real limiter; raises like an unreachable Redis while `down`."""

    def __init__(self, inner) -> None:
        self.inner, self.down, self.calls = inner, False, 0

    def __getattr__(self, name):
        method = getattr(self.inner, name)

        async def call(*args, **kwargs):
            self.calls += 1
            if self.down:
                raise RedisConnectionError("Connection refused")
            return await method(*args, **kwargs)
        return call


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def health(clock):
    return StoreHealth(retry_interval_s=5.0, clock=clock)


async def test_rate_limits_fall_back_to_this_gateways_share_and_come_back(clock, health):
    shared = Flaky(InProcessRateLimiter(clock))
    local = InProcessRateLimiter(clock)
    limiter = FailOpenRateLimiter(shared, local, share=0.5, health=health)
    limits = TenantLimits(requests_per_minute=10)

    shared.down = True
    taken = [await limiter.reserve("acme", limits, 1) for _ in range(6)]
    assert health.down
    assert [isinstance(t, Reservation) for t in taken] == [True] * 5 + [False]  # 10 x 0.5 in memory
    assert isinstance(taken[-1], Refusal) and taken[-1].retry_after_s > 0
    calls = shared.calls
    await limiter.reserve("acme", limits, 1)
    assert shared.calls == calls  # not retried before the interval
    await limiter.settle(taken[0], 1)  # given back where it was taken: no call to the shared store
    assert shared.calls == calls

    shared.down = False
    clock.now_s += 5.0
    back = await limiter.reserve("acme", limits, 1)
    assert isinstance(back, Reservation) and not health.down
    assert back.status.requests.limit == 10  # the shared limit again, not the share


async def test_a_settle_that_fails_on_the_shared_store_is_dropped(clock, health):
    shared = Flaky(InProcessRateLimiter(clock))
    limiter = FailOpenRateLimiter(shared, InProcessRateLimiter(clock), share=1.0, health=health)
    reservation = await limiter.reserve("acme", TenantLimits(tokens_per_minute=100), 10)
    shared.down = True
    await limiter.settle(reservation, 5)  # no exception: the bucket refills by itself
    assert health.down


async def test_concurrency_slots_fall_back_and_are_released_where_taken(clock, health):
    shared = Flaky(InProcessConcurrencyLimiter())
    local = InProcessConcurrencyLimiter()
    limiter = FailOpenConcurrencyLimiter(shared, local, share=0.5, health=health)
    shared.down = True
    first = await limiter.acquire("acme", 4)
    second = await limiter.acquire("acme", 4)
    assert isinstance(await limiter.acquire("acme", 4), Refusal)  # 2 of 4 here
    assert await limiter.refresh(first)
    await limiter.release(first)
    await limiter.release(second)
    assert not isinstance(await limiter.acquire("acme", 4), Refusal)


async def test_idempotency_keys_fall_back_to_memory(clock, health):
    shared = Flaky(InProcessIdempotencyStore())
    store = FailOpenIdempotencyStore(shared, InProcessIdempotencyStore(), health)
    shared.down = True
    began = await store.begin("acme", "key-1", lease_s=60)
    assert isinstance(began, Began)
    assert await store.complete("acme", "key-1", b"response", 3600, owner=began.owner)
    assert (await store.begin("acme", "key-1", lease_s=60)).response == b"response"  # replayed from memory


def test_a_share_never_shuts_a_tenant_out():
    assert share_of(10, 0.5) == 5 and share_of(1, 1 / 3) == 1 and share_of(None, 0.5) is None
