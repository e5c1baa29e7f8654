"""The scheduler's metrics published from a real ClusterScheduler: each
tenant's oldest queued request, by pool and class, on the clock passed in;
tenants past the top N fold into `other`; process collectors are there."""

from prometheus_client import generate_latest

from sluice.admission.overload import OverloadPolicy
from sluice.admission.tenant_caps import TenantLimits, TenantLimitsTable
from sluice.placement.asks import Ask, Queued, ServiceClass
from sluice.placement.cluster import ClusterScheduler
from sluice.placement.config import ClassPolicy, OverloadLevers, PlacementConfig
from sluice.placement.replica_choice import ReplicaView
from sluice.scheduler.metrics import SchedulerMetrics
from sluice.telemetry.tenant_labels import TenantLabels

LOOSE = ClassPolicy(ttft_slo_s=1e9, max_queue_wait_s=1e9, max_queue_length=1000)


def make_scheduler() -> ClusterScheduler:
    # schedule() is never called here: nothing leaves a queue unless dropped.
    scheduler = ClusterScheduler(PlacementConfig(
        interactive=LOOSE, batch=LOOSE,
        tenants=TenantLimitsTable(default=TenantLimits(max_active_seqs=1000, max_kv_share=1.0)),
        overload=OverloadLevers(policy=OverloadPolicy(enabled=False), critical_kv_reserve_share=0.0,
                                critical_queue_slots=0),
    ))
    scheduler.observe_replica(ReplicaView(
        replica_id="r0", address="r0:50061", model_version="v1", total_kv_blocks=100, free_kv_blocks=100,
        block_size_tokens=16, num_running=0, num_waiting=0, ready=True, seen_at_s=0.0,
    ))
    return scheduler


def enqueue(scheduler: ClusterScheduler, request_id: str, tenant: str, now_s: float, *,
            owner: str = "router-0", service_class: ServiceClass = ServiceClass.INTERACTIVE) -> None:
    ask = Ask(request_id=request_id, owner=owner, tenant=tenant, model_version="v1", service_class=service_class,
              prompt_tokens=100, requested_output_tokens=60, max_output_tokens=1000)
    assert isinstance(scheduler.enqueue(ask, now_s), Queued)


def age(metrics: SchedulerMetrics, tenant: str, service_class: str = "interactive") -> float | None:
    return metrics.registry.get_sample_value(
        "sluice_tenant_queue_oldest_age_seconds", {"model": "v1", "class": service_class, "tenant": tenant})


def test_each_tenant_shows_the_age_of_its_oldest_queued_request():
    scheduler, metrics = make_scheduler(), SchedulerMetrics.create()
    enqueue(scheduler, "a1", "acme", 1.0, owner="router-a")
    enqueue(scheduler, "b1", "bolt", 1.5)
    enqueue(scheduler, "a2", "acme", 2.0, owner="router-a")
    enqueue(scheduler, "b2", "bolt", 3.0, service_class=ServiceClass.BATCH)
    metrics.publish(scheduler, scheduler.replicas(), 4.0)
    assert age(metrics, "acme") == 3.0
    assert age(metrics, "bolt") == 2.5
    assert age(metrics, "bolt", "batch") == 1.0
    assert age(metrics, "acme", "batch") is None  # acme never queued batch work
    # The pool's oldest is the oldest tenant's.
    assert metrics.registry.get_sample_value(
        "sluice_queue_oldest_age_seconds", {"model": "v1", "class": "interactive"}) == 3.0

    assert scheduler.drop_owner("router-a") == 2
    metrics.publish(scheduler, scheduler.replicas(), 5.0)
    assert age(metrics, "acme") == 0.0  # drained: back to 0, not stuck at its last age
    assert age(metrics, "bolt") == 3.5


def test_tenants_past_the_top_n_show_as_other_with_the_oldest_of_them():
    scheduler = make_scheduler()
    metrics = SchedulerMetrics.create()
    metrics.tenants = TenantLabels(max_tenants=1)
    enqueue(scheduler, "a1", "acme", 2.0)
    enqueue(scheduler, "b1", "bolt", 1.0)
    enqueue(scheduler, "c1", "cask", 0.5)
    metrics.publish(scheduler, scheduler.replicas(), 4.0)
    assert age(metrics, "acme") == 2.0
    assert age(metrics, "other") == 3.5
    assert age(metrics, "bolt") is None and age(metrics, "cask") is None


def test_the_scheduler_registry_serves_the_process_collectors():
    text = generate_latest(SchedulerMetrics.create().registry).decode()
    assert "process_cpu_seconds_total" in text
    assert "process_resident_memory_bytes" in text
    assert "python_info" in text
