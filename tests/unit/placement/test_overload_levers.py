"""ClusterScheduler under overload: the stage its controller reaches from
the pool's real signals, and what each stage does to enqueue (batch
paused, output capped, routed to the fallback, refused early), with
critical tenants exempt and their reserve of KV, seats and queue places
kept through every stage."""

from dataclasses import replace

import pytest

from sluice.admission.overload import OverloadPolicy, OverloadStage, StageThresholds
from sluice.outcomes import Reason
from sluice.placement.asks import Dispatched, Queued, Refused
from sluice.placement.config import OverloadLevers

from placement_factories import BATCH, make_ask, make_scheduler, make_view

NEVER = 1e9


def age_stages(exit_hold_s: float = 3.0) -> OverloadPolicy:
    """Stage n entered when the oldest interactive has queued n seconds,
    left below n - 0.5; the other signals never trip."""
    return OverloadPolicy(
        stages=tuple(StageThresholds(n, n - 0.5, NEVER, NEVER - 1, NEVER, NEVER - 1) for n in (1, 2, 3, 4)),
        enter_hold_s=0.0, exit_hold_s=exit_hold_s,
    )


def levers(**overrides) -> OverloadLevers:
    base = OverloadLevers(policy=age_stages(), critical_kv_reserve_share=0.0, critical_queue_slots=0,
                          degraded_output_tokens=32, degraded_prompt_tokens=1000)
    return replace(base, **overrides)


def overloaded(stage: OverloadStage, *views, **lever_overrides):
    """A scheduler whose pool v1 (100 blocks) is full of running work with
    one interactive request stuck queued, held until `stage` is reached."""
    views = views or (make_view("r0", total=100, step_time_s=0.05),)
    scheduler = make_scheduler(*views, overload=levers(**lever_overrides))
    for i in range(10):
        # 10 blocks each, with a long output left to run
        running = make_ask(f"run{i}", tenant=f"t{i}", prompt=16, max_tokens=144)
        assert isinstance(scheduler.enqueue(running, 0.0), Queued)
    scheduler.schedule(0.0)
    assert isinstance(scheduler.enqueue(make_ask("stuck", tenant="stuck"), 0.0), Queued)
    now_s = advance(scheduler, 0.0, until=lambda: scheduler.overload_stage("v1") >= stage)
    assert scheduler.overload_stage("v1") is stage
    return scheduler, now_s


def advance(scheduler, now_s, until, limit_s=60.0, tick_s=0.1):
    """Tick the scheduler (replicas reporting as they go) until `until()`."""
    while not until():
        now_s = round(now_s + tick_s, 6)
        assert now_s < limit_s, "condition never reached"
        for view in scheduler.replicas():
            scheduler.observe_replica(replace(view, seen_at_s=now_s))
        scheduler.schedule(now_s)
    return now_s


def test_stages_rise_in_order_with_the_queue_age_and_are_logged_as_changes():
    scheduler, now_s = overloaded(OverloadStage.REJECTING)
    assert [(v, c.current) for v, c in scheduler.stage_changes] == [
        ("v1", OverloadStage.BATCH_PAUSED), ("v1", OverloadStage.OUTPUT_CAPPED),
        ("v1", OverloadStage.FALLBACK), ("v1", OverloadStage.REJECTING)]
    assert 4.0 <= now_s < 4.5
    assert scheduler.overload_signals("v1").interactive_queue_age_s == pytest.approx(now_s)


def test_the_stages_step_down_once_the_load_drains():
    scheduler, now_s = overloaded(OverloadStage.FALLBACK)
    scheduler.stage_changes.clear()
    for i in range(10):
        scheduler.release(f"run{i}", 60, now_s)
    now_s = advance(scheduler, now_s, until=lambda: scheduler.overload_stage("v1") is OverloadStage.NORMAL)
    assert [c.current for _, c in scheduler.stage_changes] == [
        OverloadStage.OUTPUT_CAPPED, OverloadStage.BATCH_PAUSED, OverloadStage.NORMAL]


