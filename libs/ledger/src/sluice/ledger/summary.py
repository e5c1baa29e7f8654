"""Folding priced usage parts into the summary rows a caller asked for. Pure.

Cost depends on the model version and the service class of each request,
neither of which a caller's grouping (none, model, day, tenant, model and
day) need contain. So the store's SQL groups by the caller's key *and*
(model_version, service_class); each such part is priced exactly here, then
parts are summed into the caller's rows:

    SQL part  (key, model_version, service_class) -> counts
      priced  cost_of(price[version], counts, class)    or unpriced
      folded  key -> counts summed, cost summed         (None if any part
                                                         was unpriced)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Literal

from sluice.ledger.pricing import DEFAULT_CURRENCY, MONEY, Price, cost_of
from sluice.ledger.records import UsageRow

GroupBy = Literal["model", "day", "tenant", "model_day"]
GROUPINGS: tuple[str, ...] = ("model", "day", "tenant", "model_day")

# A part's key, by grouping: () for none, (model,), (day,), (tenant,),
# (day, model) for model_day (day first: rows sort by day, then model).
GroupKey = tuple[object, ...]


@dataclass(slots=True, frozen=True)
class UsagePart:
    """Summed counts of one (key, model_version, service_class) SQL group."""

    key: GroupKey
    model_version: str
    service_class: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int


@dataclass(slots=True)
class _Bucket:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    unpriced_versions: set[str] = field(default_factory=set)


def ledger_currency(prices: Mapping[str, Price]) -> str:
    """The one currency every price is in (set_price keeps it one)."""
    currencies = {price.currency for price in prices.values()}
    if len(currencies) > 1:
        raise ValueError(f"prices are in more than one currency: {sorted(currencies)}")
    return currencies.pop() if currencies else DEFAULT_CURRENCY


def fold_usage(parts: Iterable[UsagePart], prices: Mapping[str, Price], tenant: str | None,
               group_by: GroupBy | None) -> list[UsageRow]:
    """Rows sorted by key. With no grouping there is exactly one row, zeros
    (and a cost of 0) when no part matched."""
    if group_by is not None and group_by not in GROUPINGS:
        raise ValueError(f"group_by must be one of {GROUPINGS} or None, got {group_by!r}")
    currency = ledger_currency(prices)
    buckets: dict[GroupKey, _Bucket] = {}
    if group_by is None:
        buckets[()] = _Bucket()
    for part in parts:
        bucket = buckets.setdefault(part.key, _Bucket())
        bucket.requests += part.requests
        bucket.prompt_tokens += part.prompt_tokens
        bucket.cached_tokens += part.cached_tokens
        bucket.output_tokens += part.output_tokens
        price = prices.get(part.model_version)
        if price is None:
            bucket.unpriced_versions.add(part.model_version)
        else:
            part_cost = cost_of(price, part.prompt_tokens, part.cached_tokens, part.output_tokens,
                                part.service_class)
            bucket.cost = MONEY.add(bucket.cost, part_cost)
    return [_row(key, bucket, tenant, group_by, currency) for key, bucket in sorted(buckets.items())]


def _row(key: GroupKey, bucket: _Bucket, tenant: str | None, group_by: GroupBy | None,
         currency: str) -> UsageRow:
    model: str | None = None
    day: date | None = None
    if group_by == "model":
        (model,) = key  # type: ignore[assignment]
    elif group_by == "day":
        (day,) = key  # type: ignore[assignment]
    elif group_by == "model_day":
        day, model = key  # type: ignore[assignment]
    elif group_by == "tenant":
        (tenant,) = key  # type: ignore[assignment]
    priced = not bucket.unpriced_versions
    return UsageRow(
        tenant=tenant,
        model=model,
        day=day,
        requests=bucket.requests,
        prompt_tokens=bucket.prompt_tokens,
        cached_tokens=bucket.cached_tokens,
        output_tokens=bucket.output_tokens,
        cost=bucket.cost if priced else None,
        currency=currency if priced else None,
        unpriced_versions=tuple(sorted(bucket.unpriced_versions)),
    )
