import pytest

from sluice.admission.overload import (
    OverloadController,
    OverloadPolicy,
    OverloadStage,
    PoolSignals,
    StageThresholds,
    default_stage_thresholds,
)

IDLE = PoolSignals(0.0, 0.0, 0.1)


def make_controller(enter_hold_s: float = 0.25, exit_hold_s: float = 3.0, enabled: bool = True) -> OverloadController:
    return OverloadController(OverloadPolicy(default_stage_thresholds(2.0), enter_hold_s, exit_hold_s, enabled))


def hold(controller: OverloadController, signals: PoolSignals, start_s: float, for_s: float, tick_s: float = 0.05):
    """Feed the same signals every tick; returns the stages seen, in order, and the end time."""
    stages, now_s = [], start_s
    while now_s <= start_s + for_s + 1e-9:
        change = controller.observe(signals, now_s)
        if change is not None:
            stages.append(change.current)
        now_s += tick_s
    return stages, now_s


def test_a_pool_under_its_thresholds_stays_normal():
    controller = make_controller()
    stages, _ = hold(controller, PoolSignals(0.4, 0.4, 0.5), 0.0, 30.0)
    assert stages == [] and controller.stage is OverloadStage.NORMAL


def test_a_breach_shorter_than_the_entry_hold_changes_nothing():
    controller = make_controller(enter_hold_s=0.5)
    hold(controller, PoolSignals(0.0, 10.0, 0.0), 0.0, 0.3)
    hold(controller, IDLE, 0.35, 1.0)
    assert controller.stage is OverloadStage.NORMAL


def test_stages_are_entered_in_order_one_hold_apart():
    controller = make_controller(enter_hold_s=0.25)
    overload = PoolSignals(interactive_queue_age_s=5.0, predicted_start_s=5.0, kv_occupancy=1.0)
    stages, _ = hold(controller, overload, 0.0, 0.6)
    assert stages == [OverloadStage.BATCH_PAUSED, OverloadStage.OUTPUT_CAPPED]
    stages, _ = hold(controller, overload, 0.65, 10.0)
    assert stages == [OverloadStage.FALLBACK, OverloadStage.REJECTING]
    assert controller.stage is OverloadStage.REJECTING


@pytest.mark.parametrize("signals", [
    PoolSignals(interactive_queue_age_s=0.6, predicted_start_s=0.0, kv_occupancy=0.0),
    PoolSignals(interactive_queue_age_s=0.0, predicted_start_s=0.6, kv_occupancy=0.0),
    PoolSignals(interactive_queue_age_s=0.0, predicted_start_s=0.0, kv_occupancy=0.92),
])
def test_any_one_signal_past_its_entry_threshold_enters_stage_one(signals):
    controller = make_controller()
    hold(controller, signals, 0.0, 2.0)
    assert controller.stage is OverloadStage.BATCH_PAUSED  # and not further: stage 2's thresholds are higher


def test_a_load_between_exit_and_entry_keeps_the_stage_it_has():
    """Hysteresis: between stage 1's exit (0.1 s) and entry (0.5 s) levels
    the pool neither leaves stage 1 nor enters it from normal."""
    controller = make_controller()
    hold(controller, PoolSignals(0.0, 0.6, 0.0), 0.0, 1.0)
    assert controller.stage is OverloadStage.BATCH_PAUSED
    stages, _ = hold(controller, PoolSignals(0.0, 0.3, 0.0), 1.05, 60.0)
    assert stages == [] and controller.stage is OverloadStage.BATCH_PAUSED

    fresh = make_controller()
    hold(fresh, PoolSignals(0.0, 0.3, 0.0), 0.0, 60.0)
    assert fresh.stage is OverloadStage.NORMAL


def test_leaving_takes_the_exit_hold_per_stage_and_goes_down_in_order():
    controller = make_controller(enter_hold_s=0.25, exit_hold_s=3.0)
    _, now_s = hold(controller, PoolSignals(5.0, 5.0, 1.0), 0.0, 5.0)
    assert controller.stage is OverloadStage.REJECTING
    stages, _ = hold(controller, IDLE, now_s, 2.9)
    assert stages == []  # not yet: the exit hold is 3 s
    stages, end_s = hold(controller, IDLE, now_s + 2.95, 30.0)
    assert stages == [OverloadStage.FALLBACK, OverloadStage.OUTPUT_CAPPED, OverloadStage.BATCH_PAUSED,
                      OverloadStage.NORMAL]


def test_a_dip_below_the_exit_level_that_does_not_last_restarts_the_exit_hold():
    controller = make_controller(exit_hold_s=3.0)
    _, now_s = hold(controller, PoolSignals(0.0, 0.6, 0.0), 0.0, 1.0)
    _, now_s = hold(controller, IDLE, now_s, 2.0)
    _, now_s = hold(controller, PoolSignals(0.0, 0.3, 0.0), now_s, 0.2)  # back above exit, below entry
    _, now_s = hold(controller, IDLE, now_s, 2.5)
    assert controller.stage is OverloadStage.BATCH_PAUSED  # 2.5 s clear since the dip, not 4.5
    hold(controller, IDLE, now_s, 1.0)
    assert controller.stage is OverloadStage.NORMAL


def test_a_controller_turned_off_never_leaves_normal():
    controller = make_controller(enabled=False)
    stages, _ = hold(controller, PoolSignals(50.0, 50.0, 2.0), 0.0, 10.0)
    assert stages == [] and controller.stage is OverloadStage.NORMAL


def test_a_change_reports_the_signals_that_caused_it():
    controller = make_controller(enter_hold_s=0.0)
    signals = PoolSignals(0.0, 0.7, 0.2)
    change = controller.observe(signals, 1.0)
    assert change is not None
    assert (change.previous, change.current, change.at_s, change.signals) == (
        OverloadStage.NORMAL, OverloadStage.BATCH_PAUSED, 1.0, signals)


def test_resume_estimate_covers_the_backlog_and_each_stage_exit_hold():
    controller = make_controller(enter_hold_s=0.0, exit_hold_s=3.0)
    _, now_s = hold(controller, PoolSignals(5.0, 5.0, 1.0), 0.0, 1.0)
    assert controller.stage is OverloadStage.REJECTING
    # Batch resumes when the pool is below stage 1: backlog 5 s down to
    # stage 1's exit level (0.1 s), then four stages' exit holds.
    assert controller.resume_in_s(OverloadStage.BATCH_PAUSED, now_s) == pytest.approx(4.9 + 4 * 3.0)
    assert controller.resume_in_s(OverloadStage.REJECTING, now_s) == pytest.approx(5.0 - 0.7 + 3.0)
    # Clear for 2 s already: that part of the hold is spent.
    controller.observe(IDLE, now_s)
    controller.observe(IDLE, now_s + 2.0)
    assert controller.resume_in_s(OverloadStage.REJECTING, now_s + 2.0) == pytest.approx(1.0)
    assert make_controller().resume_in_s(OverloadStage.BATCH_PAUSED, 0.0) == 0.0


def test_thresholds_are_validated():
    with pytest.raises(ValueError, match="below its entry"):
        StageThresholds(1.0, 1.0, 1.0, 0.5, 0.9, 0.8)
    with pytest.raises(ValueError, match="stages 1..4"):
        OverloadPolicy(default_stage_thresholds(2.0)[:3])
    with pytest.raises(ValueError, match="hold"):
        OverloadPolicy(default_stage_thresholds(2.0), enter_hold_s=-1.0)
