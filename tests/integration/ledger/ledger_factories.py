"""Small record factories shared by the ledger integration tests."""

from __future__ import annotations

from datetime import datetime, timezone

from sluice.ledger.records import AttemptRecord, UsageRecord

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def make_usage(request_id: str = "req-1", tenant: str = "acme", model: str = "llama-tiny",
               finished_at: datetime = T0, prompt_tokens: int = 10, cached_tokens: int = 4,
               output_tokens: int = 20, finish_reason: str = "stop",
               model_version: str = "v1", service_class: str = "interactive") -> UsageRecord:
    return UsageRecord(tenant=tenant, request_id=request_id, model=model,
                       model_version=model_version, prompt_tokens=prompt_tokens,
                       cached_tokens=cached_tokens, output_tokens=output_tokens,
                       finish_reason=finish_reason, finished_at=finished_at,  # type: ignore[arg-type]
                       service_class=service_class)  # type: ignore[arg-type]


def make_attempt(request_id: str = "req-1", tenant: str = "acme", outcome: str = "cancelled",
                 at: datetime = T0, prompt_tokens: int = 10, output_tokens: int = 3,
                 model: str = "llama-tiny") -> AttemptRecord:
    return AttemptRecord(tenant=tenant, request_id=request_id, model=model, model_version="v1",
                         prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                         outcome=outcome, at=at)  # type: ignore[arg-type]
