from dataclasses import replace

import pytest

from sluice.rollout.machine import (
    Command, Finish, Operator, Phase, QualityResult, RollBack, RunQualityCheck, SetWeights, Tick, advance, begin,
)
from sluice.rollout.plan import RolloutPlan, SloThresholds
from sluice.rollout.slo import MetricSample, VersionSample

HEALTHY = VersionSample(requests=100, ttft_p99_s=0.2, itl_p99_s=0.03, error_rate=0.0)


def make_plan(**overrides) -> RolloutPlan:
    settings = dict(alias="tiny-llama", serving="v1", candidate="v2", steps_pct=(1, 5, 25, 50, 100), dwell_s=60.0,
                    min_requests=20, slo=SloThresholds(max_ttft_p99_s=1.0, max_error_rate=0.01,
                                                       max_itl_p99_ratio=1.5))
    settings.update(overrides)
    return RolloutPlan(**settings)


def sample(candidate: VersionSample = HEALTHY, serving: VersionSample = HEALTHY) -> MetricSample:
    return MetricSample(candidate=candidate, serving=serving)


def started(plan: RolloutPlan, now_s: float = 0.0):
    """Past a passing quality gate: at the first step."""
    first = begin(plan, now_s)
    return advance(plan, first.state, QualityResult(True, "agreement 1.00"), now_s)


def test_nothing_moves_before_the_quality_check_passes():
    plan = make_plan()
    first = begin(plan, 0.0)
    assert first.state.phase == Phase.PENDING_QUALITY
    assert first.actions == (RunQualityCheck(),)
    assert first.state.candidate_pct(plan) == 0
    # Metrics and ticks while the check runs change nothing.
    for event in (sample(), Tick(), Operator(Command.PAUSE), Operator(Command.RESUME)):
        after = advance(plan, first.state, event, 5.0)
        assert after.state == first.state and after.actions == ()


def test_success_walks_every_step_after_its_dwell_then_finishes():
    plan = make_plan()
    step = started(plan, now_s=0.0)
    assert step.actions == (SetWeights(1),)
    written = [1]
    now_s = 0.0
    state = step.state
    while not state.finished:
        # Inside the dwell a healthy sample holds the step.
        held = advance(plan, state, sample(), now_s + plan.dwell_s - 1)
        assert held.actions == () and held.state.step_index == state.step_index
        now_s += plan.dwell_s
        moved = advance(plan, held.state, sample(), now_s)
        state = moved.state
        written += [a.candidate_pct for a in moved.actions if isinstance(a, SetWeights)]
        if state.finished:
            assert moved.actions == (Finish(),)
    assert written == [1, 5, 25, 50, 100]
    assert state.phase == Phase.COMPLETED and state.candidate_pct(plan) == 100


def test_an_slo_breach_rolls_back_at_once_without_waiting_for_the_dwell():
    plan = make_plan()
    state = started(plan).state
    state = advance(plan, state, sample(), plan.dwell_s).state  # 1 % passed, now at 5 %
    slow = replace(HEALTHY, ttft_p99_s=2.5)
    after = advance(plan, state, sample(candidate=slow), plan.dwell_s + 1)
    assert after.state.phase == Phase.ROLLED_BACK
    assert after.state.candidate_pct(plan) == 0
    [action] = after.actions
    assert isinstance(action, RollBack) and "TTFT p99" in action.reason and "5%" in action.reason


def test_a_relative_breach_compares_with_the_serving_version_over_the_same_window():
    plan = make_plan()
    state = started(plan).state
    serving = replace(HEALTHY, itl_p99_s=0.04)
    fine = advance(plan, state, sample(candidate=replace(HEALTHY, itl_p99_s=0.09), serving=serving), 1.0)
    assert fine.state.phase == Phase.STEPPING  # 0.09 <= 0.04 * 1.5 + 0.05 slack
    worse = advance(plan, fine.state, sample(candidate=replace(HEALTHY, itl_p99_s=0.2), serving=serving), 2.0)
    assert worse.state.phase == Phase.ROLLED_BACK and "ITL p99" in worse.state.reason


def test_at_100_percent_the_relative_gates_use_the_last_serving_baseline():
    plan = make_plan(steps_pct=(50, 100))
    state = started(plan).state
    state = advance(plan, state, sample(serving=replace(HEALTHY, itl_p99_s=0.02)), plan.dwell_s).state
    assert state.candidate_pct(plan) == 100
    idle_serving = VersionSample(requests=0)
    after = advance(plan, state, sample(candidate=replace(HEALTHY, itl_p99_s=0.2), serving=idle_serving),
                    plan.dwell_s + 1)
    assert after.state.phase == Phase.ROLLED_BACK and "0.020s" in after.state.reason


