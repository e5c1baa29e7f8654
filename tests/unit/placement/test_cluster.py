"""ClusterScheduler scenarios: what enqueue answers, what schedule
dispatches (class order, batch gates, the long-prefill lane, prefix-aware
choice, fairness by VTC), deadlines, cancels and tenant caps."""

from dataclasses import replace

import pytest

from sluice.admission.overload import OverloadPolicy
from sluice.admission.prediction import PRIOR_LATE_FACTOR
from sluice.admission.reservation import ReservationPolicy
from sluice.admission.tenant_caps import TenantHolding, TenantLimits, TenantLimitsTable
from sluice.outcomes import Reason
from sluice.placement.asks import Dispatched, Queued, Refused
from sluice.placement.cluster import RETRY_SLO_MARGIN
from sluice.placement.config import ClassPolicy, OverloadLevers

from placement_factories import BATCH, INTERACTIVE, LOOSE, hashes, make_ask, make_scheduler, make_view


def dispatched(decisions) -> dict[str, Dispatched]:
    return {d.request_id: d for d in decisions if isinstance(d, Dispatched)}


def refused(decisions) -> dict[str, Refused]:
    return {d.request_id: d for d in decisions if isinstance(d, Refused)}


def enqueue_all(scheduler, asks, now_s=0.0):
    answers = [scheduler.enqueue(ask, now_s) for ask in asks]
    assert all(isinstance(a, Queued) for a in answers), answers
    return answers


# -- enqueue: never fits, no replica, duplicates, queue full ------------------

def test_a_request_that_fits_now_is_queued_with_no_predicted_wait():
    scheduler = make_scheduler()
    assert scheduler.enqueue(make_ask("q1"), 0.0) == Queued("q1", 0.0, "v1")
    [decision] = scheduler.schedule(0.0)
    assert decision == Dispatched("q1", "router-0", "r0", "r0:50051", 10, 0.0, 0, "v1")


def test_a_prompt_larger_than_the_largest_replica_is_too_large():
    scheduler = make_scheduler(make_view("small", total=10), make_view("big", total=20))
    answer = scheduler.enqueue(make_ask("q1", prompt=20 * 16), 0.0)
    assert isinstance(answer, Refused) and answer.reason is Reason.REQUEST_TOO_LARGE
    assert answer.retry_after_s == 0.0
    assert isinstance(scheduler.enqueue(make_ask("q2", prompt=20 * 16 - 1), 0.0), Queued)
    assert dispatched(scheduler.schedule(0.0))["q2"].reserved_kv_blocks == 20  # capped at the largest replica


@pytest.mark.parametrize("view", [
    make_view(ready=False), make_view(seen_at_s=-5.01), make_view(version="v2"),
], ids=["not-ready", "stale", "other-version"])
def test_no_live_replica(view):
    scheduler = make_scheduler(view)
    answer = scheduler.enqueue(make_ask("q1"), 0.0)
    assert isinstance(answer, Refused) and answer.reason is Reason.NO_REPLICA and answer.retry_after_s > 0
    assert not scheduler.queues() or all(len(q) == 0 for q in scheduler.queues().values())


def test_queued_requests_are_refused_when_their_replicas_go_stale():
    scheduler = make_scheduler(make_view(total=10))
    enqueue_all(scheduler, [make_ask("q1"), make_ask("q2", tenant="other")])
    assert set(dispatched(scheduler.schedule(0.0))) == {"q1"}
    assert scheduler.schedule(5.0) == []  # exactly stale_state_s old: still live
    [decision] = scheduler.schedule(5.5)
    assert decision.request_id == "q2" and decision.reason is Reason.NO_REPLICA
    assert scheduler.schedule(6.0) == []


def test_a_duplicate_id_is_refused_whether_queued_or_dispatched():
    scheduler = make_scheduler()
    enqueue_all(scheduler, [make_ask("q1")])
    assert scheduler.enqueue(make_ask("q1"), 0.0).reason is Reason.DUPLICATE_REQUEST
    scheduler.schedule(0.0)
    assert scheduler.enqueue(make_ask("q1", tenant="other"), 0.0).reason is Reason.DUPLICATE_REQUEST
    assert len(scheduler.ledger) == 1


def test_queue_full_at_max_queue_length():
    scheduler = make_scheduler(interactive=replace(LOOSE, max_queue_length=2))
    enqueue_all(scheduler, [make_ask("q1"), make_ask("q2")])
    answer = scheduler.enqueue(make_ask("q3"), 0.0)
    assert isinstance(answer, Refused) and answer.reason is Reason.QUEUE_FULL
    assert answer.retry_after_s >= 0.0
    # the batch queue is separate
    assert isinstance(scheduler.enqueue(make_ask("b1", service_class=BATCH), 0.0), Queued)


def test_queue_full_is_not_told_to_retry_at_once():
    """The prediction is within the SLO, but a full queue is still full: the
    refusal waits at least this request's share of the pool draining."""
    scheduler = make_scheduler(interactive=replace(LOOSE, max_queue_length=2))
    enqueue_all(scheduler, [make_ask("q1"), make_ask("q2")])
    assert scheduler.enqueue(make_ask("q3"), 0.0).retry_after_s > 0


