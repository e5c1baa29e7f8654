"""Per-tenant cap on requests running at once.

acquire() a slot before a request starts, release() it when the request
ends however it ends, refresh() it while a long stream runs.

Slots are leases: each expires `lease_s` after it was acquired or last
refreshed. In Redis this is what keeps a crashed gateway (OOM-killed, node
lost) from leaking slots forever: its slots would otherwise stay counted
and the tenant would be capped below its limit until someone deleted keys
by hand. With a lease, a dead gateway's slots come back within lease_s. The
cost is that a live gateway must refresh() its streams more often than
lease_s (every lease_s / 3 leaves room for a slow Redis round trip); a
stream whose refresh() answers False has lost its slot and may be counted
twice for a moment, which errs towards the tenant, never leaks.

The in-process implementation expires leases on the same clock so both
behave alike (a crashed process loses its dict anyway).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis

from sluice.limits._keys import LUA_NOW, clock_arg, tenant_key, to_ms
from sluice.limits.clock import Clock
from sluice.limits.refusal import Refusal


# A lease comfortably longer than a refresh interval plus a slow Redis call;
# short enough that a crashed gateway's slots return within a minute.
DEFAULT_LEASE_S = 60.0
# No one knows when another stream will end; a short hint spreads retries
# rather than promising a time.
DEFAULT_RETRY_HINT_S = 1.0


@dataclass(slots=True, frozen=True)
class ConcurrencySlot:
    """A held slot; release() it exactly once. slot_id is None when the
    tenant has no concurrency limit (nothing was counted)."""

    tenant: str
    slot_id: str | None


class ConcurrencyLimiter(Protocol):
    async def acquire(self, tenant: str, max_concurrent: int | None) -> ConcurrencySlot | Refusal:
        ...

    async def release(self, slot: ConcurrencySlot) -> None:
        ...

    async def refresh(self, slot: ConcurrencySlot) -> bool:
        """Extend the lease; False if it had already expired (slot lost)."""
        ...


def _refusal(tenant: str, max_concurrent: int, retry_hint_s: float) -> Refusal:
    return Refusal(
        reason="tenant_concurrency",
        limit="concurrent_requests",
        retry_after_s=retry_hint_s,
        message=(
            f"Too many concurrent requests for tenant {tenant!r}: Limit {max_concurrent}. "
            f"Retry when one of the running requests has finished."
        ),
    )


def _check_limit(max_concurrent: int | None) -> None:
    if max_concurrent is not None and max_concurrent <= 0:
        raise ValueError(f"max_concurrent must be a positive integer or None, got {max_concurrent}")


class InProcessConcurrencyLimiter:
    """Slots in a dict; safe for any number of tasks on one event loop (no
    method awaits between reading and writing)."""

    def __init__(
        self,
        clock: Clock = time.monotonic,
        lease_s: float = DEFAULT_LEASE_S,
        retry_hint_s: float = DEFAULT_RETRY_HINT_S,
    ) -> None:
        self._clock = clock
        self._lease_s = lease_s
        self._retry_hint_s = retry_hint_s
        # tenant -> slot_id -> lease expiry; written only by this instance.
        self._slots: dict[str, dict[str, float]] = {}

    def _live(self, tenant: str, now_s: float) -> dict[str, float]:
        """The tenant's unexpired slots (a new dict if none; acquire stores it)."""
        slots = self._slots.pop(tenant, {})
        for slot_id in [s for s, expiry in slots.items() if expiry <= now_s]:
            del slots[slot_id]
        if slots:
            self._slots[tenant] = slots
        return slots

    async def acquire(self, tenant: str, max_concurrent: int | None) -> ConcurrencySlot | Refusal:
        _check_limit(max_concurrent)
        if max_concurrent is None:
            return ConcurrencySlot(tenant=tenant, slot_id=None)
        now_s = self._clock()
        slots = self._live(tenant, now_s)
        if len(slots) >= max_concurrent:
            return _refusal(tenant, max_concurrent, self._retry_hint_s)
        slot_id = secrets.token_hex(8)
        slots[slot_id] = now_s + self._lease_s
        self._slots[tenant] = slots
        return ConcurrencySlot(tenant=tenant, slot_id=slot_id)

    async def release(self, slot: ConcurrencySlot) -> None:
        if slot.slot_id is None:
            return
        slots = self._slots.get(slot.tenant)
        if slots is not None:
            slots.pop(slot.slot_id, None)
            if not slots:
                del self._slots[slot.tenant]

    async def refresh(self, slot: ConcurrencySlot) -> bool:
        if slot.slot_id is None:
            return True
        now_s = self._clock()
        slots = self._live(slot.tenant, now_s)
        if slot.slot_id not in slots:
            return False
        slots[slot.slot_id] = now_s + self._lease_s
        return True


