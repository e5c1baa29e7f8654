"""Every knob of the cluster policy, validated once. The scheduler service
fills these from SLUICE_ settings; the simulator from its scenario."""

from dataclasses import dataclass, field

from sluice.admission.overload import OverloadPolicy
from sluice.admission.reservation import ReservationPolicy
from sluice.admission.tenant_caps import TenantLimitsTable
from sluice.placement.asks import ServiceClass


@dataclass(frozen=True, slots=True)
class ClassPolicy:
    # A request whose predicted start is later than this is refused at once
    # (429 over_capacity, Retry-After = when it would fit) instead of being
    # left to miss its SLO in a queue.
    ttft_slo_s: float
    # A queued request leaves with 429 queue_timeout after this long (or at
    # the client's deadline, if sooner): a prediction can be wrong, and a
    # queue is never a place to time out silently.
    max_queue_wait_s: float
    # Entries per pool; past it, 429 queue_full.
    max_queue_length: int

    def __post_init__(self) -> None:
        if self.ttft_slo_s <= 0 or self.max_queue_wait_s <= 0 or self.max_queue_length < 1:
            raise ValueError(f"class policy out of range: {self}")


@dataclass(frozen=True, slots=True)
class OverloadLevers:
    """What each overload stage does (sluice.admission.overload says when).

    Critical tenants (a `critical` priority on their key) are exempt from
    every lever and keep a reserve that no other request may take."""

    policy: OverloadPolicy = OverloadPolicy()
    # Stage 2, for degradable requests (the key says so, or the class is
    # listed): max_tokens is capped here (the response says
    # `x-sluice-degraded: output_capped`), and prompts of at least
    # `degraded_prompt_tokens` are refused with over_capacity: one of them
    # holds the KV and prefill of dozens of chats.
    degraded_output_tokens: int = 256
    degraded_prompt_tokens: int = 4096
    degradable_classes: frozenset[ServiceClass] = frozenset()
    # Stage 4: an interactive request is queued only if its predicted start
    # is within this; the rest are refused at once with a Retry-After, so
    # the queue keeps a margin for prediction error instead of filling up
    # to the SLO.
    reject_predicted_start_s: float = 0.5
    # Through every stage, this share of each replica's KV blocks and seats
    # is kept for critical tenants (what they hold counts toward it), and
    # this many places in each class queue.
    critical_kv_reserve_share: float = 0.05
    critical_queue_slots: int = 16

    def __post_init__(self) -> None:
        if self.degraded_output_tokens < 1 or self.degraded_prompt_tokens < 1:
            raise ValueError("degraded caps must be >= 1 token")
        if self.reject_predicted_start_s < 0:
            raise ValueError("reject_predicted_start_s must be >= 0")
        if not 0.0 <= self.critical_kv_reserve_share < 1.0 or self.critical_queue_slots < 0:
            raise ValueError("critical_kv_reserve_share must be within [0, 1) and critical_queue_slots >= 0")


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    interactive: ClassPolicy = ClassPolicy(ttft_slo_s=2.0, max_queue_wait_s=10.0, max_queue_length=1024)
    batch: ClassPolicy = ClassPolicy(ttft_slo_s=600.0, max_queue_wait_s=3600.0, max_queue_length=10000)
    reservation: ReservationPolicy = ReservationPolicy()
    tenants: TenantLimitsTable = field(default_factory=TenantLimitsTable)
    # VTC weights: what a prompt token and an output token cost a tenant's
    # counter. Output tokens cost more: each is a whole decode step's share.
    vtc_input_weight: float = 1.0
    vtc_output_weight: float = 2.0
    # While interactive work is queued or running in a pool, batch holds at
    # most this share of its KV blocks and seats (it soaks the rest of the
    # time). Interactive may also take KV that batch holds: the replica then
    # preempts the batch sequence by recompute.
    batch_max_share: float = 0.5
    # No batch is dispatched while the oldest queued interactive request has
    # waited longer than this: the pool is short for the SLO class.
    batch_pause_queue_age_s: float = 0.5
    # Prompts of at least this many tokens take a place in the pool's
    # long-prefill lane; at most `long_prefills_per_replica` x replicas of
    # them prefill at once, so near-context prompts cannot take every
    # replica's prefill budget from the chats. 0 = no lane.
    long_prompt_tokens: int = 2048
    long_prefills_per_replica: int = 1
    # Score replicas by the prompt blocks they already cache. Off: placement
    # ignores the prompt's hashes (least loaded only), the baseline the
    # prefix-placement benchmark measures against.
    prefix_aware: bool = True
    # Prefix-aware choice keeps to replicas whose load (the larger of KV and
    # seat utilisation, 0..1) is within this of the least-loaded one.
    prefix_load_margin: float = 0.25
    # A replica whose last state report is older than this is treated as gone.
    stale_state_s: float = 5.0
    # A lease lets a replica drop a request whose router vanished.
    lease_ttl_s: float = 3600.0
    overload: OverloadLevers = OverloadLevers()

    def __post_init__(self) -> None:
        if not 0.0 < self.batch_max_share <= 1.0:
            raise ValueError("batch_max_share must be within (0, 1]")
        if self.vtc_input_weight <= 0 or self.vtc_output_weight <= 0:
            raise ValueError("VTC weights must be > 0")
        if self.long_prompt_tokens < 0 or self.long_prefills_per_replica < 1:
            raise ValueError("long_prompt_tokens must be >= 0 and long_prefills_per_replica >= 1")
        if not 0.0 <= self.prefix_load_margin <= 1.0:
            raise ValueError("prefix_load_margin must be within [0, 1]")
        if self.overload.critical_queue_slots >= min(self.interactive.max_queue_length, self.batch.max_queue_length):
            raise ValueError("critical_queue_slots must leave room in each queue for everyone else")

    def class_policy(self, is_batch: bool) -> ClassPolicy:
        return self.batch if is_batch else self.interactive
