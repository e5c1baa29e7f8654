import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.placement.vtc import VirtualTokenCounters


def test_cost_weighs_output_tokens_more():
    counters = VirtualTokenCounters(input_weight=1.0, output_weight=2.0)
    assert counters.cost(100, 10) == 120.0


def test_pick_smallest_counter_ties_by_name():
    counters = VirtualTokenCounters(counters={"b": 5.0, "c": 5.0, "a": 9.0})
    assert counters.pick(["a", "b", "c"]) == "b"
    assert counters.pick(["a", "new"]) == "new"  # unseen tenants start at 0
    assert counters.pick([]) is None


def test_a_returning_tenant_is_lifted_to_the_smallest_backlogged_counter():
    counters = VirtualTokenCounters(counters={"busy1": 900.0, "busy2": 400.0, "idle": 10.0})
    counters.lift("idle", ["busy1", "busy2", "idle"])
    assert counters.counters["idle"] == 400.0
    counters.counters["ahead"] = 1000.0
    counters.lift("ahead", ["busy1", "busy2"])
    assert counters.counters["ahead"] == 1000.0  # never lowered
    counters.lift("alone", [])
    assert counters.counters["alone"] == 0.0


def test_a_newcomer_is_lifted_to_a_tenant_with_work_in_flight_and_nothing_queued():
    """Every request of the busy tenant was dispatched (its queue is empty):
    it is still active, so the newcomer starts at its counter instead of 0
    and does not take every dispatch until it has caught up."""
    counters = VirtualTokenCounters()
    for _ in range(3):
        counters.charge_dispatch("busy", prompt_tokens=500, output_tokens=100)
    counters.lift("new", [])
    assert counters.counters["new"] == counters.counters["busy"] == 2100.0
    for _ in range(3):
        counters.settle_release("busy", charged_output_tokens=100, served_output_tokens=100)
    assert counters.in_flight == {}
    counters.lift("later", [])
    assert counters.counters.get("later", 0.0) == 0.0  # nobody active: nothing to lift to


def test_an_abandoned_dispatch_keeps_its_charge_and_leaves_the_active_set():
    counters = VirtualTokenCounters()
    counters.charge_dispatch("t", 100, 50)
    counters.charge_dispatch("t", 100, 50)
    counters.abandon("t")
    assert counters.in_flight == {"t": 1} and counters.counters["t"] == 400.0
    counters.abandon("t")
    assert counters.in_flight == {}


def test_dispatch_charges_the_bound_release_settles_to_what_was_generated():
    counters = VirtualTokenCounters()
    counters.charge_dispatch("t", prompt_tokens=100, output_tokens=50)
    assert counters.counters["t"] == 200.0 and counters.served["t"] == 100.0
    assert counters.fairness_bound == 200.0
    counters.settle_release("t", charged_output_tokens=50, served_output_tokens=20)
    assert counters.counters["t"] == 100.0 + 40.0
    assert counters.served["t"] == 100.0 + 40.0
    counters.charge_dispatch("u", 10, 10)
    assert counters.fairness_bound == 200.0  # the largest single request cost so far
    assert counters.served_fairness_bound == 400.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 500), st.integers(1, 500)), min_size=2, max_size=4),
       st.integers(10, 200))
def test_backlogged_tenants_stay_within_the_bound(request_sizes, steps):
    """Each tenant always has more of its fixed-size requests queued; pick and charge."""
    counters = VirtualTokenCounters()
    tenants = [f"t{i}" for i in range(len(request_sizes))]
    for _ in range(steps):
        tenant = counters.pick(tenants)
        counters.charge_dispatch(tenant, *request_sizes[tenants.index(tenant)])
        values = [counters.counters.get(t, 0.0) for t in tenants]
        assert max(values) - min(values) <= counters.fairness_bound
    assert counters.fairness_bound == pytest.approx(max(counters.cost(p, o) for p, o in request_sizes))
