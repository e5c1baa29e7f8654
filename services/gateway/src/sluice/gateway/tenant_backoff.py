"""Refuse a tenant at the gateway while the scheduler has just said it is at
its cap, instead of tokenizing and placing each of its requests again only
to hear the same answer.

    scheduler: tenant_kv_share, Retry-After 3.2 s  ─▶ remember (tenant, model, tier) until then
    next request of that tenant, model and tier    ─▶ 429 at once, the remaining Retry-After
    one of the tenant's requests ends here         ─▶ forget: it freed what the cap counts

A flood far over its caps then costs a dictionary lookup per request, not a
trip through the router and scheduler, so it cannot take the CPU the other
tenants' streams need. The memory is per gateway process and only ever
shortens what the scheduler said; a request that would have fitted (a
smaller one) may wait out the rest of the Retry-After. The caps count each
class apart, so a batch (flex) refusal never holds back interactive calls.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from sluice.gateway.errors import ApiError
from sluice.outcomes import Reason
from sluice.rpc.errors import ServiceError

TENANT_CAP_REASONS = frozenset({Reason.TENANT_CONCURRENCY, Reason.TENANT_KV_SHARE})
# Never trust a remembered refusal for longer than this: the tenant's own
# requests may end on other gateways, which this one does not see.
MAX_BACKOFF_S = 5.0
MAX_ENTRIES = 10_000


@dataclass(frozen=True, slots=True)
class _Backoff:
    reason: Reason
    message: str
    until_s: float


class TenantBackoff:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[tuple[str, str, str], _Backoff] = {}

    def remember(self, tenant: str, model: str, tier: str, error: ServiceError) -> None:
        info = error.info
        if info.reason not in TENANT_CAP_REASONS or not info.retry_after_s:
            return
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()  # bounded; losing memories only costs a trip to the scheduler
        until_s = self._clock() + min(info.retry_after_s, MAX_BACKOFF_S)
        self._entries[(tenant, model, tier)] = _Backoff(Reason(info.reason), info.message, until_s)

    def check(self, tenant: str, model: str, tier: str) -> ApiError | None:
        entry = self._entries.get((tenant, model, tier))
        if entry is None:
            return None
        remaining_s = entry.until_s - self._clock()
        if remaining_s <= 0:
            del self._entries[(tenant, model, tier)]
            return None
        return ApiError.of(entry.reason, entry.message, retry_after_s=remaining_s)

    def forget(self, tenant: str) -> None:
        for key in [key for key in self._entries if key[0] == tenant]:
            del self._entries[key]
