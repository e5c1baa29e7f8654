"""What the gateway hands to the ledger when a stream ends.

A finished stream (`stop` or `length`) becomes one UsageRecord: billed, once
per (tenant, request_id). A stream that ended any other way becomes an
AttemptRecord: never billed, kept so waste is observable. Neither carries
prompt or output text, only counts.

Tenants are named here; the store maps names to ids, creating tenants on
first sight, so the gateway never needs a database round trip to build one.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Literal

FinishReason = Literal["stop", "length"]
AttemptOutcome = Literal["cancelled", "error"]
ServiceClass = Literal["interactive", "batch"]

BILLABLE_FINISH_REASONS: tuple[str, ...] = ("stop", "length")
ATTEMPT_OUTCOMES: tuple[str, ...] = ("cancelled", "error")
SERVICE_CLASSES: tuple[str, ...] = ("interactive", "batch")


def _require_aware(name: str, value: datetime) -> None:
    # A naive timestamp would be read as local time on one machine and UTC on
    # another; day buckets are UTC, so the instant has to be unambiguous.
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got {value!r}")


def _require_counts(**counts: int) -> None:
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def _require_text(**texts: str) -> None:
    for name, value in texts.items():
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} must be a non-empty string, got {value!r}")


def _require_service_class(value: str) -> None:
    if value not in SERVICE_CLASSES:
        raise ValueError(f"service_class must be one of {SERVICE_CLASSES}, got {value!r}")


@dataclass(slots=True, frozen=True)
class UsageRecord:
    """One billed request. `cached_tokens` is the part of `prompt_tokens`
    served from the prefix cache, so it never exceeds it. `service_class`
    picks the price (batch may be discounted); it defaults to interactive so
    records queued in an outbox before the field existed still decode."""

    tenant: str
    request_id: str
    model: str
    model_version: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    finish_reason: FinishReason
    finished_at: datetime
    service_class: ServiceClass = "interactive"

    def __post_init__(self) -> None:
        _require_text(tenant=self.tenant, request_id=self.request_id, model=self.model,
                      model_version=self.model_version)
        _require_counts(prompt_tokens=self.prompt_tokens, cached_tokens=self.cached_tokens,
                        output_tokens=self.output_tokens)
        if self.cached_tokens > self.prompt_tokens:
            raise ValueError(
                f"cached_tokens ({self.cached_tokens}) exceeds prompt_tokens ({self.prompt_tokens})")
        if self.finish_reason not in BILLABLE_FINISH_REASONS:
            raise ValueError(
                f"finish_reason must be one of {BILLABLE_FINISH_REASONS}, got {self.finish_reason!r}")
        _require_service_class(self.service_class)
        _require_aware("finished_at", self.finished_at)


@dataclass(slots=True, frozen=True)
class AttemptRecord:
    """One unbilled attempt (a disconnect or an error). Not unique per
    request: a request retried three times may leave three attempts.

    `attempt_id` is generated once, when the record is made, and travels
    through the outbox; the store inserts on it idempotently, so an attempt
    whose commit acknowledgement was lost is not counted twice on retry.
    """

    tenant: str
    request_id: str
    model: str
    model_version: str
    prompt_tokens: int
    output_tokens: int
    outcome: AttemptOutcome
    at: datetime
    attempt_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    service_class: ServiceClass = "interactive"

    def __post_init__(self) -> None:
        _require_text(tenant=self.tenant, request_id=self.request_id, model=self.model,
                      model_version=self.model_version, attempt_id=self.attempt_id)
        _require_counts(prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens)
        if self.outcome not in ATTEMPT_OUTCOMES:
            raise ValueError(f"outcome must be one of {ATTEMPT_OUTCOMES}, got {self.outcome!r}")
        _require_service_class(self.service_class)
        _require_aware("at", self.at)


@dataclass(slots=True, frozen=True)
class UsageRow:
    """One line of a usage summary. `model` is set when grouped by model,
    `day` (a UTC calendar day) when grouped by day (both for model_day),
    `tenant` when a single tenant was asked for or when grouped by tenant;
    otherwise None.

    `cost` is exact, in `currency`. It is None (never 0) when any request in
    the row ran on a model version with no price: `unpriced_versions` names
    those versions, so a partial sum is never mistaken for the bill.
    """

    tenant: str | None
    model: str | None
    day: date | None
    requests: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    cost: Decimal | None = None
    currency: str | None = None
    unpriced_versions: tuple[str, ...] = ()


@dataclass(slots=True, frozen=True)
class AttemptRow:
    """Unbilled attempts of one outcome in a time range (waste, not billing)."""

    outcome: str
    attempts: int
    prompt_tokens: int
    output_tokens: int
