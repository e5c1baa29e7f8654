"""The one shape every limit in this package refuses with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from sluice.limits.rate_status import RateLimitStatus

RefusalReason = Literal["rate_limit_exceeded", "tenant_concurrency"]
LimitName = Literal["tokens", "requests", "concurrent_requests"]


@dataclass(slots=True, frozen=True)
class Refusal:
    """Why a request may not start now.

    reason: the DESIGN rejection reason (error body `code`, the
      `x-sluice-reject-reason` header); the gateway answers 429.
    limit: which limit refused it.
    retry_after_s: when a retry can succeed (the `Retry-After` header,
      rounded up). None: never at the current limits (a request larger than
      the whole token bucket), so the gateway sends no Retry-After.
    message: for the error body's `message`, in OpenAI's wording.
    """

    reason: RefusalReason
    limit: LimitName
    retry_after_s: float | None
    message: str
    # The rate buckets as they stand (the rate-limit headers); empty for a
    # concurrency refusal or a request larger than the whole bucket.
    rate_status: RateLimitStatus = RateLimitStatus()

    def retry_after_header(self) -> str | None:
        """The HTTP `Retry-After` value: whole seconds, rounded up, at least 1
        (a client told 0 retries at once and is refused again); None when
        no wait helps."""
        if self.retry_after_s is None:
            return None
        return str(max(1, math.ceil(self.retry_after_s)))