def test_a_timed_out_request_is_not_told_to_retry_at_once():
    """Running work past its expected finish still holds its blocks: it
    finishes no sooner than its next token, and the refusal is not "now"."""
    scheduler = make_scheduler(interactive=ClassPolicy(ttft_slo_s=2.0, max_queue_wait_s=5.0, max_queue_length=10))
    enqueue_all(scheduler, [make_ask("hog", tenant="hog", prompt=1000, max_tokens=30)])  # 65 blocks, ~1.7 s
    scheduler.schedule(0.0)
    scheduler.started("hog", 0.0)
    enqueue_all(scheduler, [make_ask("q1", prompt=400, max_tokens=240)], 0.5)  # 40 blocks: waits for hog
    scheduler.observe_replica(make_view(seen_at_s=5.5))
    [timeout] = scheduler.schedule(5.5)  # hog overran its estimate and still holds its blocks
    assert timeout.reason is Reason.QUEUE_TIMEOUT
    assert timeout.predicted_start_s > 0 and timeout.retry_after_s > 0


# -- prediction, over capacity, retry slots ------------------------------------

def full_replica_scheduler(**config):
    """One 100-block replica held by a started interactive request expected
    to run 600 tokens x 0.05 s (the prior) = 30 s."""
    scheduler = make_scheduler(**config)
    enqueue_all(scheduler, [make_ask("hog", tenant="hog", prompt=1000, max_tokens=600)])  # 100 blocks
    assert set(dispatched(scheduler.schedule(0.0))) == {"hog"}
    scheduler.started("hog", 0.0)
    return scheduler


def test_over_the_slo_is_refused_with_a_retry_after_and_the_prediction():
    scheduler = full_replica_scheduler(interactive=ClassPolicy(ttft_slo_s=2.0, max_queue_wait_s=10.0,
                                                               max_queue_length=100))
    assert scheduler.predict_start_delay_s("v1", INTERACTIVE, "acme", 10, 1.0) == pytest.approx(29.0)
    answer = scheduler.enqueue(make_ask("q1"), 1.0)
    assert isinstance(answer, Refused) and answer.reason is Reason.OVER_CAPACITY
    assert answer.predicted_start_s == pytest.approx(29.0)
    # Back when its predicted start, stretched by how late predictions run
    # (the prior: nothing has finished), is well inside the SLO.
    assert answer.retry_after_s == pytest.approx(29.0 * PRIOR_LATE_FACTOR - (1 - RETRY_SLO_MARGIN) * 2.0)
    assert "q1" not in scheduler.ledger and all(len(q) == 0 for q in scheduler.queues().values())


def test_a_burst_of_refusals_is_told_to_return_in_the_waves_the_pool_takes():
    """The hog's 100 blocks free at 30s and take ten of these 10-block
    requests; each wave then holds the pool for a mean service time (no
    request has finished: the 512-token default at the prior 0.05 s per
    token = 25.6 s, the hog having had its first token at once)."""
    scheduler = full_replica_scheduler(interactive=ClassPolicy(2.0, 10.0, 100))
    answers = [scheduler.enqueue(make_ask(f"q{i}"), 1.0) for i in range(25)]
    assert all(a.reason is Reason.OVER_CAPACITY for a in answers)
    back_at = [1.0 + a.retry_after_s for a in answers]
    waves = [1.0 + (30.0 - 1.0 + n * 25.6) * PRIOR_LATE_FACTOR - (1 - RETRY_SLO_MARGIN) * 2.0 for n in range(3)]
    assert back_at == pytest.approx([waves[0]] * 10 + [waves[1]] * 10 + [waves[2]] * 5)


def test_advice_is_stretched_by_how_late_the_pool_s_requests_ran():
    scheduler = make_scheduler(interactive=ClassPolicy(2.0, 10.0, 100))
    now_s = 0.0
    for i in range(10):  # each finishes 50% later than predicted at its dispatch
        scheduler.observe_replica(make_view(seen_at_s=now_s))
        enqueue_all(scheduler, [make_ask(f"late{i}", max_tokens=200)], now_s)
        (grant,) = dispatched(scheduler.schedule(now_s))
        held = scheduler.ledger.get(grant)
        predicted_s = held.predicted_first_token_s + 200 * held.predicted_per_token_s
        scheduler.started(grant, now_s + held.predicted_first_token_s)
        now_s += 1.5 * predicted_s
        scheduler.release(grant, 200, now_s)
    scheduler.observe_replica(make_view(seen_at_s=now_s))
    enqueue_all(scheduler, [make_ask("hog", tenant="hog", prompt=1000, max_tokens=600)], now_s)  # all 100 blocks
    assert set(dispatched(scheduler.schedule(now_s))) == {"hog"}
    delay_s = scheduler.predict_start_delay_s("v1", INTERACTIVE, "acme", 10, now_s)
    answer = scheduler.enqueue(make_ask("q"), now_s)
    assert answer.reason is Reason.OVER_CAPACITY
    assert answer.retry_after_s == pytest.approx(1.5 * delay_s - (1 - RETRY_SLO_MARGIN) * 2.0)


