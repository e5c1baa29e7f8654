"""The front door with in-process limits: refusals give back what was taken,
an unreachable limits store is a clear 503, and finish always releases."""

from types import SimpleNamespace

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from sluice.gateway.auth import Tenant
from sluice.gateway.errors import ApiError
from sluice.gateway.front_door import FrontDoor, Outcome, Ticket
from sluice.gateway.settings import GatewaySettings
from sluice.limits import (
    InProcessConcurrencyLimiter,
    InProcessIdempotencyStore,
    InProcessRateLimiter,
    TenantLimits,
)


class RecordingOutbox:
    def __init__(self) -> None:
        self.records = []

    def append(self, record) -> None:
        self.records.append(record)


class BrokenLimiter:
    async def reserve(self, *args, **kwargs):
        raise RedisConnectionError("redis is down")


def door(**overrides) -> tuple[FrontDoor, SimpleNamespace]:
    parts = {
        "rate_limiter": InProcessRateLimiter(), "concurrency": InProcessConcurrencyLimiter(),
        "idempotency": InProcessIdempotencyStore(), "outbox": RecordingOutbox(), **overrides,
    }
    resources = SimpleNamespace(**parts)
    return FrontDoor(resources, GatewaySettings()), resources


TENANT = Tenant("acme", limits=TenantLimits(tokens_per_minute=1000), max_concurrency=1)


async def test_unreachable_limits_store_is_503_and_releases_slot_and_key():
    broken, resources = door(rate_limiter=BrokenLimiter())
    with pytest.raises(ApiError) as refused:
        await broken.admit(TENANT, "key-1", 10)
    assert (refused.value.status, refused.value.code) == (503, "limits_unavailable")
    # Same slot and key stores, working buckets: neither is held by the failed attempt.
    healthy, _ = door(concurrency=resources.concurrency, idempotency=resources.idempotency)
    ticket = await healthy.admit(TENANT, "key-1", 10)
    assert isinstance(ticket, Ticket)
    await healthy.finish(ticket, None)


async def test_finish_bills_once_and_frees_the_slot_for_the_next_request():
    front, resources = door()
    ticket = await front.admit(TENANT, None, 10)
    assert ticket.ledger_id == ticket.attempt_id
    with pytest.raises(ApiError) as busy:
        await front.admit(TENANT, None, 10)
    assert (busy.value.status, busy.value.code) == (429, "tenant_concurrency")
    outcome = Outcome("m", "v1", 5, 0, 3, "stop")
    await front.finish(ticket, outcome)
    await front.finish(ticket, outcome)  # idempotent
    assert len(resources.outbox.records) == 1
    assert resources.outbox.records[0].request_id == ticket.ledger_id
    next_ticket = await front.admit(TENANT, None, 10)
    await front.finish(next_ticket, None)


async def test_the_idempotency_key_is_the_ledger_id_not_the_attempt_id():
    front, _ = door()
    ticket = await front.admit(TENANT, "order-7", 10)
    assert ticket.ledger_id == "order-7" and ticket.attempt_id != "order-7"
    await front.finish(ticket, None)
