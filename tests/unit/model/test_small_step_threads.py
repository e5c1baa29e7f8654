"""The runner's choice of threads for small steps, from the steps' own times."""

import pytest

from sluice.model.small_step_threads import SmallStepThreads


def run(choice: SmallStepThreads, seconds_per_token: dict[int, float], steps: int, tokens: int = 64) -> list[int]:
    """Run `steps` steps of `tokens`, each taking what its arm costs; the threads each ran on."""
    ran = []
    for _ in range(steps):
        threads = choice.threads_for(tokens)
        choice.observe(threads, tokens, seconds_per_token[threads] * tokens)
        ran.append(threads)
    return ran


@pytest.mark.parametrize("faster", [1, 2])
def test_small_steps_settle_on_the_arm_measured_faster(faster):
    choice = SmallStepThreads(max_step_tokens=256, all_threads=2)
    slower = 3 - faster
    ran = run(choice, {faster: 0.5e-3, slower: 0.8e-3}, steps=400)
    assert choice.preferred_threads(64) == faster
    # Past the first steps, the other arm only in short spells of exploration.
    assert ran[100:].count(slower) <= len(ran[100:]) * (choice.explore_steps / choice.explore_every) + 4
    assert ran[:40].count(slower) >= choice.min_samples  # both arms were measured early


def test_a_change_in_the_machine_is_noticed():
    choice = SmallStepThreads(max_step_tokens=256, all_threads=2)
    run(choice, {1: 0.5e-3, 2: 0.8e-3}, steps=300)
    assert choice.preferred_threads(64) == 1
    # The other cores free up: all threads get faster than one.
    run(choice, {1: 0.5e-3, 2: 0.3e-3}, steps=300)
    assert choice.preferred_threads(64) == 2


def test_each_size_of_step_is_judged_on_steps_of_its_size():
    """One-token steps cost far more per token than 64-decode steps on
    either arm: a warm-up of them on one arm must not decide for the
    decodes that follow (it did, for a whole benchmark run, when every size
    shared one average per arm)."""
    choice = SmallStepThreads(max_step_tokens=256, all_threads=2)
    # Warm-up: single-token steps, where one thread is the faster (a 2-thread
    # region's start-up is most of such a step).
    run(choice, {1: 2.0e-3, 2: 4.0e-3}, steps=40, tokens=1)
    assert choice.preferred_threads(1) == 1
    # Then decodes of 64, where two threads are faster: settled within the
    # first spells, not after hundreds of steps.
    ran = run(choice, {1: 0.17e-3, 2: 0.14e-3}, steps=60, tokens=64)
    assert choice.preferred_threads(64) == 2
    assert ran[-20:].count(2) >= 20 - choice.explore_steps
    assert choice.preferred_threads(1) == 1  # the single-token steps keep their own answer


def test_large_steps_run_on_all_threads_and_are_not_measured():
    choice = SmallStepThreads(max_step_tokens=256, all_threads=4)
    assert choice.threads_for(257) == 4
    choice.observe(4, 2048, 10.0)  # a prefill step: not a small step's sample
    assert choice.threads_for(64) == 1  # still the starting arm, unexplored


def test_no_choice_without_small_steps_or_a_second_thread():
    assert SmallStepThreads(max_step_tokens=0, all_threads=2).threads_for(1) == 2
    single = SmallStepThreads(max_step_tokens=256, all_threads=1)
    assert not single.choosing and single.threads_for(8) == 1
    with pytest.raises(ValueError):
        SmallStepThreads(max_step_tokens=-1, all_threads=2)
