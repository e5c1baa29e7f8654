"""Health probes (the replica's canary) skip every queue in the engine: a
replica that is merely full must not look wedged."""

from dataclasses import replace

from sluice.engine.block_manager import BlockManager
from sluice.engine.request import FinishReason, ServiceClass
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig


def _run_step(scheduler, now_s: float, token: int = 99):
    plan = scheduler.schedule(now_s)
    sampled = {c.request_id: token for c in plan.chunks if c.samples}
    return plan, scheduler.update(plan, sampled)


def probe(make_request, request_id="canary-0"):
    return replace(make_request(request_id, prompt_len=1, max_output=1), probe=True)


def test_a_probe_is_answered_in_the_next_step_past_full_slots_and_a_waiting_line(make_scheduler, make_request):
    scheduler = make_scheduler(max_seqs=2, budget=16)
    for name in ("a", "b"):
        scheduler.add(make_request(name, prompt_len=3, max_output=50))
    _run_step(scheduler, 0.0)
    scheduler.add(make_request("waiting", prompt_len=3, max_output=5))  # no slot: it waits
    scheduler.add(probe(make_request))
    plan, outputs = _run_step(scheduler, 0.1)
    assert "canary-0" in {c.request_id for c in plan.chunks}
    assert "waiting" not in {c.request_id for c in plan.chunks}
    (answer,) = [o for o in outputs if o.request_id == "canary-0"]
    assert answer.finish_reason is FinishReason.LENGTH and answer.new_token_ids == (99,)
    assert scheduler.num_running == 2  # the probe came and went


def test_a_probe_takes_a_block_from_the_newest_sequence_when_none_is_free(make_scheduler, make_request):
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_seqs=8, budget=32)
    scheduler.add(make_request("old", prompt_len=8, max_output=4))
    scheduler.add(make_request("new", prompt_len=8, max_output=4))
    _run_step(scheduler, 0.0)
    assert scheduler.blocks.num_free_blocks == 0
    scheduler.add(probe(make_request))
    plan, outputs = _run_step(scheduler, 0.1)
    assert plan.preempted_ids == ("new",)
    assert [o.request_id for o in outputs if o.finished] == ["canary-0"]
    # The preempted sequence recomputes and goes on to its full output.
    finished = {}
    for step in range(20):
        for output in _run_step(scheduler, 0.2 + step)[1]:
            if output.finished:
                finished[output.request_id] = output.num_output_tokens
    assert finished == {"old": 4, "new": 4}


def test_a_probe_does_not_count_as_interactive_work(make_scheduler, make_request):
    """Batch prefill is capped while interactive work is live; a canary every
    few seconds must not keep it capped."""
    scheduler = IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=128, batch_prefill_tokens_beside_interactive=32), BlockManager(64, 16))
    scheduler.add(probe(make_request))
    _run_step(scheduler, 0.0)
    scheduler.add(make_request("batch", prompt_len=200, max_output=2, service_class=ServiceClass.BATCH))
    plan, _ = _run_step(scheduler, 0.01)
    (chunk,) = plan.chunks
    assert len(chunk.token_ids) == 128  # the whole budget, not the 32 allowed beside interactive work


def test_a_cancelled_probe_leaves_nothing_behind(make_scheduler, make_request):
    scheduler = make_scheduler()
    scheduler.add(probe(make_request))
    assert scheduler.num_waiting == 1 and scheduler.has_work()
    assert scheduler.cancel("canary-0")
    assert scheduler.num_waiting == 0 and not scheduler.has_work()
