"""Sluice's four Grafana dashboards, built with grafanalib.

`generate.py` writes them to deploy/helm/sluice/dashboards/*.json, which the
chart ships as ConfigMaps for the Grafana sidecar and `make observe` points
at. Every query is a PromQL expression over the metric-name contract; the
integration test (tests/integration/test_prometheus_scrape.py) runs each one
against a real Prometheus scraping the running stack.

Variables: `$datasource` (any Prometheus), `$model` and `$class` (both
regexes, "All" = `.+`). `model` is the version on scheduler and replica
metrics and the alias on router and gateway metrics (docs/runbook.md), so
picking one value empties the panels of the other kind; "All" shows both.
The replica's sluice_kv_blocks has a model label and the scheduler's does
not, so `model=~"$model"` also picks the replica's view.
"""

from __future__ import annotations

from dataclasses import dataclass

from grafanalib import core

import rules

DATASOURCE = "${datasource}"
RATE = "$__rate_interval"
MODEL = 'model=~"$model"'
CLASS = 'class=~"$class"'
BUDGET = f"{rules.ERROR_BUDGET:.2f}"
# The replicas' KV use, as the alert's recording rule computes it, per model.
KV_OCCUPANCY = rules.KV_USED_RATIO.replace('model!=""', MODEL)
PANEL_WIDTH, PANEL_HEIGHT = 12, 8  # two panels per row of Grafana's 24 columns


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    stat: bool = False  # a single number (Stat) instead of a time series


@dataclass(frozen=True, slots=True)
class DashboardSpec:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]


def quantiles(metric: str, by: str, selector: str, legend: str) -> tuple[Query, ...]:
    """p50 and p99 of a histogram, summed by `by` (plus le)."""
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
            f"p{int(q * 100)} {legend}",
        )
        for q in (0.5, 0.99)
    )


OVERVIEW = DashboardSpec(
    uid="sluice-overview",
    title="Sluice / Overview",
    description="The four signals of the pool (queue age, TTFT, tokens/s, KV occupancy), refusals and the overload stage.",
    panels=(
        Panel("Queue age (oldest request)", "Age of the oldest queued request per class in the scheduler; interactive above its TTFT SLO (2 s) has missed it already.",
              (Query(f"max by (model, class) (sluice_queue_oldest_age_seconds{{{MODEL}, {CLASS}}})", "{{model}} {{class}}"),), unit="s"),
        Panel("TTFT p50 / p99 by class", "Time to first token at the gateway (arrival to first content byte), per class.",
              quantiles("sluice_time_to_first_token_seconds", "class", f"{MODEL}, {CLASS}", "{{class}}"), unit="s"),
        Panel("Generated tokens per second", "Output tokens relayed by the routers per second, per model alias.",
              (Query(f"sum by (model) (rate(sluice_generation_tokens_total{{{MODEL}}}[{RATE}]))", "{{model}}"),), unit="short"),
        Panel("KV occupancy per replica", "Share of each replica's KV blocks in use (the replica's own view); near 1 new sequences wait or preempt.",
              (Query(KV_OCCUPANCY, "{{replica}}"),), unit="percentunit"),
        Panel("Refusals by reason (gateway)", "Every refusal the gateway answered, by reason code (passed through from router and scheduler).",
              (Query(f"sum by (reason) (rate(sluice_gateway_rejections_total[{RATE}]))", "{{reason}}"),), unit="reqps"),
        Panel("Refusals by reason and class (router and scheduler)", "The router counts every refusal it relays (the scheduler's too); the scheduler's own carry the class. Never sum the two.",
              (Query(f'sum by (reason) (rate(sluice_rejections_total{{class=""}}[{RATE}]))', "router {{reason}}"),
               Query(f"sum by (reason, class) (rate(sluice_rejections_total{{{CLASS}}}[{RATE}]))", "scheduler {{reason}} {{class}}")), unit="reqps"),
        Panel("Overload stage", "The scheduler's overload stage per model version (0 = normal; each stage engages more levers).",
              (Query(f"max by (model) (sluice_overload_stage{{{MODEL}}})", "{{model}}"),)),
        Panel("HTTP responses by status", "Gateway responses per second by status and outcome (an error's outcome is its reason).",
              (Query(f"sum by (status, outcome) (rate(sluice_gateway_requests_total{{{MODEL}}}[{RATE}]))", "{{status}} {{outcome}}"),), unit="reqps"),
    ),
)

