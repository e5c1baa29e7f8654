"""Admission at the gateway and the accounting when a request ends.

    admit:  idempotency key (replay / 409 / begin) -> concurrency slot
            -> token and request buckets (reserve an estimate)
    finish: usage row (finished) or unbilled attempt (cancelled, failed)
            -> idempotency complete (replayable) or abandon (retry runs)
            -> settle the bucket with the exact count -> release the slot

Refusals raise ApiError (409, 429 with Retry-After); whatever was taken
before a refusal is given back. An unreachable Redis is no refusal: the
limits fail open to this gateway's share in memory (sluice.limits.fail_open);
the 503 below is only for a store error those wrappers let through.
Each cleanup step of `finish` runs even if an earlier one fails.

Ids: the ledger's request id is the Idempotency-Key (one billed row per key
and tenant) or, without a key, the attempt id. The attempt id, unique per
attempt, is what the router, scheduler and replica key by: they are shared
by all tenants, and a retry must never be confused with the attempt it
replaces (a late cancel of the old one must not hit the new one).
"""

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

from sluice.gateway.auth import Tenant
from sluice.gateway.errors import ApiError, error_for_reason
from sluice.gateway.resources import GatewayResources
from sluice.gateway.settings import GatewaySettings
from sluice.ledger import AttemptRecord, UsageRecord
from redis.exceptions import RedisError

from sluice.limits import Began, Completed, ConcurrencySlot, InFlight, Refusal, Reservation
from sluice.outcomes import Reason

log = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY_CHARS = 255


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A finished response as kept for replay (no prompt text)."""

    response_id: str
    created_unix_s: int
    model: str
    model_version: str
    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "StoredResponse":
        return cls(**json.loads(raw))


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended, as the accounting needs it."""

    model: str
    model_version: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    finish_reason: str | None  # "stop" / "length"; None = cancelled or failed
    failed: bool = False
    replay: StoredResponse | None = None  # kept only for idempotent requests
    service_class: str = "interactive"  # "batch" for service_tier flex: priced at the batch discount


@dataclass(slots=True)
class Ticket:
    """A request that passed the front door; `finish` must be called once."""

    tenant: Tenant
    attempt_id: str  # unique per attempt: the id the router, scheduler and replica see
    ledger_id: str  # the billing row's request id: the Idempotency-Key, else attempt_id
    idempotency_key: str | None
    owner: str | None
    slot: ConcurrencySlot
    reservation: Reservation
    keepalive: asyncio.Task[None] | None = field(default=None, repr=False)
    finished: bool = False


def idempotency_key_from(header: str | None) -> str | None:
    if header is None:
        return None
    key = header.strip()
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS or not key.isprintable():
        raise ApiError.of(Reason.INVALID_IDEMPOTENCY_KEY,
                          f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} printable characters.",
                          param="Idempotency-Key")
    return key


def _refused(refusal: Refusal) -> ApiError:
    """A bucket or concurrency refusal (sluice.limits names a Reason), with
    the rate-limit headers where the buckets answered."""
    error = error_for_reason(refusal.reason, refusal.message, status_if_unknown=429,
                             retry_after_s=refusal.retry_after_s)
    return replace(error, headers={**error.headers, **refusal.rate_status.headers()})