def test_the_stragglers_that_end_a_burst_barely_move_the_per_token_estimate():
    """A full wave runs at 0.1 s a token; the one request after it runs
    alone on the replica (a tenth of its KV) at 0.02 s. Its sample counts a
    tenth as much: the next full pool is predicted at about the full pool's
    pace, not one pulled towards a near-empty replica's."""
    scheduler = make_scheduler()
    scheduler.observe_replica(make_view(seen_at_s=0.0))
    enqueue_all(scheduler, [make_ask(f"w{i}", tenant=f"t{i}") for i in range(10)])  # 10 x 10 of 100 blocks
    wave = list(dispatched(scheduler.schedule(0.0)))
    assert len(wave) == 10
    for grant in wave:
        scheduler.started(grant, 0.0)
    for grant in wave:
        scheduler.release(grant, 200, 20.0)  # 0.1 s a token
    scheduler.observe_replica(make_view(seen_at_s=20.0))
    enqueue_all(scheduler, [make_ask("straggler")], 20.0)
    (grant,) = dispatched(scheduler.schedule(20.0))
    scheduler.started(grant, 20.0)
    scheduler.release(grant, 200, 24.0)  # 0.02 s a token, at a tenth of the replica
    scheduler.observe_replica(make_view(seen_at_s=24.0))
    enqueue_all(scheduler, [make_ask("next")], 24.0)
    (grant,) = dispatched(scheduler.schedule(24.0))
    assert scheduler.ledger.get(grant).predicted_per_token_s == pytest.approx(0.1 + 0.1 * 0.1 * (0.02 - 0.1))


def test_an_overloaded_pool_s_advice_aims_inside_the_tighter_bound_of_its_rejecting_stage():
    """A capacity refusal means overload; the rejecting stage will refuse a
    retry whose start is more than `reject_predicted_start_s` away."""
    levers = OverloadLevers(policy=OverloadPolicy(enabled=True), reject_predicted_start_s=0.25,
                            critical_kv_reserve_share=0.0, critical_queue_slots=0)
    scheduler = full_replica_scheduler(interactive=ClassPolicy(2.0, 10.0, 100), overload=levers)
    answer = scheduler.enqueue(make_ask("q"), 1.0)
    assert answer.retry_after_s == pytest.approx(29.0 * PRIOR_LATE_FACTOR - (1 - RETRY_SLO_MARGIN) * 0.25)


def test_queued_requests_report_a_growing_prediction():
    scheduler = full_replica_scheduler()
    asks = [make_ask(f"q{i}", tenant=f"t{i}", prompt=400, max_tokens=240) for i in range(4)]  # 40 blocks each
    answers = enqueue_all(scheduler, asks, 1.0)
    predictions = [a.predicted_start_s for a in answers]
    assert predictions[0] == pytest.approx(29.0)
    assert predictions == sorted(predictions) and predictions[-1] > predictions[0]


def test_short_work_ahead_never_lowers_the_prediction():
    """Regression: the pool's turnover time once came from the mean output of
    the queued entries, so a tiny request ahead lowered the prediction."""
    scheduler = make_scheduler()
    enqueue_all(scheduler, [make_ask("long", prompt=440, max_tokens=1000)])  # 90 blocks, queued
    before = scheduler.predict_start_delay_s("v1", INTERACTIVE, "acme", 20, 0.0)
    enqueue_all(scheduler, [make_ask("tiny", prompt=10, max_tokens=1)])  # 1 block more ahead
    after = scheduler.predict_start_delay_s("v1", INTERACTIVE, "acme", 20, 0.0)
    assert after >= before > 0


def test_interactive_displacing_batch_never_lowers_a_batch_prediction():
    """Regression: an overbooked replica's negative batch room was clamped to
    0, so interactive work taking KV batch holds looked like capacity batch
    would soon get back."""
    scheduler = make_scheduler(make_view(total=100))
    enqueue_all(scheduler, [make_ask("x", service_class=BATCH, tenant="bulk", prompt=200, max_tokens=600)])  # 50
    scheduler.schedule(0.0)
    scheduler.observe_replica(make_view(total=100, free=50, seen_at_s=1.0))
    before = scheduler.predict_start_delay_s("v1", BATCH, "other", 60, 1.0)
    enqueue_all(scheduler, [make_ask("y", tenant="chat", prompt=1200, max_tokens=80)], 1.0)  # 80 blocks, ~4 s
    assert set(dispatched(scheduler.schedule(1.0))) == {"y"}
    assert scheduler.predict_start_delay_s("v1", BATCH, "other", 60, 1.0) >= before > 0


# -- deadlines and cancels -------------------------------------------------------

