"""Per-tenant caps inside one pool, so that no key can occupy every replica.

A tenant's active sequences (queued + dispatched) and the KV it holds
(reserved + queued, in blocks) are capped, in each class apart (a tenant's
batch work, preemptible by every tenant's interactive work, does not use
up its interactive share); defaults apply to every tenant
without an override, so a key created without limits is bounded out of the
box. The gateway's token buckets bound a tenant's rate; these bound what it
holds at once, which is what crowds others out of GPU memory.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from sluice.outcomes import Reason


@dataclass(frozen=True, slots=True)
class TenantLimits:
    # Sequences queued or running in one pool at once.
    max_active_seqs: int = 256
    # Share of the pool's KV blocks reserved or queued by the tenant (0..1].
    max_kv_share: float = 0.5

    def __post_init__(self) -> None:
        if self.max_active_seqs < 1 or not 0.0 < self.max_kv_share <= 1.0:
            raise ValueError(f"tenant limits out of range: {self}")


@dataclass(frozen=True, slots=True)
class TenantLimitsTable:
    default: TenantLimits = TenantLimits()
    overrides: Mapping[str, TenantLimits] = field(default_factory=dict)

    def for_tenant(self, tenant: str) -> TenantLimits:
        return self.overrides.get(tenant, self.default)


@dataclass(frozen=True, slots=True)
class TenantHolding:
    """What a tenant holds in a pool right now."""

    active_seqs: int = 0
    kv_blocks: int = 0


@dataclass(frozen=True, slots=True)
class CapBreach:
    reason: Reason
    message: str


def check_tenant_caps(
    limits: TenantLimits, holding: TenantHolding, ask_blocks: int, pool_kv_blocks: int
) -> CapBreach | None:
    """None when the tenant may hold one more sequence of `ask_blocks`."""
    if holding.active_seqs + 1 > limits.max_active_seqs:
        return CapBreach(
            Reason.TENANT_CONCURRENCY,
            f"This key already has {holding.active_seqs} requests queued or running on this model "
            f"(at most {limits.max_active_seqs}). Retry when one finishes.",
        )
    allowed_blocks = int(limits.max_kv_share * pool_kv_blocks)
    if ask_blocks > allowed_blocks:
        # Alone over the share: waiting cannot help, so it is not a 429.
        return CapBreach(
            Reason.REQUEST_TOO_LARGE,
            f"This request needs {ask_blocks} KV blocks; this key may hold at most {allowed_blocks} of "
            f"{pool_kv_blocks} on this model ({limits.max_kv_share:.0%}). Lower max_tokens or shorten the messages.",
        )
    if holding.kv_blocks + ask_blocks > allowed_blocks:
        return CapBreach(
            Reason.TENANT_KV_SHARE,
            f"This key's requests would hold {holding.kv_blocks + ask_blocks} of {pool_kv_blocks} KV blocks "
            f"on this model (at most {limits.max_kv_share:.0%}). Retry when one finishes, or send shorter requests.",
        )
    return None
