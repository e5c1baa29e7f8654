"""Prompt KV computed elsewhere (a disaggregated decode instance's input):
admitted as computed into fresh blocks, recomputed after a preemption."""

import pytest

from sluice.engine.request import EngineRequest, StopPolicy


def _run_step(scheduler, now_s: float, token: int = 99):
    plan = scheduler.schedule(now_s)
    sampled = {c.request_id: token for c in plan.chunks if c.samples}
    return plan, scheduler.update(plan, sampled)


def _request(request_id: str, prompt_len: int, external: int, max_output: int = 4, first_id: int = 1):
    return EngineRequest(request_id=request_id, prompt_token_ids=tuple(range(first_id, first_id + prompt_len)),
                         stop=StopPolicy(max_output_tokens=max_output, ignore_eos=True),
                         external_prefix_tokens=external)


def test_admitted_with_only_the_last_prompt_token_computed(make_scheduler):
    scheduler = make_scheduler(block_size=4, budget=16)
    scheduler.add(_request("a", prompt_len=10, external=9))
    plan, outputs = _run_step(scheduler, 0.0)
    (chunk,) = plan.chunks
    assert (chunk.start_position, chunk.token_ids, chunk.samples) == (9, (10,), True)
    # Blocks for the whole prompt, the transferred part included.
    assert len(chunk.block_table) == 3
    assert scheduler.blocks.num_used_blocks == 3
    # A transfer is no cache hit: billing still says nothing was cached.
    assert outputs[0].num_cached_tokens == 0
    assert outputs[0].new_token_ids == (99,)


def test_transferred_full_blocks_enter_the_prefix_cache(make_scheduler):
    scheduler = make_scheduler(block_size=4, budget=16)
    scheduler.add(_request("a", prompt_len=10, external=9, max_output=1))
    _run_step(scheduler, 0.0)
    # Same prompt, computed locally: it hits the two full blocks the transfer filled.
    scheduler.add(_request("b", prompt_len=10, external=0, max_output=1))
    plan, outputs = _run_step(scheduler, 1.0)
    assert plan.chunks[0].start_position == 8
    assert outputs[0].num_cached_tokens == 8


def test_a_cache_hit_longer_than_the_transfer_wins(make_scheduler):
    scheduler = make_scheduler(block_size=4, budget=16)
    scheduler.add(_request("warm", prompt_len=10, external=0, max_output=1))
    _run_step(scheduler, 0.0)
    scheduler.add(_request("a", prompt_len=10, external=3))
    plan, outputs = _run_step(scheduler, 1.0)
    assert plan.chunks[0].start_position == 8
    assert outputs[0].num_cached_tokens == 8


def test_transfer_beyond_a_short_cache_hit_keeps_the_hit_shared(make_scheduler):
    scheduler = make_scheduler(block_size=4, budget=16)
    scheduler.add(_request("warm", prompt_len=6, external=0, max_output=1))  # caches block [1..4]
    _run_step(scheduler, 0.0)
    scheduler.add(_request("a", prompt_len=14, external=13))
    plan, outputs = _run_step(scheduler, 1.0)
    (chunk,) = plan.chunks
    assert (chunk.start_position, len(chunk.token_ids)) == (13, 1)
    assert len(chunk.block_table) == 4
    assert outputs[0].num_cached_tokens == 4


def test_after_preemption_the_whole_prompt_is_recomputed(make_scheduler, make_request):
    # Blocks of 16, two of them: "old" grows into a second block while "a"
    # holds the other, so "a" (the newer) is preempted. Nothing of "a" ever
    # fills a block, so no prefix-cache hit can stand in for its transfer.
    scheduler = make_scheduler(num_blocks=2, block_size=16, budget=32)
    scheduler.add(make_request("old", prompt_len=12, max_output=12, prompt=tuple(range(500, 512))))
    _run_step(scheduler, 0.0)
    scheduler.add(_request("a", prompt_len=8, external=7, max_output=7))
    plan, _ = _run_step(scheduler, 1.0)
    assert {c.request_id: c.start_position for c in plan.chunks}["a"] == 7
    t = 2
    while "a" not in plan.preempted_ids:
        assert t < 20, "the test needs 'a' preempted"
        plan, _ = _run_step(scheduler, float(t))
        t += 1
    while not any(c.request_id == "a" for c in plan.chunks):
        assert t < 60, "'a' is never re-admitted"
        plan, _ = _run_step(scheduler, float(t))
        t += 1
    (chunk,) = [c for c in plan.chunks if c.request_id == "a"]
    # Prompt and outputs so far, every token computed here.
    assert chunk.start_position == 0
    assert len(chunk.token_ids) > 8
    outputs = []
    while scheduler.has_work():
        outputs += _run_step(scheduler, float(t))[1]
        t += 1
    assert [o.num_output_tokens for o in outputs if o.request_id == "a"][-1] == 7


@pytest.mark.parametrize("external", [-1, 5, 6])
def test_external_prefix_must_leave_the_last_prompt_token(external):
    with pytest.raises(ValueError, match="external_prefix_tokens"):
        _request("a", prompt_len=5, external=external)


def test_zero_external_is_the_plain_admission(make_scheduler):
    scheduler = make_scheduler(block_size=4, budget=16)
    scheduler.add(_request("a", prompt_len=10, external=0))
    plan, _ = _run_step(scheduler, 0.0)
    assert (plan.chunks[0].start_position, len(plan.chunks[0].token_ids)) == (0, 10)
