"""Idempotency keys: one attempt at a time per (tenant, key), and a finished
response replayed to retries for a while.

Life of a key:

    (absent) --begin--> in flight (owner token, lease) --complete--> completed (bytes, TTL)
        ^                   |  |                                        |
        +----abandon--------+  +--lease expires (owner died)            +--TTL expires
        +-------------------------------------------------------------------+

begin() answers Began (this attempt runs; keep its owner token), InFlight
(another attempt holds the key: the gateway answers 409) or Completed (the
stored response: the gateway replays it and bills nothing). Every write
after begin() names the owner token, so an attempt whose lease expired and
whose key a retry has since taken cannot complete, abandon or refresh over
the new owner. complete() also succeeds when the key is absent (our lease
ran out but no retry began): the response is finished and worth keeping.

The owner refresh()es the lease while it streams; a lease a little longer
than the refresh interval bounds how long a crashed gateway blocks retries.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis

from sluice.limits._keys import tenant_key, to_ms
from sluice.limits.clock import Clock



@dataclass(slots=True, frozen=True)
class Began:
    """This attempt holds the key; pass `owner` to complete/abandon/refresh."""

    owner: str


@dataclass(slots=True, frozen=True)
class InFlight:
    """Another attempt holds the key (answer 409); its lease ends within
    lease_remaining_s unless it refreshes."""

    lease_remaining_s: float


@dataclass(slots=True, frozen=True)
class Completed:
    """A finished attempt's stored response, to replay as is."""

    response: bytes


BeginResult = Began | InFlight | Completed


class IdempotencyStore(Protocol):
    async def begin(self, tenant: str, key: str, lease_s: float) -> BeginResult:
        ...

    async def complete(
        self, tenant: str, key: str, response: bytes, ttl_s: float, *, owner: str
    ) -> bool:
        """Store the response for ttl_s; False if another attempt owns the key."""
        ...

    async def abandon(self, tenant: str, key: str, *, owner: str) -> bool:
        """Release the key so a retry runs; False if we no longer own it."""
        ...

    async def refresh(self, tenant: str, key: str, lease_s: float, *, owner: str) -> bool:
        """Extend our lease to lease_s from now; False if we no longer own it."""
        ...


def _check_positive(name: str, seconds: float) -> None:
    if not seconds > 0:
        raise ValueError(f"{name} must be > 0 seconds, got {seconds}")


# --- in-process -------------------------------------------------------------

@dataclass(slots=True)
class _Entry:
    owner: str | None  # set while in flight
    response: bytes | None  # set once completed
    expires_at_s: float


class InProcessIdempotencyStore:
    """Entries in a dict, expired on the injected clock. Safe for any number
    of tasks on one event loop (no method awaits)."""

    # Drop expired entries every this many begin() calls, so memory follows
    # the live keys rather than every key ever seen.
    _SWEEP_EVERY = 1024

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        # (tenant, key) -> entry; written only by this instance.
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._begins_since_sweep = 0

    def _live(self, tenant: str, key: str, now_s: float) -> _Entry | None:
        entry = self._entries.get((tenant, key))
        if entry is not None and entry.expires_at_s <= now_s:
            del self._entries[(tenant, key)]
            return None
        return entry

    def _owned(self, tenant: str, key: str, owner: str, now_s: float) -> _Entry | None:
        entry = self._live(tenant, key, now_s)
        return entry if entry is not None and entry.owner == owner else None

    async def begin(self, tenant: str, key: str, lease_s: float) -> BeginResult:
        _check_positive("lease_s", lease_s)
        now_s = self._clock()
        self._maybe_sweep(now_s)
        entry = self._live(tenant, key, now_s)
        if entry is None:
            owner = secrets.token_hex(16)
            self._entries[(tenant, key)] = _Entry(owner, None, now_s + lease_s)
            return Began(owner=owner)
        if entry.response is not None:
            return Completed(response=entry.response)
        return InFlight(lease_remaining_s=entry.expires_at_s - now_s)

    async def complete(
        self, tenant: str, key: str, response: bytes, ttl_s: float, *, owner: str
    ) -> bool:
        _check_positive("ttl_s", ttl_s)
        now_s = self._clock()
        entry = self._live(tenant, key, now_s)
        if entry is not None and entry.owner != owner:
            return False
        self._entries[(tenant, key)] = _Entry(None, bytes(response), now_s + ttl_s)
        return True

    async def abandon(self, tenant: str, key: str, *, owner: str) -> bool:
        if self._owned(tenant, key, owner, self._clock()) is None:
            return False
        del self._entries[(tenant, key)]
        return True

    async def refresh(self, tenant: str, key: str, lease_s: float, *, owner: str) -> bool:
        _check_positive("lease_s", lease_s)
        now_s = self._clock()
        entry = self._owned(tenant, key, owner, now_s)
        if entry is None:
            return False
        entry.expires_at_s = now_s + lease_s
        return True

    def _maybe_sweep(self, now_s: float) -> None:
        self._begins_since_sweep += 1
        if self._begins_since_sweep < self._SWEEP_EVERY:
            return
        self._begins_since_sweep = 0
        for k in [k for k, e in self._entries.items() if e.expires_at_s <= now_s]:
            del self._entries[k]


