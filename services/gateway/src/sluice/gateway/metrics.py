"""The gateway's Prometheus metrics.

Label values come from known sets only: the `model` label is a name the
router has admitted or listed (its catalog), else "unknown"; a name a
client sent is never a label by itself (twenty long made-up names would
otherwise grow /metrics tenfold, control characters and all).
"""

from dataclasses import dataclass, field

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

from sluice.gateway.http_edge import EDGE_REASONS

UNKNOWN_MODEL = "unknown"
# More names than any catalog holds; past it new names are "unknown".
MAX_MODEL_LABELS = 256


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
    time_to_first_token_seconds: Histogram
    e2e_request_latency_seconds: Histogram
    limits_fallback: Gauge
    models: ModelLabels = field(default_factory=ModelLabels)

    @classmethod
    def create(cls, edge_closes: Mapping[str, int] | None = None) -> "GatewayMetrics":
        """`edge_closes`: the HTTP edge's counts by reason (http_edge.EdgeLimits.closes)."""
        registry = CollectorRegistry()
        if edge_closes is not None:
            registry.register(_EdgeCloses(edge_closes))
        latency_buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
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
                ["model"], buckets=latency_buckets, registry=registry,
            ),
            e2e_request_latency_seconds=Histogram(
                "sluice_e2e_request_latency_seconds", "Request arrival to the last byte",
                ["model"], buckets=latency_buckets, registry=registry,
            ),
            limits_fallback=Gauge(
                "sluice_gateway_limits_fallback",
                "1 while the limits store (Redis) is unreachable and this gateway enforces its share in memory",
                registry=registry,
            ),
        )


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