TENANTS = DashboardSpec(
    uid="sluice-tenants",
    title="Sluice / Tenants",
    description="Who gets the pool: served token share, reserved KV, active sequences, refusals and queue age per tenant (top-N plus other).",
    panels=(
        Panel("Share of served tokens", "Each tenant's share of the tokens the scheduler served (fair queueing's counter), per class filter.",
              (Query(f"sum by (tenant) (rate(sluice_tenant_served_tokens_total{{{MODEL}, {CLASS}}}[{RATE}]))\n"
                     f"/ scalar(sum(rate(sluice_tenant_served_tokens_total{{{MODEL}, {CLASS}}}[{RATE}])))", "{{tenant}}"),), unit="percentunit"),
        Panel("Reserved KV share", "Share of the pool's KV blocks each tenant's dispatched sequences reserve (capped by max_kv_share).",
              (Query(f"max by (tenant) (sluice_tenant_reserved_kv_share{{{MODEL}}})", "{{tenant}}"),), unit="percentunit"),
        Panel("Active sequences", "Sequences dispatched to replicas per tenant.",
              (Query(f"sum by (tenant) (sluice_tenant_active_sequences{{{MODEL}}})", "{{tenant}}"),)),
        Panel("Refusals by reason and tenant", "Refusals the gateway answered per tenant and reason.",
              (Query(f"sum by (tenant, reason) (rate(sluice_gateway_rejections_total[{RATE}]))", "{{tenant}} {{reason}}"),), unit="reqps"),
        Panel("Queue age by tenant", "Age of each tenant's oldest queued request; one tenant's share high and the others' age up points at fairness caps.",
              (Query(f"max by (tenant, class) (sluice_tenant_queue_oldest_age_seconds{{{MODEL}, {CLASS}}})", "{{tenant}} {{class}}"),), unit="s"),
    ),
)

REPLICAS = DashboardSpec(
    uid="sluice-replicas",
    title="Sluice / Replicas",
    description="Inside the replicas: KV blocks, batch composition, step time, preemptions, canary and per-request phase times.",
    panels=(
        Panel("KV blocks by state", "Each replica's KV blocks, free and used (the replica's view).",
              (Query(f"sum by (replica, state) (sluice_kv_blocks{{{MODEL}}})", "{{replica}} {{state}}"),)),
        Panel("Batch composition (tokens per second by kind)", "Prefill and decode tokens the engine steps carry; long unchunked prefills crowd decode out.",
              (Query(f"sum by (replica, kind) (rate(sluice_engine_step_tokens_total{{{MODEL}}}[{RATE}]))", "{{replica}} {{kind}}"),)),
        Panel("Engine step time", "Wall time of an engine step (p50/p99 of the histogram) and the replica's moving average.",
              quantiles("sluice_engine_step_duration_seconds", "replica", MODEL, "{{replica}}")
              + (Query(f"sluice_engine_step_time_seconds{{{MODEL}}}", "avg {{replica}}"),), unit="s"),
        Panel("Engine steps per second", "Steps each replica takes; 0 while requests run means a wedged engine loop.",
              (Query(f"sum by (replica) (rate(sluice_engine_steps_total{{{MODEL}}}[{RATE}]))", "{{replica}}"),)),
        Panel("Running and waiting requests", "Sequences in the running batch and waiting for KV blocks, per replica.",
              (Query(f"sum by (replica) (sluice_num_requests_running{{{MODEL}}})", "running {{replica}}"),
               Query(f"sum by (replica) (sluice_num_requests_waiting{{{MODEL}}})", "waiting {{replica}}"))),
        Panel("Preemptions", "Sequences preempted per second (their KV freed for others, recomputed later).",
              (Query(f"sum by (replica) (rate(sluice_num_preemptions_total{{{MODEL}}}[{RATE}]))", "{{replica}}"),)),
        Panel("Ready (canary) and canary failures", "1 while the replica's canary generation passes; the scheduler counts ready replicas.",
              (Query(f"sluice_replica_ready{{{MODEL}}}", "ready {{replica}}"),
               Query(f"sum by (replica) (increase(sluice_replica_canary_failures_total{{{MODEL}}}[{RATE}]))", "failures {{replica}}"),
               Query("max(sluice_scheduler_replicas_ready)", "ready (scheduler)"))),
        Panel("Request phase times p99", "On the replica: arrival to first scheduled chunk (queue), to first token (prefill), to finish (decode).",
              tuple(Query(f"histogram_quantile(0.99, sum by (le) (rate(sluice_request_{phase}_time_seconds_bucket{{{MODEL}, {CLASS}}}[{RATE}])))", phase)
                    for phase in ("queue", "prefill", "decode")), unit="s"),
    ),
)


