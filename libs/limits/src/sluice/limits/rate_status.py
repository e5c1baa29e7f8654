"""Where a tenant's buckets stand after a request took from them (or was
refused), as OpenAI's rate-limit headers say it:

    x-ratelimit-limit-requests: 60        x-ratelimit-limit-tokens: 150000
    x-ratelimit-remaining-requests: 59    x-ratelimit-remaining-tokens: 149984
    x-ratelimit-reset-requests: 1s        x-ratelimit-reset-tokens: 6ms

"reset" is the time until the bucket is full again (its initial state) at
the refill rate of limit/60 per second, written as a Go duration the way
OpenAI writes it. A bucket in debt (a settle that took more than the
estimate) reports 0 remaining and a reset past a minute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class BucketStatus:
    limit: int  # per minute
    remaining: float  # may be negative: a debt

    @property
    def reset_s(self) -> float:
        return max(0.0, self.limit - self.remaining) * 60.0 / self.limit


@dataclass(slots=True, frozen=True)
class RateLimitStatus:
    tokens: BucketStatus | None = None  # None: the tenant has no such limit
    requests: BucketStatus | None = None

    def headers(self) -> dict[str, str]:
        headers = {}
        for name, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            if bucket is None:
                continue
            headers[f"x-ratelimit-limit-{name}"] = str(bucket.limit)
            headers[f"x-ratelimit-remaining-{name}"] = str(max(0, math.floor(bucket.remaining)))
            headers[f"x-ratelimit-reset-{name}"] = go_duration(bucket.reset_s)
        return headers


def go_duration(seconds: float) -> str:
    """0 -> "0s", 0.0061 -> "6ms", 1.5 -> "1.5s", 360 -> "6m0s", 3725 -> "1h2m5s"."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    if seconds < 60:
        return f"{math.ceil(seconds * 1000) / 1000:g}s"
    whole = math.ceil(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + f"{minutes}m{secs}s"
