"""The router's Prometheus metrics, and the process's (process_*, python_info)."""

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, PlatformCollector, ProcessCollector


@dataclass(frozen=True, slots=True)
class RouterMetrics:
    registry: CollectorRegistry
    streams_active: Gauge
    requests_total: Counter
    rejections_total: Counter
    prompt_tokens_total: Counter
    generation_tokens_total: Counter

    @classmethod
    def create(cls) -> "RouterMetrics":
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # CPU seconds, resident memory, open fds of this service
        PlatformCollector(registry=registry)
        return cls(
            registry=registry,
            streams_active=Gauge(
                "sluice_router_streams_active", "Generate calls being relayed", ["model"], registry=registry
            ),
            requests_total=Counter(
                "sluice_router_requests_total",
                "Generate calls by how they ended (stop, length, cancelled, error, rejected)",
                ["model", "outcome"],
                registry=registry,
            ),
            rejections_total=Counter(
                "sluice_rejections_total", "Requests refused before replica work", ["reason"], registry=registry
            ),
            prompt_tokens_total=Counter(
                "sluice_prompt_tokens_total", "Prompt tokens admitted", ["model"], registry=registry
            ),
            generation_tokens_total=Counter(
                "sluice_generation_tokens_total", "Output tokens relayed", ["model"], registry=registry
            ),
        )
