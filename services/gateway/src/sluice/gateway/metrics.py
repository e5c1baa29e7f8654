from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True, slots=True)
class GatewayMetrics:
    registry: CollectorRegistry
    requests_total: Counter
    streams_active: Gauge
    time_to_first_token_seconds: Histogram
    e2e_request_latency_seconds: Histogram

    @classmethod
    def create(cls) -> "GatewayMetrics":
        registry = CollectorRegistry()
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
        )