_NOW_LUA = LUA_NOW + """-- The set must outlive its newest lease; never shorten it.
local function keep_for(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, ms) end
end
"""

# KEYS: the tenant's slot set (member slot_id, score lease expiry).
# ARGV: now_s|'', max_concurrent, slot_id, lease_s, key ttl ms.
_ACQUIRE_LUA = _NOW_LUA + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.17g', now))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], string.format('%.17g', now + tonumber(ARGV[4])), ARGV[3])
keep_for(KEYS[1], tonumber(ARGV[5]))
return 1
"""

# KEYS: the slot set. ARGV: now_s|'', slot_id, lease_s, key ttl ms.
_REFRESH_LUA = _NOW_LUA + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.17g', now))
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', string.format('%.17g', now + tonumber(ARGV[3])), ARGV[2])
keep_for(KEYS[1], tonumber(ARGV[4]))
return 1
"""


class RedisConcurrencyLimiter:
    """Slots as members of one sorted set per tenant, scored by lease expiry.

    acquire and refresh are Lua scripts that first drop expired leases, so
    a count never includes a dead gateway's slots for longer than lease_s.
    clock=None uses Redis TIME (one clock for every gateway); a clock passed
    in is sent as ARGV (tests). The set itself expires lease_s after its
    newest lease, so an idle tenant leaves nothing behind.
    """

    def __init__(
        self,
        redis: Redis,
        key_prefix: str = "sluice",
        clock: Clock | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        retry_hint_s: float = DEFAULT_RETRY_HINT_S,
    ) -> None:
        self._redis = redis
        self._prefix = key_prefix
        self._clock = clock
        self._lease_s = lease_s
        self._retry_hint_s = retry_hint_s
        self._acquire = redis.register_script(_ACQUIRE_LUA)
        self._refresh = redis.register_script(_REFRESH_LUA)

    def _key(self, tenant: str) -> str:
        return tenant_key(self._prefix, "concurrency", tenant, "slots")

    def _key_ttl_ms(self) -> int:
        # A second of slack over the lease, as for the rate-limit buckets.
        return to_ms(self._lease_s) + 1000

    async def acquire(self, tenant: str, max_concurrent: int | None) -> ConcurrencySlot | Refusal:
        _check_limit(max_concurrent)
        if max_concurrent is None:
            return ConcurrencySlot(tenant=tenant, slot_id=None)
        slot_id = secrets.token_hex(8)
        granted = await self._acquire(
            keys=[self._key(tenant)],
            args=[clock_arg(self._clock), max_concurrent, slot_id, repr(self._lease_s),
                  self._key_ttl_ms()],
        )
        if not granted:
            return _refusal(tenant, max_concurrent, self._retry_hint_s)
        return ConcurrencySlot(tenant=tenant, slot_id=slot_id)

    async def release(self, slot: ConcurrencySlot) -> None:
        if slot.slot_id is not None:
            await self._redis.zrem(self._key(slot.tenant), slot.slot_id)

    async def refresh(self, slot: ConcurrencySlot) -> bool:
        if slot.slot_id is None:
            return True
        kept = await self._refresh(
            keys=[self._key(slot.tenant)],
            args=[clock_arg(self._clock), slot.slot_id, repr(self._lease_s), self._key_ttl_ms()],
        )
        return bool(kept)
