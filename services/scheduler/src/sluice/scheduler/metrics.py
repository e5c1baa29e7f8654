from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(frozen=True, slots=True)
class SchedulerMetrics:
    registry: CollectorRegistry
    placements_total: Counter
    rejections_total: Counter
    reservations_active: Gauge
    reserved_kv_blocks: Gauge
    router_streams_active: Gauge
    replicas_ready: Gauge

    @classmethod
    def create(cls) -> "SchedulerMetrics":
        registry = CollectorRegistry()
        return cls(
            registry=registry,
            placements_total=Counter(
                "sluice_placements_total", "Requests dispatched onto a replica", ["replica"], registry=registry
            ),
            rejections_total=Counter(
                "sluice_rejections_total", "Requests the scheduler refused", ["reason"], registry=registry
            ),
            reservations_active=Gauge(
                "sluice_scheduler_reservations", "Dispatched requests not yet released", registry=registry
            ),
            reserved_kv_blocks=Gauge(
                "sluice_scheduler_reserved_kv_blocks", "KV blocks promised per replica", ["replica"], registry=registry
            ),
            router_streams_active=Gauge(
                "sluice_scheduler_router_streams", "Open Place streams from routers", registry=registry
            ),
            replicas_ready=Gauge(
                "sluice_scheduler_replicas_ready", "Replicas whose state stream says ready", registry=registry
            ),
        )