def test_stage_one_refuses_new_batch_with_the_expected_resume_as_retry_after():
    scheduler, now_s = overloaded(OverloadStage.BATCH_PAUSED)
    answer = scheduler.enqueue(make_ask("b1", service_class=BATCH), now_s)
    assert isinstance(answer, Refused) and answer.reason is Reason.BATCH_PAUSED
    # The stage exits after its 3 s hold at the earliest.
    assert answer.retry_after_s >= 3.0
    assert "resume" in answer.message
    # Interactive is still queued.
    assert isinstance(scheduler.enqueue(make_ask("i1"), now_s), Queued)
    # Batch callers refused together are told the resume too: the batch
    # queue (its SLO here is loose) takes them all when they are back.
    retries = [scheduler.enqueue(make_ask(f"b{n}", service_class=BATCH), now_s).retry_after_s for n in range(2, 6)]
    assert retries == pytest.approx([answer.retry_after_s] * 4)


def test_stage_two_caps_the_output_of_degradable_requests_only():
    scheduler, now_s = overloaded(OverloadStage.OUTPUT_CAPPED)
    assert isinstance(scheduler.enqueue(make_ask("keep", max_tokens=500), now_s), Queued)
    assert isinstance(scheduler.enqueue(make_ask("cap", max_tokens=500, degradable=True), now_s), Queued)
    assert isinstance(scheduler.enqueue(make_ask("small", max_tokens=20, degradable=True), now_s), Queued)
    assert isinstance(scheduler.enqueue(make_ask("open", max_tokens=0, room=4000, degradable=True), now_s), Queued)
    for i in range(10):
        scheduler.release(f"run{i}", 60, now_s)
    scheduler.release("stuck", 0, now_s)
    grants = {d.request_id: d for d in scheduler.schedule(now_s) if isinstance(d, Dispatched)}
    assert set(grants) == {"keep", "cap", "small", "open"}
    assert grants["keep"].output_cap_tokens == 0 and grants["keep"].reserved_kv_blocks == 38  # 600 tokens
    assert grants["cap"].output_cap_tokens == 32 and grants["cap"].reserved_kv_blocks == 9   # 132 tokens
    assert grants["small"].output_cap_tokens == 0  # already under the cap
    assert grants["open"].output_cap_tokens == 32


def test_stage_two_applies_to_a_degradable_class_and_refuses_long_degradable_prompts():
    scheduler, now_s = overloaded(OverloadStage.OUTPUT_CAPPED, degradable_classes=frozenset({0}))
    long = scheduler.enqueue(make_ask("long", prompt=1000, max_tokens=10), now_s)
    assert isinstance(long, Refused) and long.reason is Reason.OVER_CAPACITY and long.retry_after_s >= 3.0
    assert "1000 tokens or more" in long.message
    assert isinstance(scheduler.enqueue(make_ask("short", prompt=999, max_tokens=10), now_s), Queued)


def test_stage_three_routes_to_the_fallback_version_when_the_tenant_allows_it():
    scheduler, now_s = overloaded(
        OverloadStage.FALLBACK, make_view("r0", total=100, step_time_s=0.05),
        make_view("small0", total=100, version="v1-small"))
    routed = scheduler.enqueue(make_ask("fb", fallback="v1-small"), now_s)
    assert routed == Queued("fb", 0.0, "v1-small")
    plain = scheduler.enqueue(make_ask("plain"), now_s)
    assert isinstance(plain, Queued) and plain.model_version == "v1"
    grants = {d.request_id: d for d in scheduler.schedule(now_s) if isinstance(d, Dispatched)}
    assert grants["fb"].replica_id == "small0" and grants["fb"].model_version == "v1-small"
    assert "plain" not in grants
    assert scheduler.ledger.get("fb").model_version == "v1-small"