def burn(sli: str, window: str) -> Query:
    return Query(f"sluice:{sli}_slo_error:ratio_rate{window}{{{MODEL}, {CLASS}}} / {BUDGET}", f"{window} {{{{model}}}} {{{{class}}}}")


SLOS = DashboardSpec(
    uid="sluice-slos",
    title="Sluice / SLOs",
    description=f"Error-budget burn of the TTFT and ITL SLOs ({rules.SLO_OBJECTIVE:.0%} of requests, 30 days) by class; needs the chart's recording rules.",
    panels=(
        Panel("TTFT burn rate", "Budget burn of the TTFT SLO (1 = spending exactly the 30-day budget); the fast alert pages at 14.4 on 1h and 5m, the slow at 6 on 6h and 30m.",
              tuple(burn("ttft", w) for w in ("5m", "1h", "6h"))),
        Panel("ITL burn rate", f"Budget burn of the inter-token latency SLO (a gap is good at most {rules.ITL_SLO_S['interactive']} s interactive, {rules.ITL_SLO_S['batch']} s batch).",
              tuple(burn("itl", w) for w in ("5m", "1h", "6h"))),
        Panel("TTFT error budget remaining (30d)", "Share of the 30-day TTFT error budget not yet spent; below 0 the SLO is broken.",
              (Query(f"1 - sluice:ttft_slo_error:ratio_rate30d{{{MODEL}, {CLASS}}} / {BUDGET}", "{{model}} {{class}}"),), unit="percentunit", stat=True),
        Panel("ITL error budget remaining (30d)", "Share of the 30-day ITL error budget not yet spent; below 0 the SLO is broken.",
              (Query(f"1 - sluice:itl_slo_error:ratio_rate30d{{{MODEL}, {CLASS}}} / {BUDGET}", "{{model}} {{class}}"),), unit="percentunit", stat=True),
        Panel("Goodput (streams within the TTFT SLO)", "Finished streams per second whose TTFT met their class's SLO, and those that missed it.",
              (Query(f"sum by (class, result) (rate(sluice_slo_requests_total{{{MODEL}, {CLASS}}}[{RATE}]))", "{{class}} {{result}}"),), unit="reqps"),
        Panel("ITL p50 / p99 by class", "Gaps between content chunks of a stream at the gateway.",
              quantiles("sluice_inter_token_latency_seconds", "class", f"{MODEL}, {CLASS}", "{{class}}"), unit="s"),
    ),
)

DASHBOARDS = (OVERVIEW, TENANTS, REPLICAS, SLOS)


def templating() -> core.Templating:
    every = {"includeAll": True, "multi": True, "allValue": ".+", "default": "$__all"}
    return core.Templating(list=[
        core.Template(name="datasource", label="Data source", type="datasource", query="prometheus", default="Prometheus"),
        core.Template(name="model", label="Model", dataSource=DATASOURCE, refresh=2,
                      query='label_values({__name__=~"sluice_.+"}, model)', **every),
        core.Template(name="class", label="Class", type="custom", query="interactive,batch", **every),
    ])


def build(spec: DashboardSpec) -> core.Dashboard:
    panels = []
    for index, panel in enumerate(spec.panels):
        kind = core.Stat if panel.stat else core.TimeSeries
        targets = [core.Target(expr=q.expr, legendFormat=q.legend, refId=chr(ord("A") + i), datasource=DATASOURCE)
                   for i, q in enumerate(panel.queries)]
        position = core.GridPos(h=PANEL_HEIGHT, w=PANEL_WIDTH, x=(index % 2) * PANEL_WIDTH, y=(index // 2) * PANEL_HEIGHT)
        extra = {"format": panel.unit, "reduceCalc": "lastNotNull"} if panel.stat else {"unit": panel.unit}
        panels.append(kind(title=panel.title, description=panel.description, dataSource=DATASOURCE,
                           targets=targets, gridPos=position, **extra))
    return core.Dashboard(
        title=spec.title, uid=spec.uid, description=spec.description, tags=["sluice"],
        timezone="utc", refresh="30s", time=core.Time("now-1h", "now"),
        templating=templating(), panels=panels,
    ).auto_panel_ids()


def queries(dashboard_json: dict) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of a generated dashboard."""
    return [(panel["title"], target["expr"]) for panel in dashboard_json["panels"] for target in panel["targets"]]
