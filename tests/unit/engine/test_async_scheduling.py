"""The iteration scheduler planning step N+1 before step N is updated (async
scheduling): placeholders, the length limit seen ahead, a stop token's
wasted decode, preemption while a step runs, taking plans back, and the
same outputs as planning one step at a time on random workloads.

A fake model samples token f(request, position): what a sequence generates
does not depend on how its steps were grouped, so both drivers must agree
token for token.
"""

import random
import zlib
from collections import deque

import pytest

from sluice.engine.block_manager import BlockManager
from sluice.engine.request import EngineRequest, FinishReason, ServiceClass, StopPolicy
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig
from sluice.engine.sequence import PLACEHOLDER_TOKEN_ID

STOP_TOKEN = 3


def fake_token(request_id: str, position: int) -> int:
    """The token a sequence samples at `position` (the sample's own position)."""
    return zlib.crc32(f"{request_id}:{position}".encode()) % 40 + 1


def run_fake_model(plan) -> dict[str, int]:
    return {chunk.request_id: fake_token(chunk.request_id, chunk.start_position + len(chunk.token_ids))
            for chunk in plan.chunks if chunk.samples}


def expected_token(request: EngineRequest, position: int) -> int:
    prompt = request.prompt_token_ids
    return prompt[position] if position < len(prompt) else fake_token(request.request_id, position)


def check_chunks(plan, requests: dict[str, EngineRequest], sampling_ids: set[str]) -> None:
    """Every planned token is the sequence's own; a placeholder only stands
    for the token of a step still in flight, as a decode's one token."""
    for chunk in plan.chunks:
        request = requests[chunk.request_id]
        for offset, token_id in enumerate(chunk.token_ids):
            position = chunk.start_position + offset
            if token_id == PLACEHOLDER_TOKEN_ID:
                assert len(chunk.token_ids) == 1 and chunk.request_id in sampling_ids
            else:
                assert token_id == expected_token(request, position)


def drive(core: IterationScheduler, requests: list[EngineRequest], ahead: bool, max_steps: int = 5000):
    """Run the workload to its end as the engine loop does: with `ahead`,
    each plan is made while the one before it is in flight."""
    by_id = {r.request_id: r for r in requests}
    for request in requests:
        core.add(request, 0.0)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    reasons: dict[str, FinishReason] = {}
    in_flight = deque()
    now_s = 0.0
    for _ in range(max_steps):
        if not core.has_work() and not in_flight:
            break
        now_s += 0.01
        launched = False
        if core.has_work() and len(in_flight) < 2:
            plan = core.schedule(now_s)
            if not plan.is_empty:
                in_flight_sampling = {c.request_id for p in in_flight for c in p.chunks if c.samples}
                check_chunks(plan, by_id, in_flight_sampling)
                in_flight.append(plan)
                launched = True
        if in_flight and (not ahead or len(in_flight) == 2 or not launched):
            plan = in_flight.popleft()
            for output in core.update(plan, run_fake_model(plan)):
                tokens[output.request_id].extend(output.new_token_ids)
                assert output.num_output_tokens == len(tokens[output.request_id])
                if output.finished:
                    assert output.request_id not in reasons
                    reasons[output.request_id] = output.finish_reason
    else:
        raise AssertionError("the workload did not finish")
    assert core.blocks.num_free_blocks == core.blocks.num_blocks
    return tokens, reasons


def request(request_id: str, prompt_len: int, max_output: int, *, stop: bool = False,
            service_class: ServiceClass = ServiceClass.INTERACTIVE, min_tokens: int = 0) -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=tuple(range(5, 5 + prompt_len)),
        stop=StopPolicy(max_output_tokens=max_output, stop_token_ids=frozenset({STOP_TOKEN}) if stop else frozenset(),
                        min_tokens=min_tokens),
        service_class=service_class,
        fairness_key=f"tenant-{hash(request_id) % 3}",
    )


def scheduler(num_blocks: int = 64, budget: int = 16, max_seqs: int = 8, max_model_len: int = 4096,
              chunk_cap: int = 0) -> IterationScheduler:
    return IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len_tokens=max_model_len,
                        long_prefill_chunk_tokens=chunk_cap, interactive_preempt_after_s=0.05),
        BlockManager(num_blocks, 4),
    )


def test_the_next_plan_decodes_the_token_in_flight_with_a_placeholder():
    core = scheduler()
    core.add(request("a", 5, 4), 0.0)
    first = core.schedule(0.0)  # the prompt, sampling the first output
    (chunk,) = first.chunks
    assert chunk.samples and chunk.num_output_tokens == 0
    second = core.schedule(0.01)  # planned while the first runs
    (decode,) = second.chunks
    assert decode.token_ids == (PLACEHOLDER_TOKEN_ID,)
    assert decode.start_position == 5 and decode.samples
    assert decode.num_output_tokens == 1  # min_tokens counts the pending token
    assert len(decode.block_table) == 2  # its K/V has a slot: position 5, block 1

    outputs = core.update(first, {"a": 9})
    assert [(o.new_token_ids, o.num_output_tokens) for o in outputs] == [((9,), 1)]
    third = core.schedule(0.02)  # the first's token is known now; the second's is not
    assert third.chunks[0].token_ids == (PLACEHOLDER_TOKEN_ID,) and third.chunks[0].start_position == 6
    assert [o.new_token_ids for o in core.update(second, {"a": 11})] == [(11,)]
    fourth = core.schedule(0.03)
    assert fourth.chunks[0].start_position == 7


