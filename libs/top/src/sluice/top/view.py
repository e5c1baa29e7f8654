"""The view model from two successive scrapes: pure, the interval between
them passed in (no clock here), so tests feed it hand-written pages.

Rates follow Prometheus' `increase`: a counter that went down was reset
(its whole current value is the increase); a series that is new in the
second scrape counts from 0 (the services create labelled series on first
use). A target down in either scrape gives no rate: its lifetime totals
would otherwise pass for one interval's worth.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from sluice.top.exposition import Labels, MetricPage, Series
from sluice.top.model import (
    ALL_CLASSES, OTHER_TENANT, OVERLOAD_STAGE_NAMES, ClassRow, FleetView, ModelRow, RejectionRow, ReplicaRow,
    TargetStatus, TenantRow,
)
from sluice.top.quantile import histogram_quantile
from sluice.top.scrape import FleetScrape
from sluice.top.targets import TargetKind

DEFAULT_TOP_TENANTS = 5
TTFT = "sluice_time_to_first_token_seconds"
ITL = "sluice_inter_token_latency_seconds"
GENERATED = "sluice_replica_generation_tokens_total"
# Where the fleet's refusals are counted, most complete first: the gateway
# answers every refusal (its own and those passed through), the router
# relays the scheduler's, the scheduler sees only its own.
REJECTION_SOURCES = (
    (TargetKind.GATEWAY, "sluice_gateway_rejections_total"),
    (TargetKind.ROUTER, "sluice_rejections_total"),
    (TargetKind.SCHEDULER, "sluice_rejections_total"),
)

Pair = tuple[MetricPage, MetricPage]  # (previous, current) of one target


def pages(scrape: FleetScrape, kind: TargetKind) -> list[MetricPage]:
    return [s.page for s in scrape if s.target.kind == kind and s.page is not None]


def pairs(previous: FleetScrape, current: FleetScrape, kind: TargetKind) -> list[Pair]:
    """(previous, current) pages of each target of `kind` up in both scrapes."""
    before = {s.target: s.page for s in previous if s.page is not None}
    return [(before[s.target], s.page) for s in current
            if s.target.kind == kind and s.page is not None and s.target in before]


def increases(pair: Pair, name: str) -> list[tuple[Labels, float]]:
    previous, current = pair
    old = {s.labels: s.value for s in previous.series(name)}
    out = []
    for s in current.series(name):
        before = old.get(s.labels, 0.0)
        out.append((s.labels, s.value - before if s.value >= before else s.value))
    return out


def summed(items: Iterable[tuple[Labels, float]], key: Callable[[Series], object]) -> dict:
    totals: dict = defaultdict(float)
    for labels, value in items:
        totals[key(Series(labels, value))] += value
    return dict(totals)


def _optional_sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _gauge(page: MetricPage | None, name: str, **labels: str) -> float | None:
    if page is None:
        return None
    found = page.series(name, **labels)
    return sum(s.value for s in found) if found else None


def _pool(s: Series) -> tuple[str, str]:
    return s.label("model"), s.label("class", ALL_CLASSES)


def latency_quantiles(gateway_pairs: list[Pair], name: str, qs: tuple[float, ...]) -> dict:
    """(model, class) -> quantiles over the interval, from bucket deltas
    summed across gateways (None where nothing was observed)."""
    buckets: dict = defaultdict(lambda: defaultdict(float))
    for pair in gateway_pairs:
        for labels, delta in increases(pair, name + "_bucket"):
            s = Series(labels, delta)
            buckets[_pool(s)][float(s.label("le"))] += delta
    return {pool: tuple(histogram_quantile(q, by_le.items()) for q in qs) for pool, by_le in buckets.items()}


def class_rows(previous: FleetScrape, current: FleetScrape) -> tuple[ClassRow, ...]:
    schedulers = pages(current, TargetKind.SCHEDULER)
    queues = [s for page in schedulers for s in page.series("sluice_queue_length")]
    ages = [s for page in schedulers for s in page.series("sluice_queue_oldest_age_seconds")]
    gateway_pairs = pairs(previous, current, TargetKind.GATEWAY)
    ttft = latency_quantiles(gateway_pairs, TTFT, (0.5, 0.99))
    itl = latency_quantiles(gateway_pairs, ITL, (0.5, 0.99))
    length = summed(((s.labels, s.value) for s in queues), _pool)
    oldest: dict = {}
    for s in ages:
        oldest[_pool(s)] = max(oldest.get(_pool(s), 0.0), s.value)
    rows = []
    for pool in sorted(set(length) | set(oldest) | set(ttft) | set(itl)):
        rows.append(ClassRow(pool[0], pool[1], length.get(pool), oldest.get(pool),
                             *ttft.get(pool, (None, None)), *itl.get(pool, (None, None))))
    return tuple(rows)


def model_rows(previous: FleetScrape, current: FleetScrape, interval_s: float) -> tuple[ModelRow, ...]:
    # The replicas count the tokens they sample (by model version); the
    # router's count (by alias) stands in when no replica page has one.
    name, kind = GENERATED, TargetKind.REPLICA
    if not any(page.has_family(name) for page in pages(current, kind)):
        name, kind = "sluice_generation_tokens_total", TargetKind.ROUTER
    by_model = lambda s: s.label("model")  # noqa: E731
    totals = summed(((s.labels, s.value) for page in pages(current, kind) for s in page.series(name)), by_model)
    kind_pairs = pairs(previous, current, kind)
    rates = summed((item for pair in kind_pairs for item in increases(pair, name)), by_model)
    stages = {s.label("model"): int(s.value)
              for page in pages(current, TargetKind.SCHEDULER) for s in page.series("sluice_overload_stage")}
    rows = []
    for model in sorted(set(totals) | set(stages)):
        rate = rates.get(model, 0.0) / interval_s if kind_pairs and model in totals else None
        stage = stages.get(model)
        stage_name = None if stage is None else (
            OVERLOAD_STAGE_NAMES[stage] if 0 <= stage < len(OVERLOAD_STAGE_NAMES) else str(stage))
        rows.append(ModelRow(model, rate, totals.get(model), stage, stage_name))
    return tuple(rows)


def replica_rows(previous: FleetScrape, current: FleetScrape, interval_s: float) -> tuple[ReplicaRow, ...]:
    scheduler = next(iter(pages(current, TargetKind.SCHEDULER)), None)

    def reserved(replica: str) -> float | None:
        value = _gauge(scheduler, "sluice_kv_blocks", replica=replica, state="reserved")
        return value if value is not None else _gauge(scheduler, "sluice_scheduler_reserved_kv_blocks", replica=replica)

    before = {s.target: s.page for s in previous if s.page is not None}
    rows, seen = [], set()
    for scraped in current:
        if scraped.target.kind != TargetKind.REPLICA or scraped.page is None:
            continue
        page = scraped.page
        generated = page.series(GENERATED)
        ids = {s.label("replica") for name in ("sluice_kv_blocks", "sluice_replica_ready") for s in page.series(name)}
        for replica in sorted(ids | {s.label("replica") for s in generated}):
            seen.add(replica)
            free = _gauge(page, "sluice_kv_blocks", replica=replica, state="free")
            used = _gauge(page, "sluice_kv_blocks", replica=replica, state="used")
            ready = _gauge(page, "sluice_replica_ready", replica=replica)
            rate = None
            if scraped.target in before:
                deltas = [delta for labels, delta in increases((before[scraped.target], page), GENERATED)
                          if Series(labels, delta).label("replica") == replica]
                rate = sum(deltas) / interval_s if deltas else None
            models = {s.label("model") for s in page.series("sluice_kv_blocks", replica=replica)}
            rows.append(ReplicaRow(
                replica=replica, model=",".join(sorted(models)), source="replica",
                ready=None if ready is None else ready >= 1, kv_free_blocks=free, kv_used_blocks=used,
                kv_reserved_blocks=reserved(replica), kv_occupancy=_occupancy(free, used),
                running=_gauge(page, "sluice_num_requests_running", replica=replica),
                waiting=_gauge(page, "sluice_num_requests_waiting", replica=replica),
                step_time_s=_gauge(page, "sluice_engine_step_time_seconds", replica=replica),
                output_tokens_per_s=rate,
                generated_tokens=_gauge(page, GENERATED, replica=replica),
            ))
    # Replicas the scheduler knows whose own page was not read: its view.
    known = sorted({s.label("replica") for s in (scheduler.series("sluice_kv_blocks") if scheduler else ())} - seen)
    for replica in known:
        free = _gauge(scheduler, "sluice_kv_blocks", replica=replica, state="free")
        used = _gauge(scheduler, "sluice_kv_blocks", replica=replica, state="used")
        rows.append(ReplicaRow(replica, "", "scheduler", None, free, used, reserved(replica), _occupancy(free, used),
                               None, None, None, None, None))
    return tuple(rows)


def _occupancy(free: float | None, used: float | None) -> float | None:
    if free is None or used is None or free + used <= 0:
        return None
    return used / (free + used)


def tenant_rows(previous: FleetScrape, current: FleetScrape, interval_s: float, top_n: int) -> tuple[TenantRow, ...]:
    """The top `top_n` tenants of each model by served-token rate, then one
    OTHER_TENANT row folding the rest (and the services' own "other")."""
    schedulers = pages(current, TargetKind.SCHEDULER)
    scheduler_pairs = pairs(previous, current, TargetKind.SCHEDULER)
    key = lambda s: (s.label("model"), s.label("tenant"))  # noqa: E731
    served = summed((item for pair in scheduler_pairs
                     for item in increases(pair, "sluice_tenant_served_tokens_total")), key)
    gauges = {name: summed(((s.labels, s.value) for page in schedulers for s in page.series(name)), key)
              for name in ("sluice_tenant_reserved_kv_share", "sluice_tenant_active_sequences")}
    shares, active = gauges["sluice_tenant_reserved_kv_share"], gauges["sluice_tenant_active_sequences"]
    known = set(served) | set(shares) | set(active) | {
        key(s) for page in schedulers for s in page.series("sluice_tenant_served_tokens_total")}
    by_model: dict[str, list[TenantRow]] = defaultdict(list)
    for model, tenant in known:
        rate = served.get((model, tenant), 0.0) / interval_s if scheduler_pairs else None
        by_model[model].append(TenantRow(model, tenant, rate, shares.get((model, tenant)), active.get((model, tenant))))
    rows = []
    for model in sorted(by_model):
        ranked = sorted((r for r in by_model[model] if r.tenant != OTHER_TENANT),
                        key=lambda r: (-(r.served_tokens_per_s or 0.0), -(r.active_sequences or 0.0), r.tenant))
        folded = ranked[top_n:] + [r for r in by_model[model] if r.tenant == OTHER_TENANT]
        rows.extend(ranked[:top_n])
        if folded:
            rows.append(TenantRow(
                model, OTHER_TENANT, _optional_sum(r.served_tokens_per_s for r in folded),
                _optional_sum(r.reserved_kv_share for r in folded), _optional_sum(r.active_sequences for r in folded),
            ))
    return tuple(rows)


def rejection_rows(previous: FleetScrape, current: FleetScrape,
                   interval_s: float) -> tuple[tuple[RejectionRow, ...], str | None]:
    for kind, name in REJECTION_SOURCES:
        found = [pair for pair in pairs(previous, current, kind) if pair[1].has_family(name)]
        if not found:
            continue
        by_reason = summed((item for pair in found for item in increases(pair, name)), lambda s: s.label("reason"))
        rows = [RejectionRow(reason, delta / interval_s) for reason, delta in by_reason.items() if delta > 0]
        return tuple(sorted(rows, key=lambda r: (-r.per_s, r.reason))), kind.value
    return (), None


def build_view(previous: FleetScrape, current: FleetScrape, interval_s: float,
               top_tenants: int = DEFAULT_TOP_TENANTS) -> FleetView:
    """The view of `current`, with rates over the `interval_s` since `previous`."""
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    models = model_rows(previous, current, interval_s)
    rejections, source = rejection_rows(previous, current, interval_s)
    return FleetView(
        interval_s=interval_s,
        targets=tuple(TargetStatus(s.target.kind.value, s.target.url, s.up, s.error) for s in current),
        models=models,
        classes=class_rows(previous, current),
        replicas=replica_rows(previous, current, interval_s),
        tenants=tenant_rows(previous, current, interval_s, top_tenants),
        rejections=rejections,
        rejections_source=source,
        output_tokens_per_s=_optional_sum(m.output_tokens_per_s for m in models),
        replicas_ready=_gauge(next(iter(pages(current, TargetKind.SCHEDULER)), None),
                              "sluice_scheduler_replicas_ready"),
    )
