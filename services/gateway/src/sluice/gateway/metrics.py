"""The gateway's Prometheus metrics.

Label values come from known sets only: the `model` label is a name the
router has admitted or listed (its catalog), else "unknown"; a name a
client sent is never a label by itself (twenty long made-up names would
otherwise grow /metrics tenfold, control characters and all). `class` is
interactive or batch; `tenant` is one of the first N tenants seen, else
"other" (sluice.telemetry.tenant_labels). `version` is the model version
that served, as the router named it when it admitted the request (one of
its catalog's versions; "unknown" past MAX_MODEL_LABELS): the latency and
outcome series carry it so a rollout can judge a candidate version's share
of an alias on its own (sluice.rollout.prometheus). Dashboards and rules
that sum by (model, class) see the same totals as before.

TTFT and inter-token latency observations carry the trace id of the
request as an exemplar when it is traced; exemplars appear in the
OpenMetrics exposition only (routes/health.py negotiates it).
"""

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sluice.gateway.http_edge import EDGE_REASONS
from sluice.telemetry.tenant_labels import TenantLabels

UNKNOWN_MODEL = "unknown"
# More names than any catalog holds; past it new names are "unknown".
MAX_MODEL_LABELS = 256
# From a 10 ms cache hit to a batch request that queued ten minutes.
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 2.5, 5, 10, 30, 60, 120, 300, 600)
E2E_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# Gaps between content chunks: a healthy decode is 5-100 ms a token.
ITL_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5)
# The labels of the per-response SLO series (latencies, goodput, outcomes).
SLO_LABELS = ("model", "class", "version")
# How a response that reached a version ended (sluice_version_responses_total).
RESPONSE_OUTCOMES = ("finished", "error", "cancelled")


@dataclass(slots=True)
class ModelLabels:
    """Model names the router vouched for. Written by the event loop only."""

    known: set[str] = field(default_factory=set)

    def learn(self, *names: str) -> None:
        for name in names:
            if len(self.known) < MAX_MODEL_LABELS:
                self.known.add(name)

    def label(self, name: str) -> str:
        return name if name in self.known else UNKNOWN_MODEL


@dataclass(frozen=True, slots=True)
class GatewayMetrics:
    registry: CollectorRegistry
    requests_total: Counter
    streams_active: Gauge
    time_to_first_token_seconds: Histogram  # model, class, version
    e2e_request_latency_seconds: Histogram  # model, class, version
    inter_token_latency_seconds: Histogram  # model, class, version
    slo_requests_total: Counter  # model, class, version, result=met|missed
    version_responses_total: Counter  # model, class, version, outcome=finished|error|cancelled
    rejections_total: Counter  # reason, tenant
    limits_fallback: Gauge
    models: ModelLabels = field(default_factory=ModelLabels)
    versions: ModelLabels = field(default_factory=ModelLabels)  # model versions the router named
    tenants: TenantLabels = field(default_factory=TenantLabels)

    @classmethod
    def create(
        cls, edge_closes: Mapping[str, int] | None = None, outbox_depth: Callable[[], int] | None = None,
        max_tenant_labels: int = 20,
    ) -> "GatewayMetrics":
        """`edge_closes`: the HTTP edge's counts by reason (http_edge.EdgeLimits.closes);
        `outbox_depth`: ledger records not yet in the ledger (read on scrape);
        `max_tenant_labels`: tenants named in labels, the rest are "other"."""
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # process_* (CPU, memory, open fds), as every service serves
        PlatformCollector(registry=registry)
        if edge_closes is not None:
            registry.register(_EdgeCloses(edge_closes))
        if outbox_depth is not None:
            registry.register(_OutboxDepth(outbox_depth))
        return cls(
            registry=registry,
            requests_total=Counter(
                "sluice_gateway_requests_total", "HTTP generation requests by status and outcome",
                ["model", "status", "outcome"], registry=registry,
            ),
            streams_active=Gauge(
                "sluice_gateway_streams_active", "Generation responses in flight", registry=registry
            ),
            time_to_first_token_seconds=Histogram(
                "sluice_time_to_first_token_seconds", "Request arrival to first content byte",
                SLO_LABELS, buckets=TTFT_BUCKETS_S, registry=registry,
            ),
            e2e_request_latency_seconds=Histogram(
                "sluice_e2e_request_latency_seconds", "Request arrival to the last byte",
                SLO_LABELS, buckets=E2E_BUCKETS_S, registry=registry,
            ),
            inter_token_latency_seconds=Histogram(
                "sluice_inter_token_latency_seconds", "Gap between consecutive content chunks of a stream",
                SLO_LABELS, buckets=ITL_BUCKETS_S, registry=registry,
            ),
            slo_requests_total=Counter(
                "sluice_slo_requests_total", "Finished streams by whether their TTFT met the class's SLO (goodput)",
                [*SLO_LABELS, "result"], registry=registry,
            ),
            version_responses_total=Counter(
                "sluice_version_responses_total",
                "Responses a model version started, by how they ended (finished, error, or cancelled by the "
                "client): a version's error rate for the rollout gates",
                [*SLO_LABELS, "outcome"], registry=registry,
            ),
            rejections_total=Counter(
                "sluice_gateway_rejections_total", "Requests the gateway refused, by reason code and tenant",
                ["reason", "tenant"], registry=registry,
            ),
            limits_fallback=Gauge(
                "sluice_gateway_limits_fallback",
                "1 while the limits store (Redis) is unreachable and this gateway enforces its share in memory",
                registry=registry,
            ),
            tenants=TenantLabels(max_tenant_labels),
        )

    def rejected(self, reason: str | None, tenant: str | None) -> None:
        """A refusal answered to a client (its reason code from the one
        vocabulary; a tenant not yet authenticated counts as "unknown")."""
        self.rejections_total.labels(reason or "error", self.tenants(tenant) if tenant else "unknown").inc()


class _EdgeCloses:
    """Connections the HTTP edge refused or closed, read from its counts."""

    def __init__(self, closes: Mapping[str, int]) -> None:
        self._closes = closes

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("sluice_gateway_http_edge_closes", "Connections refused or closed by the "
                                     "HTTP server's limits", labels=["reason"])
        for reason in EDGE_REASONS:
            family.add_metric([reason], float(self._closes.get(reason, 0)))
        yield family


class _OutboxDepth:
    """Ledger records in the durable outbox, counted on each scrape (one
    indexed count query): growth means the ledger database is behind or away."""

    def __init__(self, depth: Callable[[], int]) -> None:
        self._depth = depth

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("sluice_ledger_outbox_depth", "Ledger records queued in this gateway's durable "
                                "outbox, not yet in the ledger", value=float(self._depth()))