def test_an_entry_past_its_class_wait_leaves_as_queue_timeout():
    scheduler = full_replica_scheduler(interactive=replace(LOOSE, max_queue_wait_s=5.0))
    enqueue_all(scheduler, [make_ask("q1")], 1.0)
    scheduler.observe_replica(make_view(seen_at_s=6.0))
    assert scheduler.schedule(5.99) == []
    [decision] = scheduler.schedule(6.0)
    assert decision.request_id == "q1" and decision.reason is Reason.QUEUE_TIMEOUT
    assert decision.retry_after_s >= 0 and decision.predicted_start_s == pytest.approx(30.0 - 6.0)
    assert all(len(q) == 0 for q in scheduler.queues().values())
    scheduler.release("hog", 600, 7.0)
    assert scheduler.schedule(7.0) == []


def test_a_client_deadline_earlier_than_the_class_wait_wins():
    scheduler = full_replica_scheduler(interactive=replace(LOOSE, max_queue_wait_s=5.0))
    enqueue_all(scheduler, [make_ask("early", deadline_s=2.0), make_ask("late", deadline_s=100.0)], 1.0)
    assert refused(scheduler.schedule(2.5)).keys() == {"early"}
    scheduler.observe_replica(make_view(seen_at_s=6.0))
    assert scheduler.schedule(5.99) == []
    assert refused(scheduler.schedule(6.0)).keys() == {"late"}  # the class wait caps a later deadline


def test_a_cancelled_queued_request_leaves_at_once_and_is_never_dispatched():
    scheduler = full_replica_scheduler()
    enqueue_all(scheduler, [make_ask("q1"), make_ask("q2", owner="router-1")], 1.0)
    assert scheduler.release("q1", 0, 1.5) is True
    assert scheduler.release("q1", 0, 1.5) is False
    assert scheduler.release("q2", 0, 1.5, owner="router-0") is False  # not its request
    assert scheduler.release("nobody", 0, 1.5) is False
    assert len(scheduler.queues()[("v1", INTERACTIVE)]) == 1
    scheduler.release("hog", 600, 2.0)
    assert set(dispatched(scheduler.schedule(2.0))) == {"q2"}


def test_drop_owner_removes_what_a_broken_stream_queued_or_held():
    scheduler = make_scheduler(make_view(total=20))
    enqueue_all(scheduler, [make_ask(f"a{i}", tenant=f"t{i}") for i in (1, 2, 3)]
                + [make_ask("b1", tenant="zz", owner="router-1")])
    assert set(dispatched(scheduler.schedule(0.0))) == {"a1", "a2"}
    assert scheduler.drop_owner("router-0") == 3
    assert scheduler.ledger.reservations() == [] and scheduler.ledger.reserved_kv_blocks() == {}
    assert set(dispatched(scheduler.schedule(0.1))) == {"b1"}


# -- tenant caps ---------------------------------------------------------------

def test_tenant_concurrency_counts_queued_and_dispatched():
    tenants = TenantLimitsTable(default=TenantLimits(max_active_seqs=2, max_kv_share=1.0),
                                overrides={"vip": TenantLimits(max_active_seqs=3, max_kv_share=1.0)})
    scheduler = make_scheduler(tenants=tenants)
    enqueue_all(scheduler, [make_ask("a1", tenant="new-key")])
    scheduler.schedule(0.0)
    enqueue_all(scheduler, [make_ask("a2", tenant="new-key")])
    answer = scheduler.enqueue(make_ask("a3", tenant="new-key"), 0.0)
    assert isinstance(answer, Refused) and answer.reason is Reason.TENANT_CONCURRENCY and answer.retry_after_s > 0
    enqueue_all(scheduler, [make_ask(f"v{i}", tenant="vip") for i in range(3)])
    assert scheduler.enqueue(make_ask("v3", tenant="vip"), 0.0).reason is Reason.TENANT_CONCURRENCY
    scheduler.release("a1", 60, 1.0)
    assert isinstance(scheduler.enqueue(make_ask("a3", tenant="new-key"), 1.0), Queued)


def test_tenant_kv_share_of_the_pool():
    tenants = TenantLimitsTable(default=TenantLimits(max_active_seqs=100, max_kv_share=0.25),
                                overrides={"vip": TenantLimits(max_active_seqs=100, max_kv_share=1.0)})
    scheduler = make_scheduler(make_view("r0"), make_view("r1"), tenants=tenants)  # 200 blocks: 50 each
    enqueue_all(scheduler, [make_ask(f"a{i}", tenant="new-key") for i in range(5)])  # 50 blocks
    answer = scheduler.enqueue(make_ask("a5", tenant="new-key"), 0.0)
    assert isinstance(answer, Refused) and answer.reason is Reason.TENANT_KV_SHARE
    assert scheduler.tenant_holdings("v1")["new-key"].kv_blocks == 50
    enqueue_all(scheduler, [make_ask(f"v{i}", tenant="vip") for i in range(10)])  # 100 blocks > 50
    scheduler.schedule(0.0)  # dispatched work still counts
    assert scheduler.enqueue(make_ask("a5", tenant="new-key"), 0.0).reason is Reason.TENANT_KV_SHARE


