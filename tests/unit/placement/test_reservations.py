import pytest

from sluice.placement.reservations import Reservation, ReservationLedger

from placement_factories import BATCH, INTERACTIVE


def reservation(request_id, *, owner="router-1", tenant="a", replica="r0", cls=INTERACTIVE, blocks=10):
    return Reservation(request_id, owner, tenant, "v1", replica, cls, 100, 60, blocks, False, 0.0)


def test_holdings_per_replica_class_and_tenant():
    ledger = ReservationLedger()
    ledger.reserve(reservation("r1", blocks=10))
    ledger.reserve(reservation("r2", blocks=5, cls=BATCH))
    ledger.reserve(reservation("r3", blocks=7, replica="r1", tenant="b"))
    assert ledger.holding("r0").kv_blocks == [10, 5] and ledger.holding("r0").seats == [1, 1]
    assert ledger.reserved_kv_blocks() == {"r0": 15, "r1": 7}
    assert ledger.tenant_holding("v1", "a") == (2, 15) and ledger.tenant_holding("v1", "zz") == (0, 0)
    assert [r.request_id for r in ledger.on_replica("r1")] == ["r3"]
    assert len(ledger) == 3 and "r2" in ledger
    with pytest.raises(ValueError):
        ledger.reserve(reservation("r1"))


def test_release_by_owner_only_and_drop_a_broken_stream():
    ledger = ReservationLedger()
    ledger.reserve(reservation("r1"))
    ledger.reserve(reservation("r2", blocks=5))
    ledger.reserve(reservation("r3", owner="router-2", replica="r1", tenant="b", blocks=7))
    assert ledger.release("r3", "router-1") is None
    assert {r.request_id for r in ledger.release_owner("router-1")} == {"r1", "r2"}
    assert ledger.reserved_kv_blocks() == {"r1": 7}
    assert ledger.release("r3").request_id == "r3"
    assert ledger.release("r3") is None
    assert (len(ledger), ledger.reserved_kv_blocks(), ledger.tenant_holding("v1", "b")) == (0, {}, (0, 0))
    assert ledger.holding("r0").total_kv_blocks == 0


def test_mark_started_once():
    ledger = ReservationLedger()
    ledger.reserve(reservation("r1"))
    assert ledger.mark_started("r1", 2.5).started_at_s == 2.5
    assert ledger.mark_started("r1", 3.0) is None
    assert ledger.get("r1").started_at_s == 2.5
    assert ledger.mark_started("unknown", 1.0) is None