def test_a_token_that_reaches_the_length_limit_gets_no_more_steps():
    core = scheduler()
    core.add(request("a", 4, 2), 0.0)
    core.add(request("b", 4, 5), 0.0)
    prompts = core.schedule(0.0)
    decodes = core.schedule(0.01)
    assert {c.request_id for c in decodes.chunks} == {"a", "b"}
    core.update(prompts, {"a": 7, "b": 8})
    # a's second (and last) output is pending in `decodes`: nothing to plan for it.
    after = core.schedule(0.02)
    assert [c.request_id for c in after.chunks] == ["b"]
    outputs = core.update(decodes, {"a": 9, "b": 10})
    assert [(o.request_id, o.finish_reason) for o in outputs] == [("a", FinishReason.LENGTH), ("b", None)]
    core.update(after, {"b": 11})


def test_the_model_context_limit_is_seen_ahead_too():
    core = scheduler(max_model_len=6)
    core.add(request("a", 4, 10), 0.0)
    prompt = core.schedule(0.0)  # token 5 of 6
    decode = core.schedule(0.01)  # token 6: the last the context holds
    assert core.schedule(0.02).is_empty
    core.update(prompt, {"a": 7})
    (output,) = core.update(decode, {"a": 8})
    assert output.finish_reason is FinishReason.LENGTH and output.num_output_tokens == 2
    assert not core.has_work()


def test_a_stop_token_wastes_the_decode_already_planned_and_nothing_more():
    core = scheduler()
    core.add(request("a", 4, 10, stop=True), 0.0)
    prompt = core.schedule(0.0)
    decode = core.schedule(0.01)  # of the token that turns out to be a stop token
    (output,) = core.update(prompt, {"a": STOP_TOKEN})
    assert output.finish_reason is FinishReason.STOP
    assert core.blocks.num_free_blocks == core.blocks.num_blocks  # freed while the decode runs
    assert core.update(decode, {"a": 12}) == []  # its token is nobody's
    assert not core.has_work()


def test_a_sequence_preempted_while_its_step_runs_keeps_that_steps_token():
    # Two blocks of 4: the batch sequence's decode needs a second block just
    # as the interactive prompt that waited arrives.
    core = scheduler(num_blocks=3, budget=16)
    core.add(request("batch", 4, 6, service_class=ServiceClass.BATCH), 0.0)
    prompt = core.schedule(0.0)
    core.add(request("chat", 8, 2), 0.0)
    # Planned while the batch prompt runs: the chat has waited long enough to preempt.
    plan = core.schedule(1.0)
    assert plan.preempted_ids == ("batch",)
    assert [c.request_id for c in plan.chunks] == ["chat"]
    (output,) = core.update(prompt, {"batch": 21})
    assert output.request_id == "batch" and output.new_token_ids == (21,) and not output.finished
    core.update(plan, {"chat": 5})
    # Recomputed from its prompt and the kept token: the next sample is its second output.
    resumed = []
    while core.has_work():
        step = core.schedule(2.0)
        resumed.extend(core.update(step, {c.request_id: 30 for c in step.chunks if c.samples}))
    batch = [o for o in resumed if o.request_id == "batch"]
    assert batch[0].num_output_tokens == 2 and batch[-1].num_output_tokens == 6


def test_plans_are_updated_in_order_and_only_the_newest_is_taken_back():
    core = scheduler()
    core.add(request("a", 4, 5), 0.0)
    first = core.schedule(0.0)
    second = core.schedule(0.01)
    with pytest.raises(ValueError, match="stale"):
        core.update(second, {"a": 1})
    with pytest.raises(ValueError, match="newest"):
        core.unschedule(first)
    core.unschedule(second)  # as if never made
    core.update(first, {"a": 4})
    again = core.schedule(0.02)
    assert again.chunks[0].token_ids == (4,) and again.chunks[0].start_position == 4
    with pytest.raises(ValueError, match="stale"):
        core.update(first, {"a": 4})


@pytest.mark.parametrize("seed", range(12))
def test_planning_ahead_generates_what_planning_one_step_at_a_time_does(seed):
    rng = random.Random(seed)
    requests = [
        request(f"r{i}", rng.randint(1, 30), rng.randint(1, 12), stop=rng.random() < 0.5,
                service_class=ServiceClass.BATCH if rng.random() < 0.4 else ServiceClass.INTERACTIVE,
                min_tokens=rng.choice((0, 0, 2)))
        for i in range(rng.randint(4, 14))
    ]
    # A small pool and budget: preemptions, chunked prompts, waiting lines.
    config = dict(num_blocks=rng.randint(12, 24), budget=rng.choice((8, 16, 32)), max_seqs=rng.randint(2, 8),
                  chunk_cap=rng.choice((0, 8)))
    one_at_a_time = drive(scheduler(**config), requests, ahead=False)
    ahead = drive(scheduler(**config), requests, ahead=True)
    assert ahead == one_at_a_time
    tokens, reasons = ahead
    assert set(reasons) == {r.request_id for r in requests}
    for r in requests:  # and what a request generates is what the fake model says
        expected = [fake_token(r.request_id, len(r.prompt_token_ids) + i) for i in range(len(tokens[r.request_id]))]
        assert tokens[r.request_id] == expected