def test_refusals_at_a_tenant_cap_are_told_to_return_one_per_expected_finish():
    tenants = TenantLimitsTable(default=TenantLimits(max_active_seqs=4, max_kv_share=1.0))
    scheduler = make_scheduler(tenants=tenants)
    enqueue_all(scheduler, [make_ask(f"a{i}") for i in range(4)])
    scheduler.schedule(0.0)
    waits = [scheduler.enqueue(make_ask(f"x{i}"), 0.0).retry_after_s for i in range(4)]
    assert waits[0] > 0
    gaps = [later - earlier for earlier, later in zip(waits, waits[1:])]
    # Four running: the k-th caller is sent back about a quarter of a
    # service time after the one before it, not all at the first finish.
    assert all(gap > 0 for gap in gaps) and max(gaps) - min(gaps) < 1e-9
    # Another tenant's herd has slots of its own.
    other = scheduler.enqueue(make_ask("y0", tenant="other"), 0.0)
    assert isinstance(other, Queued)


def test_tenant_caps_count_each_class_apart():
    """A tenant's batch flood (preemptible) does not use up its interactive share."""
    tenants = TenantLimitsTable(default=TenantLimits(max_active_seqs=5, max_kv_share=0.25))
    scheduler = make_scheduler(make_view("r0"), make_view("r1"), tenants=tenants)  # 200 blocks: 50 a class
    enqueue_all(scheduler, [make_ask(f"b{i}", service_class=BATCH) for i in range(5)])  # 50 blocks, 5 seqs
    assert scheduler.enqueue(make_ask("b5", service_class=BATCH), 0.0).reason is Reason.TENANT_CONCURRENCY
    enqueue_all(scheduler, [make_ask(f"i{i}") for i in range(5)])
    assert scheduler.tenant_holdings("v1")["acme"] == TenantHolding(active_seqs=10, kv_blocks=100)
    assert scheduler.enqueue(make_ask("i5"), 0.0).reason is Reason.TENANT_CONCURRENCY


# -- classes: order, share cap, age gate, preemptible batch ----------------------

def test_interactive_is_dispatched_before_batch():
    scheduler = make_scheduler(make_view(total=10))
    enqueue_all(scheduler, [make_ask("b1", service_class=BATCH, tenant="bulk"), make_ask("i1")])
    [decision] = scheduler.schedule(0.0)
    assert decision.request_id == "i1"


def test_batch_share_cap_while_interactive_is_present():
    scheduler = make_scheduler(make_view(total=100, max_num_seqs=10), batch_max_share=0.5)
    enqueue_all(scheduler, [make_ask("i1", prompt=10, max_tokens=6)])  # 1 block, 1 seat
    enqueue_all(scheduler, [make_ask(f"b{i}", service_class=BATCH, tenant="bulk") for i in range(8)])
    decisions = scheduler.schedule(0.0)
    assert [d.request_id for d in decisions][0] == "i1"
    assert len(dispatched(decisions)) == 1 + 5  # 5 x 10 blocks = the batch half
    assert scheduler.ledger.holding("r0").kv_blocks[BATCH] == 50
    scheduler.release("i1", 6, 1.0)  # no interactive left: batch may soak the rest
    assert len(dispatched(scheduler.schedule(1.0))) == 3


def test_batch_share_cap_on_seats():
    scheduler = make_scheduler(make_view(total=1000, max_num_seqs=8), batch_max_share=0.5)
    enqueue_all(scheduler, [make_ask("i1")] + [make_ask(f"b{i}", service_class=BATCH) for i in range(8)])
    assert len(dispatched(scheduler.schedule(0.0))) == 1 + 4
    assert scheduler.ledger.holding("r0").seats == [1, 4]


def test_no_batch_while_the_oldest_interactive_has_waited_too_long():
    scheduler = make_scheduler(make_view(total=100), batch_pause_queue_age_s=0.5, batch_max_share=1.0)
    enqueue_all(scheduler, [make_ask("i-run", prompt=900, max_tokens=60)])  # 60 blocks
    scheduler.schedule(0.0)
    enqueue_all(scheduler, [make_ask("i-wait", tenant="other", prompt=750, max_tokens=50)])  # 50 blocks > the 40 left
    enqueue_all(scheduler, [make_ask("b1", service_class=BATCH, tenant="bulk")], 0.5)
    assert set(dispatched(scheduler.schedule(0.5))) == {"b1"}  # 0.5 s old: not past the gate
    enqueue_all(scheduler, [make_ask("b2", service_class=BATCH, tenant="bulk")], 0.6)
    assert scheduler.schedule(0.6) == []  # 0.6 s old: batch paused although it would fit
    assert scheduler.release("i-wait", 0, 0.7)
    assert set(dispatched(scheduler.schedule(0.7))) == {"b2"}