def test_below_stage_three_the_fallback_is_not_used():
    scheduler, now_s = overloaded(
        OverloadStage.OUTPUT_CAPPED, make_view("r0", total=100), make_view("small0", total=100, version="v1-small"))
    answer = scheduler.enqueue(make_ask("fb", fallback="v1-small"), now_s)
    assert isinstance(answer, Queued) and answer.model_version == "v1"


def test_stage_four_refuses_requests_that_cannot_start_soon_but_not_critical_ones():
    scheduler, now_s = overloaded(OverloadStage.REJECTING, reject_predicted_start_s=0.5)
    early = scheduler.enqueue(make_ask("late"), now_s)
    assert isinstance(early, Refused) and early.reason is Reason.OVER_CAPACITY
    assert early.predicted_start_s > 0.5 and early.retry_after_s > 0
    assert "overloaded" in early.message
    assert isinstance(scheduler.enqueue(make_ask("vip", critical=True), now_s), Queued)
    assert isinstance(scheduler.enqueue(make_ask("vip-batch", critical=True, service_class=BATCH), now_s), Queued)


def test_a_critical_request_passes_every_lever():
    scheduler, now_s = overloaded(OverloadStage.REJECTING, degradable_classes=frozenset({0}))
    answer = scheduler.enqueue(make_ask("vip", critical=True, degradable=True, max_tokens=300, prompt=1200,
                                        fallback="v1-small"), now_s)
    assert answer == Queued("vip", answer.predicted_start_s, "v1")


def test_the_critical_kv_reserve_is_kept_from_everyone_else():
    scheduler = make_scheduler(make_view("r0", total=100), overload=levers(critical_kv_reserve_share=0.2))
    for i in range(8):  # 8 x 10 blocks: all the replica has outside the 20-block reserve
        scheduler.enqueue(make_ask(f"n{i}", tenant="t"), 0.0)
    scheduler.enqueue(make_ask("over", tenant="t"), 0.0)
    grants = {d.request_id for d in scheduler.schedule(0.0) if isinstance(d, Dispatched)}
    assert grants == {f"n{i}" for i in range(8)}
    # A critical request gets in past the waiting head, into the reserve.
    scheduler.enqueue(make_ask("vip", tenant="vip", critical=True), 0.0)
    assert {d.request_id for d in scheduler.schedule(0.0) if isinstance(d, Dispatched)} == {"vip"}
    # What critical tenants hold counts toward the reserve: 10 of 20 used,
    # still nothing for anyone else.
    assert scheduler.schedule(0.0) == []
    scheduler.release("n0", 60, 0.0)
    assert {d.request_id for d in scheduler.schedule(0.0) if isinstance(d, Dispatched)} == {"over"}


def test_the_critical_seat_reserve_is_kept_from_everyone_else():
    scheduler = make_scheduler(make_view("r0", total=1000, max_num_seqs=10),
                               overload=levers(critical_kv_reserve_share=0.2))
    for i in range(9):
        scheduler.enqueue(make_ask(f"n{i}", tenant=f"t{i}"), 0.0)
    assert len([d for d in scheduler.schedule(0.0) if isinstance(d, Dispatched)]) == 8
    scheduler.enqueue(make_ask("vip", tenant="vip", critical=True), 0.0)
    assert [d.request_id for d in scheduler.schedule(0.0) if isinstance(d, Dispatched)] == ["vip"]


def test_the_last_queue_places_are_kept_for_critical_tenants():
    from placement_factories import LOOSE

    scheduler = make_scheduler(make_view("r0", total=100), overload=levers(critical_queue_slots=2),
                               interactive=replace(LOOSE, max_queue_length=4))
    answers = [scheduler.enqueue(make_ask(f"q{i}", tenant=f"t{i}"), 0.0) for i in range(3)]
    assert [type(a) for a in answers] == [Queued, Queued, Refused]
    assert answers[2].reason is Reason.QUEUE_FULL
    assert isinstance(scheduler.enqueue(make_ask("vip1", critical=True), 0.0), Queued)
    assert isinstance(scheduler.enqueue(make_ask("vip2", critical=True), 0.0), Queued)
    assert scheduler.enqueue(make_ask("vip3", critical=True), 0.0).reason is Reason.QUEUE_FULL


