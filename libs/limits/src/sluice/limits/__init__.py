"""Per-tenant limits the gateway applies before a request reaches the
router: token and request buckets (reserve an estimate, settle with the
exact count), a cap on concurrent requests, and idempotency keys.

Each has an in-process implementation (the embedded default, one gateway)
and a Redis one (many gateways), with the same behaviour. The arithmetic
(`bucket`) is pure: no I/O, the clock passed in.
"""

from sluice.limits.bucket import (
    CHARS_PER_TOKEN,
    BucketState,
    TakeResult,
    credit,
    estimate_tokens,
    full_bucket,
    refill,
    try_take,
)
from sluice.limits.clock import Clock
from sluice.limits.concurrency import (
    ConcurrencyLimiter,
    ConcurrencySlot,
    InProcessConcurrencyLimiter,
    RedisConcurrencyLimiter,
)
from sluice.limits.idempotency import (
    Began,
    Completed,
    IdempotencyStore,
    InFlight,
    InProcessIdempotencyStore,
    RedisIdempotencyStore,
)
from sluice.limits.limiter import (
    InProcessRateLimiter,
    RateLimiter,
    RedisRateLimiter,
    Reservation,
    TenantLimits,
)
from sluice.limits.rate_status import BucketStatus, RateLimitStatus
from sluice.limits.refusal import Refusal

__all__ = [
    "BucketStatus",
    "RateLimitStatus",
    "CHARS_PER_TOKEN",
    "Began",
    "Clock",
    "BucketState",
    "Completed",
    "ConcurrencyLimiter",
    "ConcurrencySlot",
    "IdempotencyStore",
    "InFlight",
    "InProcessConcurrencyLimiter",
    "InProcessIdempotencyStore",
    "InProcessRateLimiter",
    "RateLimiter",
    "RedisConcurrencyLimiter",
    "RedisIdempotencyStore",
    "RedisRateLimiter",
    "Refusal",
    "Reservation",
    "TakeResult",
    "TenantLimits",
    "credit",
    "estimate_tokens",
    "full_bucket",
    "refill",
    "try_take",
]
