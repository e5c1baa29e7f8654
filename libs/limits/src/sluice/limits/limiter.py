"""Per-tenant rate limits: reserve an estimate before a request runs, settle
with the exact count when it ends.

Each tenant has two buckets (see bucket.py): tokens per minute, charged the
estimate at reserve() and corrected at settle(), and requests per minute,
charged one per request. reserve() takes from both or from neither.

Two implementations with the same behaviour (one shared test suite runs
against both):

- InProcessRateLimiter: a dict in the gateway's memory; the embedded
  default for `make run` and a single gateway.
- RedisRateLimiter: state in Redis, one Lua script per operation, so any
  number of gateway replicas share one budget per tenant without races.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis

from sluice.limits._keys import LUA_NOW, clock_arg, tenant_key
from sluice.limits.clock import Clock
from sluice.limits.bucket import BucketState, TakeResult, credit, full_bucket, try_take
from sluice.limits.rate_status import BucketStatus, RateLimitStatus
from sluice.limits.refusal import Refusal



@dataclass(slots=True, frozen=True)
class TenantLimits:
    """A tenant's rate limits; None means that limit is not enforced."""

    tokens_per_minute: int | None = None
    requests_per_minute: int | None = None

    def __post_init__(self) -> None:
        for name in ("tokens_per_minute", "requests_per_minute"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive integer or None, got {value}")


@dataclass(slots=True, frozen=True)
class Reservation:
    """Proof that `estimated_tokens` were taken; pass it to settle() exactly once.

    Carries the limits it was taken under so settle() refills at the same
    rate even if the tenant's configuration changes mid-request."""

    tenant: str
    limits: TenantLimits
    estimated_tokens: int
    status: RateLimitStatus = RateLimitStatus()  # the buckets after taking (the rate-limit headers)


class RateLimiter(Protocol):
    async def reserve(
        self, tenant: str, limits: TenantLimits, estimated_tokens: int
    ) -> Reservation | Refusal:
        """Take one request and `estimated_tokens` from the tenant's buckets,
        or take nothing and say which limit refused and when to retry."""
        ...

    async def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        """Return estimate - actual to the token bucket (or take the excess,
        possibly into debt: see bucket.credit). Call once per reservation,
        whether the request finished, failed or was cancelled."""
        ...


# --- decisions and wording shared by both implementations --------------------

def _too_large(tenant: str, limits: TenantLimits, estimated_tokens: int) -> Refusal | None:
    tpm = limits.tokens_per_minute
    if estimated_tokens < 0:
        raise ValueError(f"estimated_tokens must be >= 0, got {estimated_tokens}")
    if tpm is None or estimated_tokens <= tpm:
        return None
    return Refusal(
        reason="rate_limit_exceeded",
        limit="tokens",
        retry_after_s=None,
        message=(
            f"Request too large for tenant {tenant!r} on tokens per min (TPM): "
            f"Limit {tpm}, Requested {estimated_tokens}. Reduce the prompt or "
            f"max_tokens; this request can never fit the tenant's limit."
        ),
    )


def _settle_delta(reservation: Reservation, actual_tokens: int) -> int:
    """Tokens to give back (negative: to take) at settle."""
    if actual_tokens < 0:
        raise ValueError(f"actual_tokens must be >= 0, got {actual_tokens}")
    return reservation.estimated_tokens - actual_tokens


def _rate_refusal(
    tenant: str, limit: str, limit_value: int, remaining: float, requested: int, retry_after_s: float,
    status: RateLimitStatus,
) -> Refusal:
    label = "tokens per min (TPM)" if limit == "tokens" else "requests per min (RPM)"
    return Refusal(
        reason="rate_limit_exceeded",
        limit=limit,  # type: ignore[arg-type]
        retry_after_s=retry_after_s,
        message=(
            f"Rate limit reached for tenant {tenant!r} on {label}: Limit {limit_value}, "
            f"Remaining {max(0, math.floor(remaining))}, Requested {requested}. "
            f"Please try again in {retry_after_s:.3g}s."
        ),
        rate_status=status,
    )


# --- in-process -------------------------------------------------------------

@dataclass(slots=True)
class _Check:
    """One bucket's answer within a reserve()."""

    name: str
    buckets: dict[str, BucketState]
    limit: int
    amount: int
    result: TakeResult


class InProcessRateLimiter:
    """Buckets in a dict. Safe for any number of tasks on one event loop:
    no method awaits between reading and writing a bucket. Not shared
    between processes (use RedisRateLimiter for more than one gateway)."""

    # Forget buckets that refilled to full every this many reserves, so a
    # gateway that has seen many tenants does not keep them all forever.
    _SWEEP_EVERY = 1024

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        # Written only by reserve()/settle() of this instance.
        self._token_buckets: dict[str, BucketState] = {}
        self._request_buckets: dict[str, BucketState] = {}
        self._ops_since_sweep = 0

    async def reserve(
        self, tenant: str, limits: TenantLimits, estimated_tokens: int
    ) -> Reservation | Refusal:
        too_large = _too_large(tenant, limits, estimated_tokens)
        if too_large is not None:
            return too_large
        now_s = self._clock()
        self._maybe_sweep(now_s)
        checks = [
            _Check(name, buckets, limit, amount,
                   try_take(buckets.get(tenant) or full_bucket(limit, now_s), amount, limit, now_s))
            for name, buckets, limit, amount in (
                ("tokens", self._token_buckets, limits.tokens_per_minute, estimated_tokens),
                ("requests", self._request_buckets, limits.requests_per_minute, 1),
            )
            if limit is not None
        ]
        refused = [c for c in checks if not c.result.allowed]
        if refused:
            # Both buckets must allow it, so the longer wait is the real one
            # (ties name the token limit, as the Lua script does). Nothing
            # was taken: the status is the buckets as they stand.
            # (A check that allowed would have taken its amount: add it back.)
            now = {c.name: BucketStatus(c.limit, c.result.state.tokens + (c.amount if c.result.allowed else 0))
                   for c in checks}
            worst = max(refused, key=lambda c: c.result.retry_after_s)
            return _rate_refusal(
                tenant, worst.name, worst.limit, worst.result.state.tokens, worst.amount,
                worst.result.retry_after_s, RateLimitStatus(now.get("tokens"), now.get("requests")),
            )
        taken = {c.name: BucketStatus(c.limit, c.result.state.tokens) for c in checks}
        for check in checks:
            check.buckets[tenant] = check.result.state
        return Reservation(tenant=tenant, limits=limits, estimated_tokens=estimated_tokens,
                           status=RateLimitStatus(taken.get("tokens"), taken.get("requests")))

    async def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        tpm = reservation.limits.tokens_per_minute
        delta = _settle_delta(reservation, actual_tokens)
        if tpm is None or delta == 0:
            return
        now_s = self._clock()
        state = self._token_buckets.get(reservation.tenant) or full_bucket(tpm, now_s)
        self._token_buckets[reservation.tenant] = credit(state, delta, tpm, now_s)

    def _maybe_sweep(self, now_s: float) -> None:
        self._ops_since_sweep += 1
        if self._ops_since_sweep < self._SWEEP_EVERY:
            return
        self._ops_since_sweep = 0
        # Any bucket is full again two minutes after its last update (from
        # the debt floor of -limit at limit/60 per second), and a full bucket
        # means the same as a missing one, so those can go.
        for buckets in (self._token_buckets, self._request_buckets):
            stale = [t for t, s in buckets.items() if now_s - s.updated_at_s > 120.0]
            for tenant in stale:
                del buckets[tenant]


# --- Redis ------------------------------------------------------------------

# Shared Lua prelude: the clock, and bucket.refill/store in Lua. Keep the
# arithmetic in the same order as bucket.py so both round identically.
_LUA_PRELUDE = LUA_NOW + """
local function fmt(x) return string.format('%.17g', x) end

local function refilled(key, limit)
  local v = redis.call('HMGET', key, 'tokens', 'updated_at_s')
  local tokens, updated = tonumber(v[1]), tonumber(v[2])
  if tokens == nil or updated == nil then return limit, now end
  local elapsed = math.max(0, now - updated)
  return math.min(limit, tokens + elapsed * limit / 60), math.max(now, updated)
end

-- A bucket that has refilled to full means the same as no key, so the key
-- may expire then (bucket.idle_expiry_s), plus a second of slack.
local function store(key, limit, tokens, updated)
  redis.call('HSET', key, 'tokens', fmt(tokens), 'updated_at_s', fmt(updated))
  redis.call('PEXPIRE', key, math.ceil((limit - tokens) * 60 / limit * 1000) + 1000)
end
"""

# KEYS: token bucket, request bucket. ARGV: now_s|'', tpm|'', rpm|'', tokens.
# Returns {'ok', tokens_left|'', requests_left|''} or
# {'refused', limit, retry_after_s, remaining, tokens_now|'', requests_now|''}.
_RESERVE_LUA = _LUA_PRELUDE + """
local amount = tonumber(ARGV[4])
local checks = {
  {KEYS[1], tonumber(ARGV[2]), amount, 'tokens'},
  {KEYS[2], tonumber(ARGV[3]), 1, 'requests'},
}
local worst_wait, worst_name, worst_remaining = nil, nil, nil
for _, c in ipairs(checks) do
  local limit = c[2]
  if limit then
    local tokens, updated = refilled(c[1], limit)
    c[5], c[6] = tokens, updated
    if tokens < c[3] then
      local wait = (c[3] - tokens) * 60 / limit
      if worst_wait == nil or wait > worst_wait then
        worst_wait, worst_name, worst_remaining = wait, c[4], tokens
      end
    end
  end
end
local function level(c, taken)
  if not c[2] then return '' end
  return fmt(c[5] - taken)
end
if worst_wait ~= nil then
  return {'refused', worst_name, fmt(worst_wait), fmt(worst_remaining), level(checks[1], 0), level(checks[2], 0)}
end
for _, c in ipairs(checks) do
  if c[2] then store(c[1], c[2], c[5] - c[3], c[6]) end
end
return {'ok', level(checks[1], checks[1][3]), level(checks[2], checks[2][3])}
"""

# KEYS: token bucket. ARGV: now_s|'', tpm, delta (estimate - actual).
_SETTLE_LUA = _LUA_PRELUDE + """
local limit = tonumber(ARGV[2])
local tokens, updated = refilled(KEYS[1], limit)
tokens = math.min(limit, math.max(-limit, tokens + tonumber(ARGV[3])))
store(KEYS[1], limit, tokens, updated)
return 1
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _status(tpm: int | None, rpm: int | None, tokens_left: bytes | str, requests_left: bytes | str) -> RateLimitStatus:
    """The script's bucket levels ('' where the tenant has no such limit)."""
    def bucket(limit: int | None, left: bytes | str) -> BucketStatus | None:
        return None if limit is None or not _text(left) else BucketStatus(limit, float(_text(left)))
    return RateLimitStatus(bucket(tpm, tokens_left), bucket(rpm, requests_left))


class RedisRateLimiter:
    """Buckets in Redis hashes, shared by every gateway using `key_prefix`.

    Each operation is one Lua script, so check-and-take of both buckets is
    atomic across gateways. clock=None uses Redis TIME inside the script:
    one clock for all gateways, no skew. A clock passed in (tests, the
    simulator) is sent as ARGV instead, which makes the script
    deterministic. Do not mix the two on one prefix.
    """

    def __init__(self, redis: Redis, key_prefix: str = "sluice", clock: Clock | None = None) -> None:
        self._redis = redis
        self._prefix = key_prefix
        self._clock = clock
        self._reserve = redis.register_script(_RESERVE_LUA)
        self._settle = redis.register_script(_SETTLE_LUA)

    def _key(self, tenant: str, bucket: str) -> str:
        return tenant_key(self._prefix, "ratelimit", tenant, bucket)

    async def reserve(
        self, tenant: str, limits: TenantLimits, estimated_tokens: int
    ) -> Reservation | Refusal:
        too_large = _too_large(tenant, limits, estimated_tokens)
        if too_large is not None:
            return too_large
        tpm, rpm = limits.tokens_per_minute, limits.requests_per_minute
        if tpm is None and rpm is None:
            return Reservation(tenant=tenant, limits=limits, estimated_tokens=estimated_tokens)
        reply = await self._reserve(
            keys=[self._key(tenant, "tokens"), self._key(tenant, "requests")],
            args=[clock_arg(self._clock), "" if tpm is None else tpm, "" if rpm is None else rpm,
                  estimated_tokens],
        )
        if _text(reply[0]) == "ok":
            return Reservation(tenant=tenant, limits=limits, estimated_tokens=estimated_tokens,
                               status=_status(tpm, rpm, reply[1], reply[2]))
        name = _text(reply[1])
        limit_value = tpm if name == "tokens" else rpm
        requested = estimated_tokens if name == "tokens" else 1
        return _rate_refusal(
            tenant, name, limit_value, float(_text(reply[3])), requested, float(_text(reply[2])),
            _status(tpm, rpm, reply[4], reply[5]),
        )

    async def settle(self, reservation: Reservation, actual_tokens: int) -> None:
        tpm = reservation.limits.tokens_per_minute
        delta = _settle_delta(reservation, actual_tokens)
        if tpm is None or delta == 0:
            return
        await self._settle(
            keys=[self._key(reservation.tenant, "tokens")],
            args=[clock_arg(self._clock), tpm, delta],
        )


__all__ = [
    "Clock",
    "InProcessRateLimiter",
    "RateLimiter",
    "RedisRateLimiter",
    "Reservation",
    "TenantLimits",
]
