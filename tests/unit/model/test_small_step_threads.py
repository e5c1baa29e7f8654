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
    assert choice.preferred_threads == faster
    # Past the first steps, the other arm only in short spells of exploration.
    assert ran[100:].count(slower) <= len(ran[100:]) * (choice.explore_steps / choice.explore_every) + 4
    assert ran[:40].count(slower) >= choice.min_samples  # both arms were measured early


def test_a_change_in_the_machine_is_noticed():
    choice = SmallStepThreads(max_step_tokens=256, all_threads=2)
    run(choice, {1: 0.5e-3, 2: 0.8e-3}, steps=300)
    assert choice.preferred_threads == 1
    # The other cores free up: all threads get faster than one.
    run(choice, {1: 0.5e-3, 2: 0.3e-3}, steps=300)
    assert choice.preferred_threads == 2


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