def test_a_pool_that_is_merely_busy_stays_normal():
    """Batch filling every block while interactive flows freely is the
    design working: no stage."""
    scheduler = make_scheduler(make_view("r0", total=100), overload=levers())
    for i in range(10):
        scheduler.enqueue(make_ask(f"b{i}", tenant=f"t{i}", service_class=BATCH), 0.0)
    now_s = 0.0
    for _ in range(50):
        now_s = round(now_s + 0.1, 6)
        scheduler.observe_replica(make_view("r0", total=100, seen_at_s=now_s))
        scheduler.schedule(now_s)
    assert len(scheduler.ledger) == 10
    assert scheduler.overload_stage("v1") is OverloadStage.NORMAL
    assert scheduler.overload_signals("v1").kv_occupancy == 0.0


def test_a_pool_full_of_running_chats_with_nobody_waiting_stays_normal_and_queues_batch():
    scheduler = make_scheduler(make_view("r0", total=100, step_time_s=0.05), overload=levers())
    for i in range(10):
        scheduler.enqueue(make_ask(f"run{i}", tenant=f"t{i}", prompt=16, max_tokens=144), 0.0)
    scheduler.schedule(0.0)
    now_s = 0.0
    for _ in range(50):
        now_s = round(now_s + 0.1, 6)
        scheduler.observe_replica(make_view("r0", total=100, step_time_s=0.05, seen_at_s=now_s))
        scheduler.schedule(now_s)
    assert scheduler.overload_stage("v1") is OverloadStage.NORMAL
    assert scheduler.overload_signals("v1").predicted_start_s == 0.0
    assert isinstance(scheduler.enqueue(make_ask("b", service_class=BATCH), now_s), Queued)


def test_arrivals_refused_at_the_slo_are_overload_even_with_no_queue():
    """Every arrival refused at once leaves no queue to age: the arrivals'
    own predicted starts drive the stages, and stop when arrivals stop."""
    from placement_factories import LOOSE

    by_prediction = OverloadPolicy(
        stages=tuple(StageThresholds(NEVER, NEVER - 1, n, n - 0.5, NEVER, NEVER - 1) for n in (1, 2, 3, 4)),
        enter_hold_s=0.0, exit_hold_s=1.0,
    )
    scheduler = make_scheduler(make_view("r0", total=100, step_time_s=0.05), overload=levers(policy=by_prediction),
                               interactive=replace(LOOSE, ttft_slo_s=1.0))
    for i in range(10):
        scheduler.enqueue(make_ask(f"run{i}", tenant=f"t{i}", prompt=16, max_tokens=144), 0.0)
    scheduler.schedule(0.0)
    now_s, answers = 0.0, []
    for n in range(20):
        now_s = round(now_s + 0.1, 6)
        scheduler.observe_replica(make_view("r0", total=100, step_time_s=0.05, seen_at_s=now_s))
        answers.append(scheduler.enqueue(make_ask(f"a{n}"), now_s))
        scheduler.schedule(now_s)
    assert all(isinstance(a, Refused) for a in answers)
    assert sum(len(q) for q in scheduler.queues().values()) == 0
    assert scheduler.overload_stage("v1") is OverloadStage.REJECTING
    now_s = advance(scheduler, now_s, until=lambda: scheduler.overload_stage("v1") is OverloadStage.NORMAL)
    # Arrivals stopped: the 1 s window empties, then four 1 s exit holds (and ticks).
    assert 2.0 + 1.0 + 4 * 1.0 <= now_s < 2.0 + 1.0 + 4 * 1.0 + 1.0
