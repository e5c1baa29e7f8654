"""Limits that fail open: Redis when it answers, this process's own share
of every limit when it does not.

A limits store that is down must not take the API down with it: each
gateway then enforces `share` (1 / the number of gateways) of each tenant's
limits in memory, so the fleet as a whole still holds about the limit, and
serves. Idempotency keys fall back to this process's memory too; a retry
that lands on another gateway meanwhile may run again, but it is billed
once all the same: the usage ledger keeps one row per (tenant, request id).

    reserve / acquire / begin ──▶ Redis ──error──▶ mark down, log once ──▶ local
                                   ▲                                        │
                                   └── retried every retry_interval_s ◀─────┘

What was taken locally is given back locally (a reservation, a slot, an
idempotency owner remember where they came from). When Redis answers again
the shared state takes over for new requests; it does not know what the
fallback took meanwhile, so for a little while a tenant may get up to its
limit again on top: the price of staying up.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from redis.exceptions import RedisError

from sluice.limits.concurrency import ConcurrencyLimiter, ConcurrencySlot
from sluice.limits.idempotency import Began, BeginResult, IdempotencyStore
from sluice.limits.limiter import RateLimiter, Reservation, TenantLimits
from sluice.limits.refusal import Refusal

log = logging.getLogger(__name__)

T = TypeVar("T")
# What an unreachable or failing Redis raises through redis-py.
STORE_ERRORS = (RedisError, OSError)


@dataclass(slots=True)
class StoreHealth:
    """Whether the shared store is in use; one per gateway, shared by its
    three limit wrappers. Written on the event loop only."""

    retry_interval_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    down_since_s: float | None = None
    next_try_s: float = 0.0

    @property
    def down(self) -> bool:
        return self.down_since_s is not None

    def should_try(self) -> bool:
        return self.down_since_s is None or self.clock() >= self.next_try_s

    def failed(self, error: BaseException) -> None:
        now_s = self.clock()
        if self.down_since_s is None:
            self.down_since_s = now_s
            log.error("limits store unreachable (%r): enforcing this gateway's share of each limit in memory",
                      error)
        self.next_try_s = now_s + self.retry_interval_s

    def succeeded(self) -> None:
        if self.down_since_s is not None:
            log.warning("limits store back after %.1f s: shared limits again", self.clock() - self.down_since_s)
            self.down_since_s = None


async def _shared_or_local(health: StoreHealth, shared: Callable[[], Awaitable[T]],
                           local: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
    """The shared store's answer, or the local one's; True when local."""
    if health.should_try():
        try:
            result = await shared()
        except STORE_ERRORS as error:
            health.failed(error)
        else:
            health.succeeded()
            return result, False
    return await local(), True


def share_of(limit: int | None, share: float) -> int | None:
    """This gateway's part of a limit: at least 1, so a tenant is never shut out."""
    return None if limit is None else max(1, math.floor(limit * share))


class FailOpenRateLimiter:
    def __init__(self, shared: RateLimiter, local: RateLimiter, share: float, health: StoreHealth) -> None:
        self._shared, self._local, self._share, self._health = shared, local, share, health
        self._local_reservations: dict[int, Reservation] = {}  # id -> reservation taken locally

    async def reserve(self, tenant: str, limits: TenantLimits, estimated_tokens: int) -> Reservation | Refusal:
        local_limits = replace(limits, tokens_per_minute=share_of(limits.tokens_per_minute, self._share),
                               requests_per_minute=share_of(limits.requests_per_minute, self._share))
        result, is_local = await _shared_or_local(
            self._health, lambda: self._shared.reserve(tenant, limits, estimated_tokens),
            lambda: self._local.reserve(tenant, local_limits, estimated_tokens))
        if is_local and isinstance(result, Reservation):
            self._local_reservations[id(result)] = result
        return result

    async def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        if self._local_reservations.pop(id(reservation), None) is not None:
            await self._local.settle(reservation, actual_tokens)
            return
        try:
            await self._shared.settle(reservation, actual_tokens)
        except STORE_ERRORS as error:  # the bucket refills by itself; only the correction is lost
            self._health.failed(error)


class FailOpenConcurrencyLimiter:
    def __init__(self, shared: ConcurrencyLimiter, local: ConcurrencyLimiter, share: float,
                 health: StoreHealth) -> None:
        self._shared, self._local, self._share, self._health = shared, local, share, health
        self._local_slots: set[str] = set()

    async def acquire(self, tenant: str, max_concurrent: int | None) -> ConcurrencySlot | Refusal:
        result, is_local = await _shared_or_local(
            self._health, lambda: self._shared.acquire(tenant, max_concurrent),
            lambda: self._local.acquire(tenant, share_of(max_concurrent, self._share)))
        if is_local and isinstance(result, ConcurrencySlot) and result.slot_id is not None:
            self._local_slots.add(result.slot_id)
        return result

    async def release(self, slot: ConcurrencySlot) -> None:
        if slot.slot_id in self._local_slots:
            self._local_slots.discard(slot.slot_id)
            await self._local.release(slot)
            return
        try:
            await self._shared.release(slot)
        except STORE_ERRORS as error:  # its lease expires in Redis by itself
            self._health.failed(error)

    async def refresh(self, slot: ConcurrencySlot) -> bool:
        if slot.slot_id in self._local_slots:
            return await self._local.refresh(slot)
        return await self._shared.refresh(slot)


class FailOpenIdempotencyStore:
    def __init__(self, shared: IdempotencyStore, local: IdempotencyStore, health: StoreHealth) -> None:
        self._shared, self._local, self._health = shared, local, health
        self._local_owners: set[str] = set()

    async def begin(self, tenant: str, key: str, lease_s: float) -> BeginResult:
        result, is_local = await _shared_or_local(
            self._health, lambda: self._shared.begin(tenant, key, lease_s),
            lambda: self._local.begin(tenant, key, lease_s))
        if is_local and isinstance(result, Began):
            self._local_owners.add(result.owner)
        return result

    def _store_of(self, owner: str) -> IdempotencyStore:
        return self._local if owner in self._local_owners else self._shared

    async def complete(self, tenant: str, key: str, response: bytes, ttl_s: float, *, owner: str) -> bool:
        store = self._store_of(owner)
        self._local_owners.discard(owner)
        return await store.complete(tenant, key, response, ttl_s, owner=owner)

    async def abandon(self, tenant: str, key: str, *, owner: str) -> bool:
        store = self._store_of(owner)
        self._local_owners.discard(owner)
        return await store.abandon(tenant, key, owner=owner)

    async def refresh(self, tenant: str, key: str, lease_s: float, *, owner: str) -> bool:
        return await self._store_of(owner).refresh(tenant, key, lease_s, owner=owner)
