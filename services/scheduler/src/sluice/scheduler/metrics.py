"""The scheduler's Prometheus metrics (names from DESIGN.md; vLLM's where
it has the quantity). Gauges are republished from the policy core on the
event loop (`SchedulerMetrics.publish`), never read across threads."""

from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector

from sluice.placement.asks import ServiceClass
from sluice.placement.cluster import ClusterScheduler
from sluice.placement.replica_choice import ReplicaView
from sluice.telemetry.tenant_labels import TenantLabels

CLASS_NAMES = {ServiceClass.INTERACTIVE: "interactive", ServiceClass.BATCH: "batch"}
WAIT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800)


@dataclass(slots=True)
class SchedulerMetrics:
    registry: CollectorRegistry
    placements_total: Counter
    admissions_total: Counter
    rejections_total: Counter
    queue_length: Gauge
    queue_oldest_age_seconds: Gauge
    tenant_queue_oldest_age_seconds: Gauge
    queue_time_seconds: Histogram
    predicted_start_seconds: Histogram
    reservations_active: Gauge
    reserved_kv_blocks: Gauge
    kv_blocks: Gauge
    router_streams_active: Gauge
    replicas_ready: Gauge
    tenant_active_sequences: Gauge
    tenant_reserved_kv_share: Gauge
    tenant_served_tokens_total: Counter
    fairness_bound_tokens: Gauge
    prefix_hit_blocks_total: Counter
    prefix_queried_blocks_total: Counter
    overload_stage: Gauge
    overload_signal: Gauge
    overload_levers_total: Counter
    tenants: TenantLabels = field(default_factory=TenantLabels)
    _served_published: dict = field(default_factory=lambda: defaultdict(float))
    _prefix_published: list = field(default_factory=lambda: [0, 0])
    _tenant_labels_set: dict = field(default_factory=lambda: defaultdict(set))  # model -> labels given a value
    _tenant_queue_labels_set: dict = field(default_factory=lambda: defaultdict(set))  # (model, class) -> tenant labels

    @classmethod
    def create(cls) -> "SchedulerMetrics":
        r = CollectorRegistry()
        ProcessCollector(registry=r)  # CPU seconds, resident memory, open fds of this service
        PlatformCollector(registry=r)
        pool = ["model", "class"]
        return cls(
            registry=r,
            placements_total=Counter("sluice_placements_total", "Requests dispatched onto a replica", ["replica"], registry=r),
            admissions_total=Counter("sluice_admissions_total", "Requests admitted to a queue", pool, registry=r),
            rejections_total=Counter("sluice_rejections_total", "Requests the scheduler refused", ["reason", "class"], registry=r),
            queue_length=Gauge("sluice_queue_length", "Requests queued", pool, registry=r),
            queue_oldest_age_seconds=Gauge("sluice_queue_oldest_age_seconds", "Age of the oldest queued request", pool, registry=r),
            tenant_queue_oldest_age_seconds=Gauge(
                "sluice_tenant_queue_oldest_age_seconds", "Age of a tenant's oldest queued request (0 when none; "
                "`other`: the oldest of the tenants past the top N)", [*pool, "tenant"], registry=r),
            queue_time_seconds=Histogram("sluice_queue_time_seconds", "Time from enqueue to dispatch", pool,
                                         buckets=WAIT_BUCKETS_S, registry=r),
            predicted_start_seconds=Histogram("sluice_predicted_start_seconds", "Predicted wait at enqueue", pool,
                                              buckets=WAIT_BUCKETS_S, registry=r),
            reservations_active=Gauge("sluice_scheduler_reservations", "Dispatched requests not yet released", registry=r),
            reserved_kv_blocks=Gauge("sluice_scheduler_reserved_kv_blocks", "KV blocks promised per replica", ["replica"], registry=r),
            kv_blocks=Gauge("sluice_kv_blocks", "KV blocks per replica by state", ["replica", "state"], registry=r),
            router_streams_active=Gauge("sluice_scheduler_router_streams", "Open Place streams from routers", registry=r),
            replicas_ready=Gauge("sluice_scheduler_replicas_ready", "Replicas whose state stream says ready", registry=r),
            tenant_active_sequences=Gauge("sluice_tenant_active_sequences", "Queued + running sequences per tenant",
                                          ["model", "tenant"], registry=r),
            tenant_reserved_kv_share=Gauge("sluice_tenant_reserved_kv_share", "Share of the pool's KV a tenant holds (0..1)",
                                           ["model", "tenant"], registry=r),
            tenant_served_tokens_total=Counter("sluice_tenant_served_tokens", "Weighted tokens served (the VTC measure)",
                                               ["model", "class", "tenant"], registry=r),
            fairness_bound_tokens=Gauge("sluice_fairness_bound_tokens", "How far two backlogged tenants' served tokens may drift",
                                        pool, registry=r),
            prefix_hit_blocks_total=Counter("sluice_placement_prefix_hit_blocks", "Prompt blocks the chosen replica had cached", registry=r),
            prefix_queried_blocks_total=Counter("sluice_placement_prefix_queried_blocks", "Prompt blocks placement looked up", registry=r),
            overload_stage=Gauge("sluice_overload_stage", "The pool's overload stage: 0 normal, 1 batch_paused, "
                                 "2 output_capped, 3 fallback, 4 rejecting", ["model"], registry=r),
            overload_signal=Gauge("sluice_overload_signal", "What the overload controller last saw (queue_age_seconds, "
                                  "predicted_start_seconds, kv_occupancy)", ["model", "signal"], registry=r),
            overload_levers_total=Counter("sluice_overload_levers_total", "Requests served degraded by an overload "
                                          "lever (output_capped, fallback)", ["model", "lever"], registry=r),
        )

    def publish(self, core: ClusterScheduler, views: list[ReplicaView], now_s: float) -> None:
        self.reservations_active.set(len(core.ledger))
        reserved = core.ledger.reserved_kv_blocks()
        for view in views:
            blocks = reserved.get(view.replica_id, 0)
            self.reserved_kv_blocks.labels(view.replica_id).set(blocks)
            self.kv_blocks.labels(view.replica_id, "free").set(view.free_kv_blocks)
            self.kv_blocks.labels(view.replica_id, "used").set(view.total_kv_blocks - view.free_kv_blocks)
            self.kv_blocks.labels(view.replica_id, "reserved").set(blocks)
        versions = set()
        for (version, service_class), queue in core.queues().items():
            versions.add(version)
            labels = (version, CLASS_NAMES[service_class])
            self.queue_length.labels(*labels).set(len(queue))
            oldest = queue.oldest_enqueued_s()
            self.queue_oldest_age_seconds.labels(*labels).set(0.0 if oldest is None else now_s - oldest)
            self.fairness_bound_tokens.labels(*labels).set(queue.counters.served_fairness_bound)
            self._publish_tenant_queue_ages(labels, queue.tenant_oldest_enqueued_s(), now_s)
            for tenant, served in queue.counters.served.items():
                key = (version, labels[1], tenant)
                delta = served - self._served_published[key]
                if delta > 0:
                    self.tenant_served_tokens_total.labels(version, labels[1], self.tenants(tenant)).inc(delta)
                    self._served_published[key] = served
        for version in versions:
            pool_blocks = core.pool_kv_blocks(version, now_s) or 1
            shares: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
            for tenant, holding in core.tenant_holdings(version).items():
                label = self.tenants(tenant)
                shares[label][0] += holding.active_seqs
                shares[label][1] += holding.kv_blocks / pool_blocks
            for label, (seqs, share) in shares.items():
                self.tenant_active_sequences.labels(version, label).set(seqs)
                self.tenant_reserved_kv_share.labels(version, label).set(share)
            for label in self._tenant_labels_set[version] - shares.keys():
                self.tenant_active_sequences.labels(version, label).set(0)
                self.tenant_reserved_kv_share.labels(version, label).set(0)
            self._tenant_labels_set[version].update(shares)
        for version in versions:
            self.overload_stage.labels(version).set(core.overload_stage(version))
            signals = core.overload_signals(version)
            if signals is not None:
                self.overload_signal.labels(version, "queue_age_seconds").set(signals.interactive_queue_age_s)
                self.overload_signal.labels(version, "predicted_start_seconds").set(signals.predicted_start_s)
                self.overload_signal.labels(version, "kv_occupancy").set(signals.kv_occupancy)
        stats = core.prefix_stats
        self.prefix_hit_blocks_total.inc(stats.hit_blocks - self._prefix_published[0])
        self.prefix_queried_blocks_total.inc(stats.queried_blocks - self._prefix_published[1])
        self._prefix_published = [stats.hit_blocks, stats.queried_blocks]

    def _publish_tenant_queue_ages(self, pool: tuple[str, str], oldest_by_tenant: dict[str, float],
                                   now_s: float) -> None:
        ages: dict[str, float] = {}
        for tenant, enqueued_s in oldest_by_tenant.items():
            label = self.tenants(tenant)
            ages[label] = max(ages.get(label, 0.0), now_s - enqueued_s)
        for label, age_s in ages.items():
            self.tenant_queue_oldest_age_seconds.labels(*pool, label).set(age_s)
        seen = self._tenant_queue_labels_set[pool]
        for label in seen - ages.keys():  # drained since the last publish
            self.tenant_queue_oldest_age_seconds.labels(*pool, label).set(0.0)
        seen.update(ages)
