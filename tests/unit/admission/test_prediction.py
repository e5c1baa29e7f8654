import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.admission.prediction import (
    PoolCapacity, RetrySlots, RunningWork, ServiceTimeEstimate, WorkAhead, predict_start_delay_s,
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


def test_past_the_running_work_the_queue_turns_the_pool_over():
    running = [RunningWork(10.0, 30)]
    # 20 free + 30 freed at 10s; 50 more blocks = half the pool's 100 -> half a service time
    assert predict_start_delay_s(5.0, POOL, WorkAhead(100, 1), running, 30.0) == pytest.approx(5.0 + 15.0)


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


def test_mean_service_time_comes_from_measured_output_lengths():
    estimate = ServiceTimeEstimate()
    assert estimate.mean_service_s(512) == pytest.approx(0.2 + 512 * 0.05)  # nothing finished yet
    estimate.observe_decode(2.0, 100)
    assert estimate.mean_service_s(512) == pytest.approx(0.2 + 100 * 0.02)
    estimate.observe_decode(1.0, 0)  # a cancel before any output still counts as a length
    assert estimate.output_tokens == pytest.approx(90.0)
    assert estimate.per_output_token_s() == pytest.approx(0.02)


def test_a_burst_of_refusals_gets_spread_retry_times():
    slots = RetrySlots()
    at = [10.0 + slots.retry_after_s(10.0, fits_at_s=13.0, drain_s=0.5) for _ in range(5)]
    assert at == pytest.approx([13.0, 13.5, 14.0, 14.5, 15.0])
    # a later refusal never gets an earlier slot, and never a time in the past
    assert slots.retry_after_s(11.0, fits_at_s=11.0, drain_s=0.5) == pytest.approx(15.5 - 11.0)
    assert RetrySlots().retry_after_s(20.0, fits_at_s=19.0, drain_s=1.0) == 0.0


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