class FrontDoor:
    def __init__(self, resources: GatewayResources, settings: GatewaySettings) -> None:
        self._r = resources
        self._settings = settings

    async def admit(self, tenant: Tenant, idempotency_key: str | None, estimated_tokens: int) -> Ticket | StoredResponse:
        try:
            return await self._admit(tenant, idempotency_key, estimated_tokens)
        except (RedisError, OSError) as error:
            log.error("limits store unreachable: %r", error)
            raise ApiError.of(Reason.LIMITS_UNAVAILABLE, "Rate limits cannot be checked right now; retry shortly.",
                              retry_after_s=1.0) from None

    async def _admit(self, tenant: Tenant, idempotency_key: str | None, estimated_tokens: int) -> Ticket | StoredResponse:
        owner = None
        slot = None
        if idempotency_key is not None:
            state = await self._r.idempotency.begin(tenant.name, idempotency_key, self._settings.idempotency_lease_s)
            if isinstance(state, Completed):
                return StoredResponse.from_bytes(state.response)
            if isinstance(state, InFlight):
                raise ApiError.of(Reason.REQUEST_IN_PROGRESS,
                                  "A request with this Idempotency-Key is still in progress; retry when it ends.",
                                  retry_after_s=max(state.lease_remaining_s, 1.0))
            assert isinstance(state, Began)
            owner = state.owner
        try:
            slot = await self._r.concurrency.acquire(tenant.name, tenant.max_concurrency)
            if isinstance(slot, Refusal):
                raise _refused(slot)
            reservation = await self._r.rate_limiter.reserve(tenant.name, tenant.limits, estimated_tokens)
            if isinstance(reservation, Refusal):
                raise _refused(reservation)
        except BaseException:
            if isinstance(slot, ConcurrencySlot):
                await _quietly(self._r.concurrency.release(slot), "release slot")
            if owner is not None:
                await _quietly(self._r.idempotency.abandon(tenant.name, idempotency_key, owner=owner), "abandon key")
            raise
        attempt_id = uuid.uuid4().hex
        ticket = Ticket(tenant, attempt_id, idempotency_key or attempt_id, idempotency_key, owner, slot, reservation)
        ticket.keepalive = asyncio.create_task(self._keep_leases(ticket))
        return ticket

    async def _keep_leases(self, ticket: Ticket) -> None:
        """Extend the in-flight idempotency marker and the concurrency slot
        while the request streams; both expire if this gateway dies."""
        interval_s = self._settings.idempotency_lease_s / 3
        while True:
            await asyncio.sleep(interval_s)
            try:
                if not await self._r.concurrency.refresh(ticket.slot):
                    log.warning("request %s lost its concurrency slot lease", ticket.attempt_id)
                if ticket.owner is not None and not await self._r.idempotency.refresh(
                    ticket.tenant.name, ticket.idempotency_key, self._settings.idempotency_lease_s, owner=ticket.owner
                ):
                    log.warning("request %s lost its idempotency lease", ticket.attempt_id)
            except (RedisError, OSError) as error:  # retried at the next interval
                log.warning("could not refresh leases of %s: %r", ticket.attempt_id, error)

    async def finish(self, ticket: Ticket, outcome: Outcome | None) -> None:
        """Bill (or record the unbilled attempt), release everything. Idempotent.
        `outcome` None: refused before any model work (nothing to record).
        Raises only if the usage row could not be made durable."""
        if ticket.finished:
            return
        ticket.finished = True
        if ticket.keepalive is not None:
            ticket.keepalive.cancel()
        tenant, key, owner = ticket.tenant.name, ticket.idempotency_key, ticket.owner
        now = datetime.now(UTC)
        try:
            if outcome is not None and outcome.finish_reason is not None:
                record = UsageRecord(
                    tenant=tenant, request_id=ticket.ledger_id, model=outcome.model,
                    model_version=outcome.model_version, prompt_tokens=outcome.prompt_tokens,
                    cached_tokens=outcome.cached_tokens, output_tokens=outcome.output_tokens,
                    finish_reason=outcome.finish_reason, finished_at=now, service_class=outcome.service_class,
                )
                # Durable before anyone is told the stream finished.
                await asyncio.to_thread(self._r.outbox.append, record)
                if owner is not None and outcome.replay is not None:
                    await _quietly(self._r.idempotency.complete(
                        tenant, key, outcome.replay.to_bytes(), self._settings.idempotency_ttl_s, owner=owner,
                    ), "store the response for replay")
            else:
                if outcome is not None:
                    attempt = AttemptRecord(
                        tenant=tenant, request_id=ticket.ledger_id, model=outcome.model,
                        model_version=outcome.model_version, prompt_tokens=outcome.prompt_tokens,
                        output_tokens=outcome.output_tokens, outcome="error" if outcome.failed else "cancelled",
                        at=now, service_class=outcome.service_class,
                    )
                    await _quietly(asyncio.to_thread(self._r.outbox.append, attempt), "record the attempt")
                if owner is not None:
                    await _quietly(self._r.idempotency.abandon(tenant, key, owner=owner), "release the key")
        finally:
            used = 0 if outcome is None else outcome.prompt_tokens + outcome.output_tokens
            await _quietly(self._r.rate_limiter.settle(ticket.reservation, used), "settle the bucket")
            await _quietly(self._r.concurrency.release(ticket.slot), "release the slot")


async def _quietly(step: Awaitable[object], what: str) -> None:
    """One cleanup step; a failure is logged and does not skip the next."""
    try:
        await step
    except Exception:
        log.exception("could not %s", what)
