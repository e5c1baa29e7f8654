import heapq

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sluice.admission.prediction import (
    LATENESS_MIN_SAMPLES, LATENESS_WINDOW, PRIOR_LATE_FACTOR, PoolCapacity, PromisedReturns, RetrySlots, RunningWork,
    ServiceTimeEstimate, WorkAhead, predict_start_delay_s,
)

POOL = PoolCapacity(total_kv_blocks=100, total_seats=10, free_kv_blocks=20, free_seats=2)


def test_zero_when_it_fits_now():
    assert predict_start_delay_s(5.0, POOL, WorkAhead(20, 2), [RunningWork(9.0, 50)], 30.0) == 0.0


def test_waits_for_the_running_work_that_frees_enough_in_finish_order():
    running = [RunningWork(12.0, 30), RunningWork(8.0, 10), RunningWork(10.0, 10)]
    # needs 25 more blocks: 10 at 8s, 10 at 10s, 30 at 12s -> fits at 12s
    assert predict_start_delay_s(5.0, POOL, WorkAhead(45, 1), running, 30.0) == pytest.approx(7.0)
    # needs 5 more: the first to finish frees enough
    assert predict_start_delay_s(5.0, POOL, WorkAhead(25, 1), running, 30.0) == pytest.approx(3.0)


def test_seats_can_be_the_limit():
    running = [RunningWork(6.0, 1), RunningWork(7.0, 1)]
    assert predict_start_delay_s(5.0, POOL, WorkAhead(1, 4), running, 30.0) == pytest.approx(2.0)


def test_finished_already_counts_from_now():
    assert predict_start_delay_s(5.0, POOL, WorkAhead(30, 1), [RunningWork(1.0, 10)], 30.0) == 0.0


def test_past_the_running_work_the_queue_turns_the_pool_over_in_waves():
    # 20 free now and 30 freed at 10s go to the work ahead, which holds them
    # a service time (30s) and frees them again at 35s and 40s: the second
    # 50 blocks are covered at 40s. (The pool's other 50 are held by work
    # this class never gets room from.)
    running = [RunningWork(10.0, 30)]
    assert predict_start_delay_s(5.0, POOL, WorkAhead(100, 1), running, 30.0) == pytest.approx(35.0)


def test_a_pool_that_filled_at_once_drains_in_waves_not_a_trickle():
    """Ten requests of 10 blocks, all finishing at 10s; each wave of the
    queue ahead takes a service time of 30s."""
    pool = PoolCapacity(total_kv_blocks=100, total_seats=10, free_kv_blocks=0, free_seats=0)
    running = [RunningWork(10.0, 10) for _ in range(10)]
    starts = [predict_start_delay_s(5.0, pool, WorkAhead(10 * n, n), running, 30.0) for n in (1, 10, 11, 20, 21)]
    assert starts == pytest.approx([5.0, 5.0, 35.0, 35.0, 65.0])


def test_an_overbooked_pool_repays_its_debt_first():
    pool = PoolCapacity(total_kv_blocks=100, total_seats=10, free_kv_blocks=-20, free_seats=5)
    running = [RunningWork(10.0, 30), RunningWork(20.0, 30)]
    # The first 20 blocks freed (at 10s) repay the overbooking; 10 of them
    # and the 30 freed at 20s go round, again 30s later.
    assert predict_start_delay_s(5.0, pool, WorkAhead(30, 1), running, 30.0) == pytest.approx(15.0)
    assert predict_start_delay_s(5.0, pool, WorkAhead(50, 1), running, 30.0) == pytest.approx(35.0)


def test_room_free_now_cycles_while_long_running_work_holds_its_own():
    pool = PoolCapacity(total_kv_blocks=100, total_seats=10, free_kv_blocks=10, free_seats=10)
    # The 10 free blocks serve a 5s request at 5s, 10s and 15s before the
    # long request's 10 come back at 20s.
    assert predict_start_delay_s(5.0, pool, WorkAhead(30, 1), [RunningWork(20.0, 10)], 5.0) == pytest.approx(10.0)


def test_nothing_ever_released_falls_back_to_turning_the_whole_pool_over():
    pool = PoolCapacity(total_kv_blocks=100, total_seats=10, free_kv_blocks=-40, free_seats=5)
    # -40 + 30 < 0 per cycle: after the last release (10s) the 50 short of
    # the 100-block pool take half a service time.
    assert predict_start_delay_s(5.0, pool, WorkAhead(40, 1), [RunningWork(10.0, 30)], 30.0) == pytest.approx(20.0)


def list_schedule_start_s(now_s, free, releases, needed, cycle_s):
    """Block by block: each block the work ahead takes is held one cycle and
    taken again; an overbooked pool's first freed blocks are gone. The
    request starts when the `needed`-th block is taken."""
    free_at = [now_s] * max(free, 0) + sorted(at_s for at_s, size in releases for _ in range(size))
    free_at = sorted(free_at)
    if free < 0:
        repaid = sorted(at_s for at_s, size in releases for _ in range(size))[:-free]
        for at_s in repaid:
            free_at.remove(at_s)
    heapq.heapify(free_at)
    for _ in range(needed - 1):
        heapq.heappush(free_at, heapq.heappop(free_at) + cycle_s)
    return free_at[0]


