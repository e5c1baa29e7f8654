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
    # The live catalog (catalog_watch): what an operator checks after an edit.
    catalog_reloads_total: Counter
    catalog_generation: Gauge
    catalog_applied_unix_s: Gauge
    catalog_content_hash: Gauge
    catalog_weight_ratio: Gauge

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
            **_catalog_metrics(registry),
        )


RELOAD_OUTCOMES = ("applied", "rejected")


def _catalog_metrics(registry: CollectorRegistry) -> dict:
    reloads = Counter(
        "sluice_router_catalog_reloads_total",
        "Catalog file changes seen: applied, or rejected (the last good catalog stays; the router logs why)",
        ["outcome"], registry=registry,
    )
    for outcome in RELOAD_OUTCOMES:
        reloads.labels(outcome)  # both series exist from the start, at 0
    return {
        "catalog_reloads_total": reloads,
        "catalog_generation": Gauge(
            "sluice_router_catalog_generation", "Catalogs applied since the router started (1 = the start-up one)",
            registry=registry),
        "catalog_applied_unix_s": Gauge(
            "sluice_router_catalog_applied_timestamp_seconds", "When the live catalog was applied",
            registry=registry),
        # A number, not a label (a label value would be new with every
        # edit): routers that agree on this serve the same catalog.
        "catalog_content_hash": Gauge(
            "sluice_router_catalog_content_hash",
            "First 48 bits of the SHA-256 of the live catalog file's bytes (exact in a float)",
            registry=registry),
        "catalog_weight_ratio": Gauge(
            "sluice_router_catalog_weight_ratio",
            "Share of the alias's new requests each version gets under the live catalog (0-1)",
            ["model", "version"], registry=registry),
    }
