"""Refuse a tenant at the gateway while the scheduler has just said it is at
its cap, instead of tokenizing and placing each of its requests again only
to hear the same answer.

    scheduler: tenant_kv_share, Retry-After 3.2 s  ─▶ remember (tenant, model, tier) until then
    next request of that tenant, model and tier    ─▶ 429 at once, the remaining Retry-After
    one of the tenant's requests ends here         ─▶ one pass: the next request goes to the
                                                      scheduler (the room one request freed)
    the scheduler refuses that one too             ─▶ remember afresh, no passes
    ... or refuses it for another reason (413)     ─▶ the pass comes back: the room is unused
    the remembered wait is over                    ─▶ one probe goes to the scheduler; the
                                                      rest are still refused until it is answered
    the probe is refused at the cap                ─▶ remember afresh
    ... admitted, no one refused meanwhile         ─▶ forget
    ... admitted, others refused meanwhile         ─▶ the next request is the next probe: one
                                                      trip to the scheduler at a time
    ... refused with a wait for another reason     ─▶ forget: the cap is not what binds
    ... refused for itself (400, 413), or never
        asked (bucket, replay, caller left)        ─▶ the next request probes
    nothing refused for MAX_BACKOFF_S past the wait ─▶ forget

A flood far over its caps then costs a dictionary lookup per request, not a
trip through the router and scheduler, so it cannot take the CPU the other
tenants' streams need. One ending request lets one through, not all: a
flood of 64 callers would otherwise send its whole herd to the router and
scheduler each time one of its streams ends (measured: ~20 refusals there
per finish, arriving together, ahead of other tenants' requests). For the
same reason the end of a remembered wait lets one probe through, not the
herd: forgetting at once sent every caller in the window before the
scheduler's next refusal came back, as many as the tenant's bucket had
refilled during the wait (10-16 long prompts within 100 ms every few
seconds, traced), and a quiet tenant's request queued behind their
tokenization in the router for ~100 ms. A probe whose answer never comes
(its caller left while it queued) is replaced after PROBE_TIMEOUT_S. The
memory is per gateway process and only ever shortens what the scheduler
said; a request that would have fitted (a smaller one) may wait out the
rest of the Retry-After. The caps count each class apart, so a batch (flex)
refusal never holds back interactive calls.

Refusals from memory are spread as the scheduler spreads its own: the
first is told the remembered Retry-After, each next one a slot later by
the interval at which the tenant's requests have been ending here (a
smoothed average). Callers that honour Retry-After then come back about
one per freed place instead of together.
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
# A probe not answered within this long (its caller left while it queued)
# is replaced by the next request; meanwhile callers are told to come back
# no sooner than PROBE_RETRY_S.
PROBE_TIMEOUT_S = 5.0
PROBE_RETRY_S = 0.25
# Smoothing of the interval between a tenant's request ends (~the last 5).
END_INTERVAL_WEIGHT = 0.2


@dataclass(slots=True)
class _Backoff:
    reason: Reason
    message: str
    until_s: float
    passes: int = 0  # requests to let through to the scheduler: one per ending request
    next_slot_s: float = 0.0  # when the next caller refused from memory is told to return
    probe_until_s: float | None = None  # a probe is out (the wait ended): wait for it until then
    refused_while_probing: int = 0
    last_refused_s: float = 0.0


class TenantBackoff:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: dict[tuple[str, str, str], _Backoff] = {}
        # tenant -> (when its last request ended here, smoothed interval between ends)
        self._ends: dict[str, tuple[float, float | None]] = {}

    def remember(self, tenant: str, model: str, tier: str, error: ServiceError) -> None:
        """The scheduler (or a hop before it) refused one of the tenant's
        requests: a tenant cap is remembered afresh; any other refusal did
        not use the room a pass stood for, so the pass comes back."""
        info = error.info
        key = (tenant, model, tier)
        if info.reason not in TENANT_CAP_REASONS or not info.retry_after_s:
            entry = self._entries.get(key)
            if entry is None:
                return
            if entry.probe_until_s is not None and info.retry_after_s:
                del self._entries[key]  # another limit with a wait (the pool's) binds, not the cap
            elif entry.probe_until_s is not None:
                entry.probe_until_s = None  # a refusal of this request alone (400, 413): the next one probes
            else:
                entry.passes += 1  # at worst one extra trip to the scheduler
            return
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()  # bounded; losing memories only costs a trip to the scheduler
        until_s = self._clock() + min(info.retry_after_s, MAX_BACKOFF_S)
        self._entries[key] = _Backoff(Reason(info.reason), info.message, until_s, next_slot_s=until_s)

    def check(self, tenant: str, model: str, tier: str) -> ApiError | None:
        entry = self._entries.get((tenant, model, tier))
        if entry is None:
            return None
        now_s = self._clock()
        probing = entry.probe_until_s is not None and entry.probe_until_s > now_s
        if entry.until_s <= now_s and not probing:
            if now_s - max(entry.until_s, entry.last_refused_s) >= MAX_BACKOFF_S:
                del self._entries[(tenant, model, tier)]  # stale: nothing refused for a while
                return None
            entry.probe_until_s = now_s + PROBE_TIMEOUT_S  # this request is the probe
            entry.refused_while_probing = 0
            return None
        if entry.passes:
            entry.passes -= 1
            return None
        if probing:
            entry.refused_while_probing += 1
        entry.last_refused_s = now_s
        at_s = max(entry.next_slot_s, entry.until_s, now_s + PROBE_RETRY_S if probing else now_s)
        entry.next_slot_s = at_s + self._end_interval_s(tenant)
        return ApiError.of(entry.reason, entry.message, retry_after_s=at_s - now_s)

    def admitted(self, tenant: str, model: str, tier: str) -> None:
        """One of the tenant's requests was admitted. A probe's admission
        ends the memory when no one waited on it; otherwise the next
        request is the next probe (one trip to the scheduler at a time)."""
        key = (tenant, model, tier)
        entry = self._entries.get(key)
        if entry is None or entry.probe_until_s is None:
            return
        if not entry.refused_while_probing:
            del self._entries[key]
            return
        entry.probe_until_s = None
        entry.until_s = self._clock()  # still past: the next request probes; staleness counts from here

    def abandoned(self, tenant: str, model: str, tier: str) -> None:
        """A request let through ended before the scheduler answered it (the
        bucket refused it, a replay answered it, its caller left): the probe
        it may have been is released, and the next request probes. (If it
        was a pass while another request probes, that probe is released
        too: at worst one more trip to the scheduler.)"""
        entry = self._entries.get((tenant, model, tier))
        if entry is not None:
            entry.probe_until_s = None

    def _end_interval_s(self, tenant: str) -> float:
        """The smoothed interval between the tenant's request ends here; 0
        until two have been seen (refusals are then not spread)."""
        _, interval_s = self._ends.get(tenant, (None, None))
        return interval_s or 0.0

    def freed(self, tenant: str) -> None:
        """One of the tenant's requests ended: the next of its requests (per
        model and tier remembered) may ask the scheduler again."""
        now_s = self._clock()
        last_s, interval_s = self._ends.get(tenant, (None, None))
        if last_s is not None:
            sample_s = now_s - last_s
            interval_s = sample_s if interval_s is None else interval_s + END_INTERVAL_WEIGHT * (sample_s - interval_s)
        if len(self._ends) >= MAX_ENTRIES and tenant not in self._ends:
            self._ends.clear()
        self._ends[tenant] = (now_s, interval_s)
        for key, entry in self._entries.items():
            if key[0] == tenant:
                entry.passes += 1
