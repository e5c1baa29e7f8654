"""The scheduler's settings (SLUICE_ environment variables) and the
placement policy they build. Each knob is explained where the policy
defines it (sluice.placement.config, sluice.admission)."""

import json
from typing import Literal

from pydantic import Field, field_validator, model_validator

from sluice.admission.overload import OverloadPolicy, StageThresholds, default_stage_thresholds
from sluice.admission.reservation import ReservationPolicy
from sluice.admission.tenant_caps import TenantLimits, TenantLimitsTable
from sluice.config import SluiceSettings
from sluice.placement.asks import ServiceClass
from sluice.placement.config import ClassPolicy, OverloadLevers, PlacementConfig

CLASS_BY_NAME = {"interactive": ServiceClass.INTERACTIVE, "batch": ServiceClass.BATCH}


class SchedulerSettings(SluiceSettings):
    replica_discovery: Literal["static", "endpointslices"] = Field(
        "static", description="static: SLUICE_REPLICA_ADDRESSES; endpointslices: follow each replica Service's "
        "EndpointSlices in SLUICE_KUBERNETES_NAMESPACE, one address per ready pod",
    )
    replica_addresses: str = Field(
        "127.0.0.1:50061",
        description="static discovery: comma-separated host:port of every replica to watch",
    )
    replica_services: str = Field(
        "", description="endpointslices: comma-separated names of the per-version replica Services",
    )
    kubernetes_namespace: str = Field("", description="endpointslices: the namespace of those Services")
    replica_port_name: str = Field("grpc", description="endpointslices: the slice port name of the replica's gRPC port")
    # A full re-list this often even while the watch is healthy: a missed
    # event can last at most this long. The API server is asked for one
    # list per scheduler per period, which is cheap at any sane value.
    replica_resync_s: float = Field(300.0, gt=0, description="endpointslices: full re-list period")
    interactive_ttft_slo_s: float = Field(2.0, gt=0, description="predicted start past this -> 429 over_capacity")
    batch_ttft_slo_s: float = Field(600.0, gt=0, description="the same for service_tier=flex")
    interactive_max_queue_wait_s: float = Field(10.0, gt=0, description="queued longer -> 429 queue_timeout")
    batch_max_queue_wait_s: float = Field(3600.0, gt=0)
    interactive_max_queue_length: int = Field(1024, ge=1, description="per pool; past it 429 queue_full")
    batch_max_queue_length: int = Field(10000, ge=1)
    default_output_tokens_interactive: int = Field(512, ge=1, description="reserved when max_tokens is not given")
    default_output_tokens_batch: int = Field(1024, ge=1)
    kv_buffer_fraction: float = Field(0.0, ge=0, le=4, description="extra reserved on top of the bounded output")
    tenant_max_active_seqs: int = Field(256, ge=1, description="per tenant and pool, queued + running")
    tenant_max_kv_share: float = Field(0.5, gt=0, le=1, description="of a pool's KV, reserved + queued")
    tenant_limits: str = Field(
        "", description='JSON overrides per tenant: {"acme": {"max_active_seqs": 64, "max_kv_share": 0.8}}'
    )
    vtc_input_weight: float = Field(1.0, gt=0)
    vtc_output_weight: float = Field(2.0, gt=0)
    batch_max_share: float = Field(0.5, gt=0, le=1, description="of KV and seats while interactive is present")
    batch_pause_queue_age_s: float = Field(0.5, ge=0, description="no batch while interactive queued this long")
    long_prompt_tokens: int = Field(2048, ge=0, description="prompts this long take the long-prefill lane; 0 = off")
    long_prefills_per_replica: int = Field(1, ge=1)
    prefix_aware: bool = Field(True, description="score replicas by the prompt blocks they cache")
    prefix_load_margin: float = Field(0.25, ge=0, le=1)
    schedule_interval_s: float = Field(0.05, gt=0, description="deadline sweep while anything is queued")
    overload_enabled: bool = Field(True, description="overload stages on; off = plain admission only")
    overload_thresholds: str = Field(
        "", description="JSON list of 4 stage thresholds (StageThresholds fields); empty = derived from the "
        "interactive SLO",
    )
    overload_enter_hold_s: float = Field(0.25, ge=0, description="a breach must last this long to step up")
    overload_exit_hold_s: float = Field(3.0, ge=0, description="all clear this long to step down")
    overload_output_cap_tokens: int = Field(256, ge=1, description="stage 2: max_tokens of degradable requests")
    overload_prompt_cap_tokens: int = Field(4096, ge=1, description="stage 2: longer degradable prompts refused")
    overload_degradable_classes: str = Field("", description="comma-separated classes degraded at stage 2")
    overload_reject_predicted_start_s: float = Field(
        0.0, ge=0, description="stage 4: refuse what would wait longer; 0 = a quarter of the interactive SLO")
    critical_kv_reserve_share: float = Field(0.05, ge=0, lt=1, description="of each replica, kept for critical keys")
    critical_queue_slots: int = Field(16, ge=0, description="places per queue kept for critical keys")

    @model_validator(mode="after")
    def _discovery_is_complete(self) -> "SchedulerSettings":
        if self.replica_discovery == "endpointslices":
            missing = [name for name, value in (("SLUICE_REPLICA_SERVICES", self.replica_service_list()),
                                                ("SLUICE_KUBERNETES_NAMESPACE", self.kubernetes_namespace.strip()),
                                                ("SLUICE_REPLICA_PORT_NAME", self.replica_port_name.strip()))
                       if not value]
            if missing:
                raise ValueError(f"SLUICE_REPLICA_DISCOVERY=endpointslices needs {' and '.join(missing)}")
        return self

    @field_validator("tenant_limits")
    @classmethod
    def _valid_json(cls, value: str) -> str:
        if value:
            parsed = json.loads(value)
            if not isinstance(parsed, dict):
                raise ValueError("SLUICE_TENANT_LIMITS must be a JSON object of tenant -> limits")
            for limits in parsed.values():
                TenantLimits(**limits)
        return value

    @field_validator("overload_thresholds")
    @classmethod
    def _valid_thresholds(cls, value: str) -> str:
        if value:
            OverloadPolicy(tuple(StageThresholds(**stage) for stage in json.loads(value)))
        return value

    @field_validator("overload_degradable_classes")
    @classmethod
    def _known_classes(cls, value: str) -> str:
        unknown = {c.strip() for c in value.split(",") if c.strip()} - CLASS_BY_NAME.keys()
        if unknown:
            raise ValueError(f"unknown classes {sorted(unknown)}; use interactive, batch")
        return value

    def overload_levers(self) -> OverloadLevers:
        stages = (
            tuple(StageThresholds(**stage) for stage in json.loads(self.overload_thresholds))
            if self.overload_thresholds else default_stage_thresholds(self.interactive_ttft_slo_s)
        )
        return OverloadLevers(
            policy=OverloadPolicy(stages, self.overload_enter_hold_s, self.overload_exit_hold_s, self.overload_enabled),
            degraded_output_tokens=self.overload_output_cap_tokens,
            degraded_prompt_tokens=self.overload_prompt_cap_tokens,
            degradable_classes=frozenset(
                CLASS_BY_NAME[c.strip()] for c in self.overload_degradable_classes.split(",") if c.strip()),
            reject_predicted_start_s=self.overload_reject_predicted_start_s or self.interactive_ttft_slo_s / 4,
            critical_kv_reserve_share=self.critical_kv_reserve_share,
            critical_queue_slots=self.critical_queue_slots,
        )

    def replica_address_list(self) -> list[str]:
        return [a.strip() for a in self.replica_addresses.split(",") if a.strip()]

    def replica_service_list(self) -> list[str]:
        return [s.strip() for s in self.replica_services.split(",") if s.strip()]

    def placement_config(self) -> PlacementConfig:
        default = TenantLimits(self.tenant_max_active_seqs, self.tenant_max_kv_share)
        overrides = {
            tenant: TenantLimits(**{"max_active_seqs": default.max_active_seqs,
                                    "max_kv_share": default.max_kv_share, **limits})
            for tenant, limits in (json.loads(self.tenant_limits) if self.tenant_limits else {}).items()
        }
        return PlacementConfig(
            interactive=ClassPolicy(
                self.interactive_ttft_slo_s, self.interactive_max_queue_wait_s, self.interactive_max_queue_length
            ),
            batch=ClassPolicy(self.batch_ttft_slo_s, self.batch_max_queue_wait_s, self.batch_max_queue_length),
            reservation=ReservationPolicy(
                self.default_output_tokens_interactive, self.default_output_tokens_batch, self.kv_buffer_fraction
            ),
            tenants=TenantLimitsTable(default, overrides),
            vtc_input_weight=self.vtc_input_weight,
            vtc_output_weight=self.vtc_output_weight,
            batch_max_share=self.batch_max_share,
            batch_pause_queue_age_s=self.batch_pause_queue_age_s,
            long_prompt_tokens=self.long_prompt_tokens,
            long_prefills_per_replica=self.long_prefills_per_replica,
            prefix_aware=self.prefix_aware,
            prefix_load_margin=self.prefix_load_margin,
            overload=self.overload_levers(),
        )