def test_interactive_may_take_kv_batch_holds_but_never_past_capacity_alone():
    scheduler = make_scheduler(make_view(total=100))
    enqueue_all(scheduler, [make_ask(f"b{i}", service_class=BATCH, tenant="bulk") for i in range(8)])
    assert len(dispatched(scheduler.schedule(0.0))) == 8  # 80 blocks, nothing interactive
    enqueue_all(scheduler, [make_ask("i1", prompt=750, max_tokens=50),
                            make_ask("i2", tenant="other", prompt=900, max_tokens=60)])
    assert set(dispatched(scheduler.schedule(0.1))) == {"i1"}  # preempts batch; 50 + 60 > 100
    holding = scheduler.ledger.holding("r0")
    assert holding.kv_blocks == [50, 80]
    enqueue_all(scheduler, [make_ask("b8", service_class=BATCH, tenant="bulk")])
    assert scheduler.schedule(0.2) == []  # no batch into an overbooked replica


def test_batch_counts_grants_a_replica_report_has_not_shown_yet():
    scheduler = make_scheduler(make_view(total=100))
    enqueue_all(scheduler, [make_ask("b1", service_class=BATCH, prompt=900, max_tokens=60)])  # 60 blocks
    scheduler.schedule(0.0)
    scheduler.release("b1", 60, 0.01)
    scheduler.observe_replica(make_view(total=100, seen_at_s=0.05))  # the report predates the grant's arrival
    enqueue_all(scheduler, [make_ask("b2", service_class=BATCH, prompt=750, max_tokens=50)], 0.05)  # 50 blocks
    assert scheduler.schedule(0.05) == []
    scheduler.observe_replica(make_view(total=100, seen_at_s=0.2))
    assert set(dispatched(scheduler.schedule(0.2))) == {"b2"}


# -- long-prefill lane ------------------------------------------------------------

def lane_scheduler():
    return make_scheduler(make_view("r0", total=1000), make_view("r1", total=1000),
                          long_prompt_tokens=1000, long_prefills_per_replica=1)


def test_the_long_prefill_lane_holds_one_per_replica_until_one_starts():
    scheduler = lane_scheduler()
    enqueue_all(scheduler, [make_ask(f"long{i}", tenant="bulk", prompt=1500) for i in range(4)])
    enqueue_all(scheduler, [make_ask(f"chat{i}", tenant="chat") for i in range(3)])
    first = dispatched(scheduler.schedule(0.0))
    assert sorted(first) == ["chat0", "chat1", "chat2", "long0", "long1"]
    enqueue_all(scheduler, [make_ask("chat3", tenant="chat")], 0.1)
    assert set(dispatched(scheduler.schedule(0.1))) == {"chat3"}
    scheduler.started("long0", 0.2)
    assert set(dispatched(scheduler.schedule(0.2))) == {"long2"}
    scheduler.release("long1", 0, 0.3)  # a cancelled long prefill frees its place too
    assert set(dispatched(scheduler.schedule(0.3))) == {"long3"}


def test_a_short_prompt_behind_a_long_one_of_the_same_tenant_still_dispatches():
    """Entries, not tenants, are skipped while the lane is full."""
    scheduler = lane_scheduler()
    enqueue_all(scheduler, [make_ask(f"long{i}", prompt=1500) for i in range(3)] + [make_ask("chat")])
    assert set(dispatched(scheduler.schedule(0.0))) == {"long0", "long1", "chat"}


def test_a_long_prompt_waits_for_the_lane_in_its_prediction_and_is_refused_early_past_the_slo():
    """The lane serialises long prompts: one joining behind them is predicted
    to start when the lane has drained them, at their measured lane time,
    and refused at once if that is past the SLO (not left to time out)."""
    scheduler = make_scheduler(make_view("r0", total=1000), long_prompt_tokens=1000, long_prefills_per_replica=1,
                               interactive=replace(LOOSE, ttft_slo_s=3.0))
    enqueue_all(scheduler, [make_ask("first", tenant="a", prompt=1000)])
    scheduler.schedule(0.0)
    scheduler.started("first", 2.0)  # 2 s in the lane for 1,000 tokens: 2 ms a token
    enqueue_all(scheduler, [make_ask("second", tenant="b", prompt=1000)], 2.0)
    scheduler.schedule(2.0)  # in the lane now, expected to leave it at 4.0
    third = scheduler.enqueue(make_ask("third", tenant="c", prompt=1000), 2.5)
    assert isinstance(third, Queued) and third.predicted_start_s == pytest.approx(1.5)
    fourth = scheduler.enqueue(make_ask("fourth", tenant="d", prompt=1500), 2.5)
    # Behind second's 1.5 s left and third's 2 s: 3.5 s, past the 3 s SLO.
    assert isinstance(fourth, Refused) and fourth.reason is Reason.OVER_CAPACITY
    assert fourth.predicted_start_s == pytest.approx(3.5)
    # A chat is not in the lane: it goes at once.
    assert scheduler.enqueue(make_ask("chat", tenant="e"), 2.5).predicted_start_s == 0.0
    # The pool is not overloaded: the overload signal's predicted start is
    # the wait for capacity, not the long prompts' wait for the lane.
    scheduler.schedule(2.5)
    assert scheduler.overload_signals("v1").predicted_start_s == 0.0


