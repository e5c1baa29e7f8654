import pytest

from sluice.admission.tenant_caps import TenantHolding, TenantLimits, TenantLimitsTable, check_tenant_caps
from sluice.outcomes import Reason


def test_default_applies_to_unknown_tenants_and_overrides_to_their_own():
    vip = TenantLimits(max_active_seqs=1000, max_kv_share=1.0)
    table = TenantLimitsTable(default=TenantLimits(max_active_seqs=4, max_kv_share=0.25), overrides={"vip": vip})
    assert table.for_tenant("vip") is vip
    assert table.for_tenant("somebody-new") == TenantLimits(4, 0.25)
    assert TenantLimitsTable().for_tenant("x") == TenantLimits()  # bounded out of the box


def test_concurrency_counts_every_active_sequence():
    limits = TenantLimits(max_active_seqs=3, max_kv_share=1.0)
    assert check_tenant_caps(limits, TenantHolding(active_seqs=2), 1, 100) is None
    breach = check_tenant_caps(limits, TenantHolding(active_seqs=3), 1, 100)
    assert breach is not None and breach.reason is Reason.TENANT_CONCURRENCY
    assert "at most 3" in breach.message


def test_kv_share_of_the_pool():
    limits = TenantLimits(max_active_seqs=100, max_kv_share=0.5)
    assert check_tenant_caps(limits, TenantHolding(1, 40), 10, 100) is None  # exactly 50 of 100
    breach = check_tenant_caps(limits, TenantHolding(1, 40), 11, 100)
    assert breach is not None and breach.reason is Reason.TENANT_KV_SHARE
    assert "51 of 100" in breach.message


def test_concurrency_is_checked_first():
    breach = check_tenant_caps(TenantLimits(1, 0.1), TenantHolding(1, 100), 100, 100)
    assert breach is not None and breach.reason is Reason.TENANT_CONCURRENCY


@pytest.mark.parametrize(("seqs", "share"), [(0, 0.5), (1, 0.0), (1, 1.5)])
def test_limits_are_validated(seqs, share):
    with pytest.raises(ValueError):
        TenantLimits(max_active_seqs=seqs, max_kv_share=share)