# --- Redis ------------------------------------------------------------------
#
# One string per (tenant, key): b"I" + owner token while in flight (SET NX
# PX lease), b"C" + response bytes once completed (PX ttl). Expiry is Redis's
# own, so a dead owner's marker disappears without anyone cleaning up.

_IN_FLIGHT, _COMPLETED = b"I", b"C"

# KEYS: the key. ARGV: in-flight marker, lease ms.
_BEGIN_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {'began'} end
local v = redis.call('GET', KEYS[1])
if string.sub(v, 1, 1) == 'I' then return {'in_flight', redis.call('PTTL', KEYS[1])} end
return {'completed', string.sub(v, 2)}
"""

# KEYS: the key. ARGV: our in-flight marker, completed value, ttl ms.
_COMPLETE_LUA = """
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"""

# KEYS: the key. ARGV: our in-flight marker, lease ms ('' = delete).
_IF_OWNER_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisIdempotencyStore:
    """The state machine above in Redis; each step is one atomic command or
    Lua script. The client must return bytes (decode_responses=False, the
    redis-py default): stored responses are arbitrary bytes."""

    def __init__(self, redis: Redis, key_prefix: str = "sluice") -> None:
        self._redis = redis
        self._prefix = key_prefix
        self._begin = redis.register_script(_BEGIN_LUA)
        self._complete = redis.register_script(_COMPLETE_LUA)
        self._if_owner = redis.register_script(_IF_OWNER_LUA)

    def _key(self, tenant: str, key: str) -> str:
        return tenant_key(self._prefix, "idempotency", tenant, key)

    async def begin(self, tenant: str, key: str, lease_s: float) -> BeginResult:
        _check_positive("lease_s", lease_s)
        owner = secrets.token_hex(16)
        reply = await self._begin(
            keys=[self._key(tenant, key)], args=[_IN_FLIGHT + owner.encode(), to_ms(lease_s)]
        )
        state = _text(reply[0])
        if state == "began":
            return Began(owner=owner)
        if state == "in_flight":
            return InFlight(lease_remaining_s=max(0, int(reply[1])) / 1000)
        response = reply[1]
        if isinstance(response, str):
            raise TypeError("RedisIdempotencyStore needs a client with decode_responses=False")
        return Completed(response=response)

    async def complete(
        self, tenant: str, key: str, response: bytes, ttl_s: float, *, owner: str
    ) -> bool:
        _check_positive("ttl_s", ttl_s)
        stored = await self._complete(
            keys=[self._key(tenant, key)],
            args=[_IN_FLIGHT + owner.encode(), _COMPLETED + bytes(response), to_ms(ttl_s)],
        )
        return bool(stored)

    async def abandon(self, tenant: str, key: str, *, owner: str) -> bool:
        released = await self._if_owner(
            keys=[self._key(tenant, key)], args=[_IN_FLIGHT + owner.encode(), ""]
        )
        return bool(released)

    async def refresh(self, tenant: str, key: str, lease_s: float, *, owner: str) -> bool:
        _check_positive("lease_s", lease_s)
        kept = await self._if_owner(
            keys=[self._key(tenant, key)], args=[_IN_FLIGHT + owner.encode(), to_ms(lease_s)]
        )
        return bool(kept)
