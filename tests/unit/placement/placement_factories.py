"""Small builders shared by the placement tests.

Defaults are generous on purpose (huge SLOs and queue waits, tenant caps
that never bind) so a test only meets the limit it sets itself. Block size
16: `make_ask(prompt=100, max_tokens=60)` reserves 160 tokens = 10 blocks.
"""

from __future__ import annotations

from dataclasses import replace

from sluice.admission.overload import OverloadPolicy
from sluice.admission.tenant_caps import TenantLimits, TenantLimitsTable
from sluice.placement.asks import Ask, ServiceClass
from sluice.placement.cluster import ClusterScheduler
from sluice.placement.config import ClassPolicy, OverloadLevers, PlacementConfig
from sluice.placement.replica_choice import ReplicaView

BLOCK = 16
VERSION = "v1"
INTERACTIVE = ServiceClass.INTERACTIVE
BATCH = ServiceClass.BATCH

LOOSE = ClassPolicy(ttft_slo_s=1e9, max_queue_wait_s=1e9, max_queue_length=100_000)
UNCAPPED = TenantLimitsTable(default=TenantLimits(max_active_seqs=1_000_000, max_kv_share=1.0))
# No overload stages and no critical reserve: the overload tests turn them on.
NO_OVERLOAD = OverloadLevers(policy=OverloadPolicy(enabled=False), critical_kv_reserve_share=0.0,
                             critical_queue_slots=0)


def make_view(
    replica_id: str = "r0", *, total: int = 100, free: int | None = None, version: str = VERSION,
    block: int = BLOCK, ready: bool = True, seen_at_s: float = 0.0, max_num_seqs: int = 0,
    step_time_s: float = 0.0, running: int = 0, waiting: int = 0,
) -> ReplicaView:
    return ReplicaView(
        replica_id=replica_id, address=f"{replica_id}:50051", model_version=version, total_kv_blocks=total,
        free_kv_blocks=total if free is None else free, block_size_tokens=block, num_running=running,
        num_waiting=waiting, ready=ready, seen_at_s=seen_at_s, max_num_seqs=max_num_seqs, step_time_s=step_time_s,
    )


def make_ask(
    request_id: str, *, tenant: str = "acme", owner: str = "router-0", version: str = VERSION,
    service_class: ServiceClass = INTERACTIVE, prompt: int = 100, max_tokens: int = 60, room: int = 100_000,
    hashes: tuple[bytes, ...] = (), hash_block: int | None = None, deadline_s: float = 0.0,
    critical: bool = False, degradable: bool = False, fallback: str = "",
) -> Ask:
    return Ask(
        request_id=request_id, owner=owner, tenant=tenant, model_version=version, service_class=service_class,
        prompt_tokens=prompt, requested_output_tokens=max_tokens, max_output_tokens=room,
        prompt_block_hashes=hashes, block_size_tokens=(BLOCK if hashes else 0) if hash_block is None else hash_block,
        deadline_s=deadline_s, critical=critical, degradable=degradable, fallback_model_version=fallback,
    )


def make_config(**overrides) -> PlacementConfig:
    base = PlacementConfig(interactive=LOOSE, batch=LOOSE, tenants=UNCAPPED, overload=NO_OVERLOAD)
    return replace(base, **overrides)


def make_scheduler(*views: ReplicaView, **config) -> ClusterScheduler:
    scheduler = ClusterScheduler(make_config(**config))
    for view in views or (make_view(),):
        scheduler.observe_replica(view)
    return scheduler


def hashes(*names: str) -> tuple[bytes, ...]:
    return tuple(name.encode() for name in names)