@settings(max_examples=300, deadline=None)
@given(st.integers(-30, 60), st.lists(st.tuples(st.floats(0, 40), st.integers(0, 40)), max_size=6),
       st.integers(1, 400), st.floats(0.5, 20))
def test_the_waves_match_a_block_by_block_list_schedule(free, releases, needed, cycle_s):
    releases = [(10.0 + at_s, size) for at_s, size in releases]
    per_cycle = free + sum(size for _, size in releases)
    assume(per_cycle > 0)
    pool = PoolCapacity(total_kv_blocks=500, total_seats=64, free_kv_blocks=free, free_seats=64)
    running = [RunningWork(at_s, size) for at_s, size in releases]
    got_s = 10.0 + predict_start_delay_s(10.0, pool, WorkAhead(needed, 1), running, cycle_s)
    expected_s = 10.0 if needed <= free else list_schedule_start_s(10.0, free, releases, needed, cycle_s)
    assert got_s == pytest.approx(expected_s)


def test_service_time_estimate_priors_and_smoothing():
    estimate = ServiceTimeEstimate()
    assert estimate.time_to_first_token_s() == 0.2
    assert estimate.per_output_token_s() == 0.05
    assert estimate.per_output_token_s(reported_step_time_s=0.02) == 0.02
    assert estimate.expected_duration_s(100) == pytest.approx(0.2 + 5.0)
    estimate.observe_first_token(1.0)
    estimate.observe_decode(10.0, 100)
    estimate.observe_decode(5.0, 0)  # nothing generated: no sample
    assert (estimate.time_to_first_token_s(), estimate.per_output_token_s(0.02)) == (1.0, 0.1)
    estimate.observe_decode(20.0, 100)
    assert estimate.per_output_token_s() == pytest.approx(0.1 + 0.1 * (0.2 - 0.1))


def test_a_sample_from_a_part_full_replica_counts_in_proportion():
    estimate = ServiceTimeEstimate()
    estimate.observe_decode(10.0, 100, occupancy=0.5)  # the first sample is the estimate, whatever its weight
    estimate.observe_decode(2.0, 100, occupancy=0.25)
    assert estimate.per_output_token_s() == pytest.approx(0.1 + 0.1 * 0.25 * (0.02 - 0.1))
    estimate.observe_decode(2.0, 100, occupancy=0.0)  # an empty replica's pace says nothing of a full one's
    estimate.observe_decode(2.0, 100, occupancy=3.0)  # clamped to a full replica
    assert estimate.per_output_token_s() == pytest.approx(0.098 + 0.1 * (0.02 - 0.098))
    assert estimate.output_tokens == pytest.approx(100.0)  # lengths count whatever the occupancy


def test_mean_service_time_comes_from_measured_output_lengths():
    estimate = ServiceTimeEstimate()
    assert estimate.mean_service_s(512) == pytest.approx(0.2 + 512 * 0.05)  # nothing finished yet
    estimate.observe_decode(2.0, 100)
    assert estimate.mean_service_s(512) == pytest.approx(0.2 + 100 * 0.02)
    estimate.observe_decode(1.0, 0)  # a cancel before any output still counts as a length
    assert estimate.output_tokens == pytest.approx(90.0)
    assert estimate.per_output_token_s() == pytest.approx(0.02)


def test_a_request_s_own_output_bound_sets_the_turnover_when_it_is_the_longer():
    """A pool whose history is short requests turns over no faster than the
    request being predicted would run: a burst of long ones is not told the
    history's turnover."""
    estimate = ServiceTimeEstimate()
    estimate.observe_decode(0.8, 16, output_bound_tokens=16)  # 0.05 s per token, all of its bound
    assert estimate.mean_service_s(512) == pytest.approx(0.2 + 16 * 0.05)
    assert estimate.mean_service_s(512, output_bound_tokens=128) == pytest.approx(0.2 + 128 * 0.05)
    assert estimate.mean_service_s(512, output_bound_tokens=8) == pytest.approx(0.2 + 16 * 0.05)


def test_the_expected_output_is_the_bound_times_the_share_generated():
    estimate = ServiceTimeEstimate()
    assert estimate.expected_output_tokens(200) == 200  # nothing finished: the bound
    estimate.observe_decode(1.0, 50, output_bound_tokens=200)
    assert estimate.expected_output_tokens(200) == pytest.approx(50)
    estimate.observe_decode(1.0, 900, output_bound_tokens=300)  # past its bound (a buffer): at most all
    assert estimate.output_fraction == pytest.approx(0.25 + 0.1 * (1.0 - 0.25))


