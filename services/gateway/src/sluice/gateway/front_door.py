"""Admission at the gateway and the accounting when a request ends.

    admit:  idempotency key (replay / 409 / begin) -> concurrency slot
            -> token and request buckets (reserve an estimate)
    finish: usage row (finished) or unbilled attempt (cancelled, failed)
            -> idempotency complete (replayable) or abandon (retry runs)
            -> settle the bucket with the exact count -> release the slot

Refusals raise ApiError (409, 429 with Retry-After); whatever was taken
before a refusal is given back.
"""

import asyncio
import json
import logging
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from sluice.gateway.auth import Tenant
from sluice.gateway.errors import ApiError
from sluice.gateway.resources import GatewayResources
from sluice.gateway.settings import GatewaySettings
from sluice.ledger import AttemptRecord, UsageRecord
from sluice.limits import Began, Completed, ConcurrencySlot, InFlight, Refusal, Reservation

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


@dataclass(slots=True)
class Ticket:
    """A request that passed the front door; `finish` must be called once."""

    tenant: Tenant
    request_id: str
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
        raise ApiError(400, f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} printable characters.",
                       "invalid_idempotency_key", param="Idempotency-Key")
    return key


def _refused(refusal: Refusal) -> ApiError:
    return ApiError(429, refusal.message, refusal.reason, retry_after_s=refusal.retry_after_s)


class FrontDoor:
    def __init__(self, resources: GatewayResources, settings: GatewaySettings) -> None:
        self._r = resources
        self._settings = settings

    async def admit(self, tenant: Tenant, idempotency_key: str | None, estimated_tokens: int) -> Ticket | StoredResponse:
        owner = None
        if idempotency_key is not None:
            state = await self._r.idempotency.begin(tenant.name, idempotency_key, self._settings.idempotency_lease_s)
            if isinstance(state, Completed):
                return StoredResponse.from_bytes(state.response)
            if isinstance(state, InFlight):
                raise ApiError(409, "A request with this Idempotency-Key is still in progress; retry when it ends.",
                               "request_in_progress", retry_after_s=max(state.lease_remaining_s, 1.0))
            assert isinstance(state, Began)
            owner = state.owner
        try:
            slot = await self._r.concurrency.acquire(tenant.name, tenant.max_concurrency)
            if isinstance(slot, Refusal):
                raise _refused(slot)
            reservation = await self._r.rate_limiter.reserve(tenant.name, tenant.limits, estimated_tokens)
            if isinstance(reservation, Refusal):
                await self._r.concurrency.release(slot)
                raise _refused(reservation)
        except BaseException:
            if owner is not None:
                await self._r.idempotency.abandon(tenant.name, idempotency_key, owner=owner)
            raise
        request_id = idempotency_key or uuid.uuid4().hex
        ticket = Ticket(tenant, request_id, idempotency_key, owner, slot, reservation)
        ticket.keepalive = asyncio.create_task(self._keep_leases(ticket))
        return ticket

    async def _keep_leases(self, ticket: Ticket) -> None:
        """Extend the in-flight idempotency marker and the concurrency slot
        while the request streams; both expire if this gateway dies."""
        interval_s = self._settings.idempotency_lease_s / 3
        while True:
            await asyncio.sleep(interval_s)
            await self._r.concurrency.refresh(ticket.slot)
            if ticket.owner is not None:
                await self._r.idempotency.refresh(
                    ticket.tenant.name, ticket.idempotency_key, self._settings.idempotency_lease_s, owner=ticket.owner
                )

    async def finish(self, ticket: Ticket, outcome: Outcome | None) -> None:
        """Bill (or record the unbilled attempt), release everything. Idempotent.
        `outcome` None: refused before any model work (nothing to record)."""
        if ticket.finished:
            return
        ticket.finished = True
        if ticket.keepalive is not None:
            ticket.keepalive.cancel()
        tenant = ticket.tenant.name
        now = datetime.now(UTC)
        try:
            if outcome is None:
                if ticket.owner is not None:
                    await self._r.idempotency.abandon(tenant, ticket.idempotency_key, owner=ticket.owner)
            elif outcome.finish_reason is not None:
                record = UsageRecord(
                    tenant=tenant, request_id=ticket.request_id, model=outcome.model,
                    model_version=outcome.model_version, prompt_tokens=outcome.prompt_tokens,
                    cached_tokens=outcome.cached_tokens, output_tokens=outcome.output_tokens,
                    finish_reason=outcome.finish_reason, finished_at=now,
                )
                # Durable before anyone is told the stream finished.
                await asyncio.to_thread(self._r.outbox.append, record)
                if ticket.owner is not None and outcome.replay is not None:
                    await self._r.idempotency.complete(
                        tenant, ticket.idempotency_key, outcome.replay.to_bytes(), self._settings.idempotency_ttl_s,
                        owner=ticket.owner,
                    )
            else:
                await asyncio.to_thread(self._r.outbox.append, AttemptRecord(
                    tenant=tenant, request_id=ticket.request_id, model=outcome.model,
                    model_version=outcome.model_version, prompt_tokens=outcome.prompt_tokens,
                    output_tokens=outcome.output_tokens, outcome="error" if outcome.failed else "cancelled", at=now,
                ))
                if ticket.owner is not None:
                    await self._r.idempotency.abandon(tenant, ticket.idempotency_key, owner=ticket.owner)
        finally:
            used = 0 if outcome is None else outcome.prompt_tokens + outcome.output_tokens
            await self._r.rate_limiter.settle(ticket.reservation, used)
            await self._r.concurrency.release(ticket.slot)
