"""Sluice's Prometheus rules, the one source of truth.

`generate.py` writes them to deploy/helm/sluice/files/prometheus-rules.yaml;
the chart's PrometheusRule and its plain rules-file ConfigMap both read that
file (the runbook base URL prefixed there), `make observe` and the
integration test load it into a real Prometheus, and promtool checks it
against rules_test.yaml.

SLO alerts follow the multi-window, multi-burn-rate pattern of the Google
SRE workbook (ch. 5): page when the long window burns the 30-day budget at
14.4x (2% of it in 1h) or 6x (5% in 6h), and the short window (1/12 of the
long one) still burns at that rate, so a burn that already stopped resets
the alert within minutes.

Every alert carries `signal`: the quantity its condition thresholds, without
the threshold. The integration test evaluates signals (which must return
series in a healthy run) where the alert condition itself is rightly empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CLASSES = ("interactive", "batch")
# Both classes promise the same share of good requests; they differ in what
# "good" means (the latency thresholds below), not in how often it may fail.
SLO_OBJECTIVE = 0.99
ERROR_BUDGET = 1 - SLO_OBJECTIVE
# A stream's TTFT verdict is the gateway's (sluice_slo_requests_total{result}),
# made against SLUICE_INTERACTIVE_TTFT_SLO_S / SLUICE_BATCH_TTFT_SLO_S. The
# interactive value is repeated here for the queue-age alert: a request queued
# longer than the TTFT SLO has missed it already.
INTERACTIVE_TTFT_SLO_S = 2.0
# ITL SLO per class: a gap between two content chunks is good when at most
# this long. Each must be a bucket bound of sluice_inter_token_latency_seconds
# (0.005 .. 5), so the good count is one bucket and no interpolation.
ITL_SLO_S = {"interactive": "0.1", "batch": "0.5"}
# The windows the burn-rate alerts pair, and the budget window.
RATE_WINDOWS = ("5m", "30m", "1h", "6h", "30d")
BURN_RATES = (
    # (long window, short window, burn rate, `for`, severity)
    ("1h", "5m", 14.4, "2m", "page"),
    ("6h", "30m", 6.0, "15m", "page"),
)
KV_USED_RATIO_MAX = 0.95
OUTBOX_DEPTH_MAX = 100
RUNBOOK = "docs/runbook.md"


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    expr: str
    signal: str  # expr without its threshold (see the module docstring)
    for_: str
    severity: str
    summary: str
    description: str
    runbook_anchor: str  # a heading of docs/runbook.md, as GitHub slugs it

    def to_rule(self) -> dict:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": f"{RUNBOOK}#{self.runbook_anchor}",
            },
        }


@dataclass(frozen=True, slots=True)
class Record:
    record: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)

    def to_rule(self) -> dict:
        rule = {"record": self.record, "expr": self.expr}
        if self.labels:
            rule["labels"] = dict(self.labels)
        return rule


def ttft_error_ratio(window: str) -> str:
    # `or 0 * ...` keeps a (model, class) whose streams all met the SLO at 0
    # instead of dropping it: the "missed" series may never have been created.
    return (
        f'sum by (model, class) (rate(sluice_slo_requests_total{{result="missed"}}[{window}])'
        f" or 0 * rate(sluice_slo_requests_total[{window}]))\n"
        f"/ sum by (model, class) (rate(sluice_slo_requests_total[{window}]))"
    )


def itl_error_ratio(window: str) -> str:
    # One expression for every class (joined by `or`, their class labels are
    # disjoint): two rules recording one name would be ambiguous to promtool.
    parts = []
    for slo_class in CLASSES:
        selector = f'class="{slo_class}"'
        parts.append(
            f"(1 - sum by (model, class) (rate(sluice_inter_token_latency_seconds_bucket{{{selector}, le=\"{ITL_SLO_S[slo_class]}\"}}[{window}]))\n"
            f"  / sum by (model, class) (rate(sluice_inter_token_latency_seconds_count{{{selector}}}[{window}])))"
        )
    return "\nor\n".join(parts)


def slo_records() -> list[Record]:
    return [Record(f"sluice:ttft_slo_error:ratio_rate{w}", ttft_error_ratio(w)) for w in RATE_WINDOWS] + [
        Record(f"sluice:itl_slo_error:ratio_rate{w}", itl_error_ratio(w)) for w in RATE_WINDOWS
    ]


KV_USED_RATIO = (
    'sum by (model, replica) (sluice_kv_blocks{model!="", state="used"})\n'
    '/ sum by (model, replica) (sluice_kv_blocks{model!="", state=~"free|used"})'
)


def operational_records() -> list[Record]:
    # model!="" keeps the replicas' own view; the scheduler's sluice_kv_blocks
    # has no model label (and counts reservations, not used blocks).
    return [Record("sluice:kv_used:ratio", KV_USED_RATIO)]


def burn_alerts() -> list[Alert]:
    alerts = []
    slis = (
        ("TTFT", "ttft", "time to first token", "interactive-ttft-rises"),
        ("ITL", "itl", "inter-token latency", "inter-token-latency-rises"),
    )
    for sli, key, what, anchor in slis:
        for long_w, short_w, rate, for_, severity in BURN_RATES:
            threshold = f"({rate} * {ERROR_BUDGET:.2f})"
            speed = "Fast" if rate > 10 else "Slow"
            long_r, short_r = f"sluice:{key}_slo_error:ratio_rate{long_w}", f"sluice:{key}_slo_error:ratio_rate{short_w}"
            alerts.append(Alert(
                name=f"Sluice{sli}ErrorBudgetBurn{speed}",
                expr=f"{long_r} > {threshold}\nand on (model, class)\n{short_r} > {threshold}",
                signal=f"{long_r}\nand on (model, class)\n{short_r}",
                for_=for_,
                severity=severity,
                summary=f"{{{{ $labels.class }}}} {what} SLO of {{{{ $labels.model }}}} burns its budget {rate}x",
                description=(
                    f"Over the last {long_w} and {short_w}, more than {rate} x {ERROR_BUDGET:.0%} of "
                    f"{{{{ $labels.class }}}} requests of {{{{ $labels.model }}}} missed the {what} SLO; "
                    f"at this rate the 30-day error budget lasts {30 / rate:.1f} days."
                ),
                runbook_anchor=anchor,
            ))
    return alerts


def operational_alerts() -> list[Alert]:
    return [
        Alert(
            name="SluiceKVCacheNearlyFull",
            expr=f"sluice:kv_used:ratio > {KV_USED_RATIO_MAX}",
            signal="sluice:kv_used:ratio",
            for_="10m",
            severity="warning",
            summary="KV cache of {{ $labels.replica }} ({{ $labels.model }}) is {{ $value | humanizePercentage }} used",
            description="Used KV blocks stayed above 95% for 10 minutes: new sequences wait for blocks or preempt others.",
            runbook_anchor="kv-occupancy-high",
        ),
        Alert(
            name="SluiceInteractiveQueueAgeAboveSLO",
            expr=f'max by (model) (sluice_queue_oldest_age_seconds{{class="interactive"}}) > {INTERACTIVE_TTFT_SLO_S:g}',
            signal='max by (model) (sluice_queue_oldest_age_seconds{class="interactive"})',
            for_="2m",
            severity="page",
            summary="Oldest interactive request of {{ $labels.model }} has queued {{ $value | humanizeDuration }}",
            description=(
                f"The interactive queue's oldest request waited longer than the {INTERACTIVE_TTFT_SLO_S:g} s TTFT SLO "
                "for 2 minutes: it has missed the SLO before reaching a replica."
            ),
            runbook_anchor="interactive-ttft-rises",
        ),
        Alert(
            name="SluiceReplicaStoppedStepping",
            expr="rate(sluice_engine_steps_total[2m]) == 0\nand on (model, replica)\nsluice_num_requests_running > 0",
            signal="rate(sluice_engine_steps_total[2m])\nand on (model, replica)\nsluice_num_requests_running",
            for_="2m",
            severity="page",
            summary="Replica {{ $labels.replica }} ({{ $labels.model }}) runs requests but takes no engine steps",
            description="No engine step in 2 minutes while requests are running: the engine loop is wedged.",
            runbook_anchor="replica-stopped-stepping",
        ),
        Alert(
            name="SluiceReplicaCanaryFailing",
            expr="sluice_replica_ready == 0",
            signal="sluice_replica_ready",
            for_="2m",
            severity="page",
            summary="Replica {{ $labels.replica }} ({{ $labels.model }}) fails its canary",
            description="The replica's canary generation failed for 2 minutes; the scheduler places nothing on it.",
            runbook_anchor="replica-stopped-stepping",
        ),
        Alert(
            name="SluiceLimitsFallbackActive",
            expr="sluice_gateway_limits_fallback == 1",
            signal="sluice_gateway_limits_fallback",
            for_="1m",
            severity="warning",
            summary="Gateway {{ $labels.instance }} enforces limits locally: Redis is unreachable",
            description="Each gateway pod keeps its share of the token buckets; idempotency keys are not shared.",
            runbook_anchor="redis-the-limits-store-is-down",
        ),
        Alert(
            name="SluiceLedgerOutboxGrowing",
            # The depth first, so $value in the summary is the depth, not its slope.
            expr=f"sluice_ledger_outbox_depth > {OUTBOX_DEPTH_MAX}\nand\nderiv(sluice_ledger_outbox_depth[10m]) > 0",
            signal="sluice_ledger_outbox_depth\nand\nderiv(sluice_ledger_outbox_depth[10m])",
            for_="15m",
            severity="warning",
            summary="Ledger outbox of {{ $labels.instance }} holds {{ $value }} records and grows",
            description="Usage records are not reaching the ledger database: it is down or too slow.",
            runbook_anchor="ledger-outbox-growing",
        ),
    ]


def alerts() -> list[Alert]:
    return burn_alerts() + operational_alerts()


def records() -> list[Record]:
    return slo_records() + operational_records()


def rule_groups() -> dict:
    """The rules file's content (Prometheus `groups:` format)."""
    return {
        "groups": [
            {"name": "sluice-slo-records", "rules": [r.to_rule() for r in slo_records()]},
            {"name": "sluice-records", "rules": [r.to_rule() for r in operational_records()]},
            {"name": "sluice-slo-alerts", "rules": [a.to_rule() for a in burn_alerts()]},
            {"name": "sluice-alerts", "rules": [a.to_rule() for a in operational_alerts()]},
        ]
    }