def test_the_late_factor_is_the_prior_until_enough_long_requests_finished():
    estimate = ServiceTimeEstimate()
    assert estimate.late_factor() == PRIOR_LATE_FACTOR
    for _ in range(20):
        estimate.observe_lateness(3.0, 1.0, output_tokens=8)  # few tokens: noise, not counted
    assert estimate.late_factor() == PRIOR_LATE_FACTOR
    for _ in range(LATENESS_MIN_SAMPLES):
        estimate.observe_lateness(1.0, 1.0, output_tokens=128)
    assert estimate.late_factor() == pytest.approx(1.0)


def test_the_late_factor_is_the_spread_of_recent_lateness_plus_a_late_median():
    estimate = ServiceTimeEstimate()
    # Waves running 20% early and on time: the median is early (not
    # subtracted), the spread above it (0.2) is added.
    for ratio in [0.8] * 40 + [1.0] * 24:
        estimate.observe_lateness(ratio, 1.0, output_tokens=128)
    assert estimate.late_factor() == pytest.approx(1.2)
    # Persistently 10% late with the same spread: both count.
    for ratio in [1.1] * 40 + [1.3] * 24:
        estimate.observe_lateness(ratio, 1.0, output_tokens=128)
    assert estimate.late_factor() == pytest.approx(1.0 + 0.1 + 0.2)
    for _ in range(LATENESS_WINDOW):
        estimate.observe_lateness(5.0, 1.0, output_tokens=128)
    assert estimate.late_factor() == 2.0  # never more than doubled


def test_a_burst_of_refusals_gets_spread_retry_times():
    slots = RetrySlots()
    at = [10.0 + slots.retry_after_s(10.0, fits_at_s=13.0, drain_s=0.5) for _ in range(5)]
    assert at == pytest.approx([13.0, 13.5, 14.0, 14.5, 15.0])
    # a later refusal never gets an earlier slot, and never a time in the past
    assert slots.retry_after_s(11.0, fits_at_s=11.0, drain_s=0.5) == pytest.approx(15.5 - 11.0)
    assert RetrySlots().retry_after_s(20.0, fits_at_s=19.0, drain_s=1.0) == 0.0


def test_promised_returns_count_until_they_are_due_back():
    promised = PromisedReturns(grace_s=0.25)
    promised.promise(back_at_s=3.0, kv_blocks=10)
    promised.promise(back_at_s=5.0, kv_blocks=20)
    assert promised.outstanding(3.0) == WorkAhead(30, 2)
    assert promised.outstanding(3.25) == WorkAhead(20, 1)  # due, and the trip's grace is over
    assert promised.outstanding(9.0) == WorkAhead(0, 0)


capacity = st.builds(
    PoolCapacity, total_kv_blocks=st.integers(1, 500), total_seats=st.integers(1, 64),
    free_kv_blocks=st.integers(-50, 500), free_seats=st.integers(-5, 64),
)
running_work = st.lists(st.builds(RunningWork, st.floats(0, 100), st.integers(0, 100)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(capacity, st.integers(0, 1000), st.integers(0, 64), running_work, st.integers(1, 200), st.integers(0, 10),
       st.floats(0.01, 100))
def test_more_work_ahead_never_starts_sooner(pool, blocks, seqs, running, more_blocks, more_seqs, service_s):
    before = predict_start_delay_s(10.0, pool, WorkAhead(blocks, seqs), running, service_s)
    after = predict_start_delay_s(10.0, pool, WorkAhead(blocks + more_blocks, seqs + more_seqs), running, service_s)
    assert 0.0 <= before <= after


@settings(max_examples=300, deadline=None)
@given(capacity, st.integers(0, 1000), st.integers(1, 64), running_work, st.floats(0, 100), st.integers(0, 100),
       st.floats(0.01, 100))
def test_more_running_work_never_starts_sooner(pool, blocks, seqs, running, finish_s, work_blocks, service_s):
    """Another running request holds its blocks and a seat until it finishes."""
    busier = PoolCapacity(pool.total_kv_blocks, pool.total_seats, pool.free_kv_blocks - work_blocks,
                          pool.free_seats - 1)
    needed = WorkAhead(blocks, seqs)
    before = predict_start_delay_s(10.0, pool, needed, running, service_s)
    after = predict_start_delay_s(10.0, busier, needed, [*running, RunningWork(finish_s, work_blocks)], service_s)
    assert before <= after + 1e-9


def test_the_per_token_estimate_is_never_below_the_replicas_step_time():
    """Tokens relayed in a burst make Release follow Started at once: the
    measured per-token time can be ~0, but a sequence gets one token per step."""
    from sluice.admission.prediction import ServiceTimeEstimate

    estimate = ServiceTimeEstimate()
    estimate.observe_decode(0.0001, 8)
    assert estimate.per_output_token_s(0.005) == 0.005
    assert estimate.per_output_token_s() == 0.0001 / 8
    estimate.observe_decode(0.8, 8)  # slower than the step time: the measurement stands
    assert estimate.per_output_token_s(0.005) > 0.005
