"""The view model `sluice top` shows: frozen rows, None where a signal is
not available (its family absent, its target down, or too few scrapes
for a rate), which the renderer writes as "n/a" and JSON as null."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# sluice_overload_stage's values (the scheduler's overload controller).
OVERLOAD_STAGE_NAMES = ("normal", "batch_paused", "output_capped", "fallback", "rejecting")
# Histograms without a class label (gateways before it had one) report
# for the whole model under this class.
ALL_CLASSES = "all"
OTHER_TENANT = "other"


@dataclass(frozen=True, slots=True)
class TargetStatus:
    kind: str
    url: str
    up: bool
    error: str


@dataclass(frozen=True, slots=True)
class ClassRow:
    """One pool (model version on the scheduler, alias on the gateway) and class."""

    model: str
    service_class: str
    queue_length: float | None
    queue_oldest_age_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None


@dataclass(frozen=True, slots=True)
class ModelRow:
    model: str
    output_tokens_per_s: float | None
    generated_tokens: float | None  # the counter's current total
    overload_stage: int | None
    overload_stage_name: str | None


@dataclass(frozen=True, slots=True)
class ReplicaRow:
    replica: str
    model: str
    source: str  # "replica" (its own page) or "scheduler" (its view, the replica's page unavailable)
    ready: bool | None
    kv_free_blocks: float | None
    kv_used_blocks: float | None
    kv_reserved_blocks: float | None  # promised by the scheduler's ledger
    kv_occupancy: float | None  # used / (free + used)
    running: float | None
    waiting: float | None
    step_time_s: float | None
    output_tokens_per_s: float | None
    generated_tokens: float | None


@dataclass(frozen=True, slots=True)
class TenantRow:
    model: str
    tenant: str  # OTHER_TENANT folds every tenant below the top N
    served_tokens_per_s: float | None
    reserved_kv_share: float | None
    active_sequences: float | None


@dataclass(frozen=True, slots=True)
class RejectionRow:
    reason: str
    per_s: float


@dataclass(frozen=True, slots=True)
class FleetView:
    interval_s: float
    targets: tuple[TargetStatus, ...]
    models: tuple[ModelRow, ...]
    classes: tuple[ClassRow, ...]
    replicas: tuple[ReplicaRow, ...]
    tenants: tuple[TenantRow, ...]
    rejections: tuple[RejectionRow, ...]
    # Which service's counter the rejections come from (gateway, router or
    # scheduler: the most complete one up, never a sum, since each relays
    # the refusals behind it); None when none could be read twice.
    rejections_source: str | None
    output_tokens_per_s: float | None
    replicas_ready: float | None  # the scheduler's count

    def to_json_dict(self) -> dict:
        return asdict(self)
