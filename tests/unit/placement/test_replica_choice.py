from sluice.placement.replica_choice import (
    STALE_STATE_S, DispatchDecision, PlacementAsk, RejectDecision, ReplicaView, choose_replica,
)
from sluice.placement.reservations import Reservation, ReservationLedger


def view(replica_id: str, *, version="v1", total=100, ready=True, seen_at_s=0.0, running=0) -> ReplicaView:
    return ReplicaView(replica_id, f"{replica_id}:1", version, total, total, 16, running, 0, ready, seen_at_s)


ASK = PlacementAsk("r1", "acme", "v1", prompt_tokens=100, max_output_tokens=60)  # 10 blocks


def test_picks_the_replica_with_most_unreserved_kv():
    decision = choose_replica(ASK, [view("a"), view("b")], {"a": 50}, now_s=1.0)
    assert decision == DispatchDecision("b", "b:1", 10)


def test_ignores_other_versions_unready_and_stale_replicas():
    replicas = [view("a", version="v2"), view("b", ready=False), view("c", seen_at_s=-STALE_STATE_S - 1)]
    decision = choose_replica(ASK, replicas, {}, now_s=0.0)
    assert isinstance(decision, RejectDecision) and decision.reason == "no_replica"


def test_rejects_over_capacity_when_no_replica_has_room():
    decision = choose_replica(ASK, [view("a", total=20)], {"a": 15}, now_s=0.0)
    assert isinstance(decision, RejectDecision) and decision.reason == "over_capacity"
    assert decision.retry_after_s > 0


def test_ledger_releases_by_owner_only_and_drops_a_broken_stream():
    ledger = ReservationLedger()
    ledger.reserve(Reservation("r1", "router-1", "a", 10, 0.0))
    ledger.reserve(Reservation("r2", "router-1", "a", 5, 0.0))
    ledger.reserve(Reservation("r3", "router-2", "b", 7, 0.0))
    assert ledger.release("r3", "router-1") is None  # not its reservation
    assert ledger.reserved_kv_blocks() == {"a": 15, "b": 7}
    assert {r.request_id for r in ledger.release_owner("router-1")} == {"r1", "r2"}
    assert ledger.reserved_kv_blocks() == {"b": 7}
    assert len(ledger) == 1