def test_a_long_prompt_waiting_for_a_full_lane_does_not_pause_batch_or_age_the_pool():
    """Waiting for the lane is not waiting for capacity: batch cannot give a
    long prompt the lane sooner, so batch keeps dispatching and the
    overload signal's queue age leaves it out. Once the lane has a free
    place, a long prompt still queued waits for KV, and then it counts."""
    scheduler = make_scheduler(make_view("r0", total=150), long_prompt_tokens=1000, long_prefills_per_replica=1,
                               batch_pause_queue_age_s=0.5, batch_max_share=1.0)
    # 98 blocks each: doc1 waits for the lane, and for KV behind doc0 too.
    enqueue_all(scheduler, [make_ask("doc0", tenant="a", prompt=1500), make_ask("doc1", tenant="b", prompt=1500)])
    assert set(dispatched(scheduler.schedule(0.0))) == {"doc0"}
    enqueue_all(scheduler, [make_ask("b1", service_class=BATCH, tenant="bulk")], 1.0)
    assert set(dispatched(scheduler.schedule(1.0))) == {"b1"}  # doc1 has queued 1 s: batch still goes
    assert scheduler.overload_signals("v1").interactive_queue_age_s == 0.0
    scheduler.started("doc0", 1.5)  # the lane is free; doc1 still does not fit
    enqueue_all(scheduler, [make_ask("b2", service_class=BATCH, tenant="bulk")], 1.6)
    assert scheduler.schedule(1.6) == []  # now doc1's 1.6 s is a wait for capacity: batch paused
    assert scheduler.overload_signals("v1").interactive_queue_age_s == pytest.approx(1.6)


# -- prefix-aware choice ------------------------------------------------------------

PROMPT = hashes("p0", "p1", "p2", "p3", "p4")


def prefix_scheduler(**config):
    scheduler = make_scheduler(make_view("r0"), make_view("r1"), **config)
    scheduler.observe_cache("r1", list(PROMPT[:3]), [], snapshot=False)
    return scheduler


def test_a_request_goes_where_its_prefix_is_cached():
    scheduler = prefix_scheduler()
    enqueue_all(scheduler, [make_ask("q1", hashes=PROMPT)])
    decision = dispatched(scheduler.schedule(0.0))["q1"]
    assert (decision.replica_id, decision.cached_prefix_blocks) == ("r1", 3)
    assert (scheduler.prefix_stats.hit_blocks, scheduler.prefix_stats.queried_blocks) == (3, 5)


def test_a_loaded_prefix_replica_loses_to_the_least_loaded():
    scheduler = prefix_scheduler(prefix_load_margin=0.25)
    enqueue_all(scheduler, [make_ask("fill", hashes=PROMPT, prompt=300, max_tokens=20)])  # 20 blocks on r1
    assert dispatched(scheduler.schedule(0.0))["fill"].replica_id == "r1"
    enqueue_all(scheduler, [make_ask("q1", hashes=PROMPT)])
    assert dispatched(scheduler.schedule(0.1))["q1"].replica_id == "r1"  # load 0.2 <= 0 + 0.25
    enqueue_all(scheduler, [make_ask("q2", hashes=PROMPT)])
    decision = dispatched(scheduler.schedule(0.2))["q2"]  # r1 at 0.3 > 0.25
    assert (decision.replica_id, decision.cached_prefix_blocks) == ("r0", 0)


def test_prefix_blind_placement_ignores_the_cache():
    scheduler = prefix_scheduler(prefix_aware=False)
    enqueue_all(scheduler, [make_ask("q1", hashes=PROMPT)])
    decision = dispatched(scheduler.schedule(0.0))["q1"]
    assert decision.cached_prefix_blocks == 0
    assert scheduler.prefix_stats.queried_blocks == 0


def test_hashes_at_another_block_size_are_ignored():
    scheduler = prefix_scheduler()
    enqueue_all(scheduler, [make_ask("q1", hashes=PROMPT, hash_block=32)])
    assert dispatched(scheduler.schedule(0.0))["q1"].cached_prefix_blocks == 0
    assert (scheduler.prefix_stats.hit_blocks, scheduler.prefix_stats.queried_blocks) == (0, 0)


def test_an_evicted_or_forgotten_prefix_no_longer_attracts():
    scheduler = prefix_scheduler()
    scheduler.observe_cache("r1", [], [PROMPT[0]], snapshot=False)
    enqueue_all(scheduler, [make_ask("q1", hashes=PROMPT)])
    assert dispatched(scheduler.schedule(0.0))["q1"].cached_prefix_blocks == 0
    scheduler.observe_cache("r0", list(PROMPT), [], snapshot=True)
    scheduler.forget_replica("r0")
    enqueue_all(scheduler, [make_ask("q2", hashes=PROMPT)])
    decision = dispatched(scheduler.schedule(0.1))["q2"]
    assert (decision.replica_id, decision.cached_prefix_blocks) == ("r1", 0)


# -- fairness by VTC -----------------------------------------------------------------