def test_a_failed_quality_check_rolls_back_before_any_traffic_moves():
    plan = make_plan()
    first = begin(plan, 0.0)
    after = advance(plan, first.state, QualityResult(False, "greedy agreement 0.12 < 0.90"), 1.0)
    assert after.state.phase == Phase.ROLLED_BACK
    assert after.actions == (RollBack("quality check failed: greedy agreement 0.12 < 0.90"),)
    assert after.state.step_index == -1


def test_operator_abort_rolls_back_from_any_live_phase():
    plan = make_plan()
    pending = begin(plan, 0.0).state
    stepping = started(plan).state
    paused = advance(plan, stepping, Operator(Command.PAUSE), 1.0).state
    for state in (pending, stepping, paused):
        after = advance(plan, state, Operator(Command.ABORT), 2.0)
        assert after.state.phase == Phase.ROLLED_BACK
        assert after.actions == (RollBack("aborted by the operator"),)


def test_pause_holds_the_weights_and_stops_the_dwell_clock_until_resume():
    plan = make_plan()
    state = started(plan, now_s=0.0).state
    paused = advance(plan, state, Operator(Command.PAUSE), 40.0)
    assert paused.state.phase == Phase.PAUSED and paused.actions == ()
    # Long past the dwell, healthy traffic does not move a paused rollout.
    held = advance(plan, paused.state, sample(), 1000.0)
    assert held.state.phase == Phase.PAUSED and held.actions == ()
    assert held.state.step_elapsed_s(1000.0) == 40.0
    resumed = advance(plan, held.state, Operator(Command.RESUME), 1000.0)
    assert resumed.state.phase == Phase.STEPPING and resumed.actions == ()
    # 40 s were served before the pause: 20 more finish the 60 s dwell.
    assert advance(plan, resumed.state, sample(), 1019.0).actions == ()
    assert advance(plan, resumed.state, sample(), 1020.0).actions == (SetWeights(5),)


def test_a_breach_while_paused_still_rolls_back():
    plan = make_plan()
    paused = advance(plan, started(plan).state, Operator(Command.PAUSE), 1.0).state
    after = advance(plan, paused, sample(candidate=replace(HEALTHY, error_rate=0.2)), 2.0)
    assert after.state.phase == Phase.ROLLED_BACK and "error rate" in after.state.reason


def test_insufficient_traffic_holds_the_step_past_its_dwell():
    plan = make_plan()
    state = started(plan).state
    quiet = replace(HEALTHY, requests=5, ttft_p99_s=30.0)  # too few to judge, even a terrible p99
    after = advance(plan, state, sample(candidate=quiet), plan.dwell_s * 10)
    assert after.state.phase == Phase.STEPPING and after.actions == ()
    assert advance(plan, after.state, sample(), plan.dwell_s * 10).actions == (SetWeights(5),)


def test_a_step_starved_past_max_step_s_rolls_back():
    plan = make_plan(max_step_s=120.0)
    state = started(plan).state
    quiet = replace(HEALTHY, requests=3)
    assert advance(plan, state, sample(candidate=quiet), 119.0).state.phase == Phase.STEPPING
    after = advance(plan, state, sample(candidate=quiet), 120.0)
    assert after.state.phase == Phase.ROLLED_BACK and "insufficient traffic" in after.state.reason
    # No metrics at all (Prometheus away) starves the same way.
    assert advance(plan, state, Tick(), 121.0).state.phase == Phase.ROLLED_BACK


def test_a_finished_rollout_ignores_everything():
    plan = make_plan()
    done = advance(plan, begin(plan, 0.0).state, QualityResult(False, "bad"), 1.0).state
    for event in (Operator(Command.RESUME), sample(), QualityResult(True, "ok"), Tick()):
        after = advance(plan, done, event, 2.0)
        assert after.state == done and after.actions == ()


def test_without_a_quality_gate_the_first_step_starts_at_once():
    plan = make_plan(quality_gate=False)
    first = begin(plan, 0.0)
    assert first.state.phase == Phase.STEPPING and first.actions == (SetWeights(1),)


@pytest.mark.parametrize("overrides, message", [
    (dict(steps_pct=(5, 1, 100)), "increase"),
    (dict(steps_pct=(1, 50)), "last step must be 100"),
    (dict(steps_pct=(0, 100)), "1..100"),
    (dict(steps_pct=()), "at least one step"),
    (dict(candidate="v1"), "already the serving version"),
    (dict(min_requests=0), "min_requests"),
    (dict(dwell_s=-1.0), "dwell_s"),
    (dict(max_step_s=10.0), "max_step_s"),
])
def test_a_bad_plan_is_refused_with_the_reason(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_plan(**overrides)


@pytest.mark.parametrize("field, value", [("max_ttft_p99_s", 0.0), ("max_error_rate", 1.5),
                                          ("max_itl_p99_ratio", float("nan"))])
def test_bad_thresholds_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        SloThresholds(**{field: value})