def run_two_backlogged_tenants(steps: int, output_of) -> list[tuple[float, float, float]]:
    """`small` sends 10-block requests, `large` 4x as large; both queues are
    topped up before every step, one dispatched request is released per step.
    Returns (counter gap, bound, -) per step and checks `served`."""
    scheduler = make_scheduler(make_view(total=1000, max_num_seqs=2))
    sizes = {"small": (100, 60), "large": (400, 240)}
    next_id = {"small": 0, "large": 0}
    running: list[tuple[str, str, int]] = []
    generated = {"small": 0.0, "large": 0.0}
    counters = None
    gaps = []
    for step in range(steps):
        now = float(step)
        scheduler.observe_replica(make_view(total=1000, max_num_seqs=2, seen_at_s=now))
        for tenant, (prompt, max_tokens) in sizes.items():
            queue = scheduler.queues().get(("v1", INTERACTIVE))
            while (queue.tenant_work().get(tenant, (0, 0))[0] if queue else 0) < 2:
                enqueue_all(scheduler, [make_ask(f"{tenant}{next_id[tenant]}", tenant=tenant, prompt=prompt,
                                                 max_tokens=max_tokens)], now)
                next_id[tenant] += 1
                queue = scheduler.queues()[("v1", INTERACTIVE)]
        counters = scheduler.queues()[("v1", INTERACTIVE)].counters
        for decision in scheduler.schedule(now):
            tenant = "small" if decision.request_id.startswith("small") else "large"
            running.append((decision.request_id, tenant, sizes[tenant][1]))
            generated[tenant] += sizes[tenant][0]
        gaps.append((abs(counters.counters["small"] - counters.counters["large"]), counters.fairness_bound))
        if running:
            request_id, tenant, charged = running.pop(0)
            out = output_of(step, charged)
            scheduler.release(request_id, out, now + 0.5)
            generated[tenant] += 2.0 * out
            gaps.append((abs(counters.counters["small"] - counters.counters["large"]), counters.fairness_bound))
    for request_id, tenant, charged in running:
        scheduler.release(request_id, charged, 1e6)
        generated[tenant] += 2.0 * charged
    assert counters.served == pytest.approx(generated)
    return gaps


def test_backlogged_tenants_stay_within_the_fairness_bound():
    gaps = run_two_backlogged_tenants(60, lambda step, charged: charged)
    assert gaps[-1][1] == 400 + 2 * 240
    assert all(gap <= bound for gap, bound in gaps), max(gaps)


def test_the_bound_holds_when_requests_stop_early():
    gaps = run_two_backlogged_tenants(60, lambda step, charged: charged * (step % 3) // 2)
    assert all(gap <= bound for gap, bound in gaps), max(gaps)


def test_a_returning_tenant_cannot_spend_banked_idle_time():
    scheduler = make_scheduler(make_view(total=1000, max_num_seqs=3))
    enqueue_all(scheduler, [make_ask(f"a{i}", tenant="a") for i in range(40)]
                + [make_ask(f"b{i}", tenant="b") for i in range(40)])
    for step in range(10):
        scheduler.observe_replica(make_view(total=1000, max_num_seqs=3, seen_at_s=float(step)))
        for decision in scheduler.schedule(float(step)):
            scheduler.release(decision.request_id, 60, float(step) + 0.5)
    counters = scheduler.queues()[("v1", INTERACTIVE)].counters
    floor = min(counters.counters["a"], counters.counters["b"])
    assert floor > 0
    enqueue_all(scheduler, [make_ask(f"c{i}", tenant="c") for i in range(20)], 10.0)
    assert counters.counters["c"] == floor
    order = []
    for step in range(10, 16):
        scheduler.observe_replica(make_view(total=1000, max_num_seqs=3, seen_at_s=float(step)))
        for decision in scheduler.schedule(float(step)):
            order.append(decision.request_id[0])
            scheduler.release(decision.request_id, 60, float(step) + 0.5)
    assert order.count("c") <= order.count("a") + 1 and order.count("c") <= order.count("b") + 1


def test_the_reservation_uses_the_class_default_and_the_buffer():
    scheduler = make_scheduler(make_view(total=1000), reservation=ReservationPolicy(
        default_output_tokens_interactive=100, default_output_tokens_batch=300, buffer_fraction=0.5))
    enqueue_all(scheduler, [make_ask("i", prompt=100, max_tokens=0), make_ask("b", prompt=100, max_tokens=0,
                                                                              service_class=BATCH, tenant="bulk"),
                            make_ask("capped", prompt=100, max_tokens=500, room=200, tenant="x")])
    blocks = {d.request_id: d.reserved_kv_blocks for d in dispatched(scheduler.schedule(0.0)).values()}
    assert blocks == {"i": -(-(100 + 150) // 16), "b": -(-(100 + 450) // 16), "capped": -(-(100 + 200) // 16)}


def test_ties_between_idle_replicas_alternate():
    scheduler = make_scheduler(make_view("r0"), make_view("r1"))
    placed = []
    for i in range(4):
        enqueue_all(scheduler, [make_ask(f"q{i}")], now_s=float(i))
        placed.append(dispatched(scheduler.schedule(float(i)))[f"q{i}"].replica_id)
        scheduler.release(f"q{i}", 60, float(i) + 0.5)  # idle again before the next one
    assert placed in (["r0", "r1", "r0", "r1"], ["r1", "r0", "r1", "r0"])
