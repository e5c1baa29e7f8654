from sluice.engine.request import FinishReason, ServiceClass


def _run_step(scheduler, now_s: float, token: int = 99):
    plan = scheduler.schedule(now_s)
    sampled = {c.request_id: token for c in plan.chunks if c.samples}
    return plan, scheduler.update(plan, sampled)


def test_long_prompt_is_chunked_under_the_token_budget(make_scheduler, make_request):
    scheduler = make_scheduler(budget=4)
    scheduler.add(make_request("a", prompt_len=10, max_output=2))
    plans = [_run_step(scheduler, t)[0] for t in range(3)]
    assert [len(p.chunks[0].token_ids) for p in plans] == [4, 4, 2]
    assert [p.chunks[0].start_position for p in plans] == [0, 4, 8]
    assert [p.chunks[0].samples for p in plans] == [False, False, True]


def test_decodes_go_first_then_prefill_fills_the_budget(make_scheduler, make_request):
    scheduler = make_scheduler(budget=6)
    scheduler.add(make_request("a", prompt_len=3, max_output=10))
    _run_step(scheduler, 0)  # a prefilled, now decoding
    scheduler.add(make_request("b", prompt_len=20, max_output=10))
    plan, _ = _run_step(scheduler, 1)
    assert [(c.request_id, len(c.token_ids)) for c in plan.chunks] == [("a", 1), ("b", 5)]


def test_interactive_waiting_requests_are_admitted_before_batch(make_scheduler, make_request):
    scheduler = make_scheduler(budget=6)
    scheduler.add(make_request("batch", prompt_len=6, service_class=ServiceClass.BATCH))
    scheduler.add(make_request("chat", prompt_len=6))
    plan, _ = _run_step(scheduler, 0)
    assert [c.request_id for c in plan.chunks] == ["chat"]


def test_finishes_on_max_tokens_and_frees_blocks(make_scheduler, make_request):
    scheduler = make_scheduler()
    scheduler.add(make_request("a", prompt_len=5, max_output=3))
    outputs = []
    for t in range(5):
        outputs += _run_step(scheduler, t)[1]
    assert [o.finish_reason for o in outputs] == [None, None, FinishReason.LENGTH]
    assert outputs[-1].num_output_tokens == 3
    assert scheduler.blocks.num_free_blocks == scheduler.blocks.num_blocks
    assert not scheduler.has_work()


def test_eos_stops_unless_ignored_or_before_min_tokens(make_scheduler, make_request):
    for kwargs, expected in [({}, 1), ({"ignore_eos": True}, 4), ({"min_tokens": 2}, 2)]:
        scheduler = make_scheduler()
        scheduler.add(make_request("a", max_output=4, eos=frozenset({7}), **kwargs))
        outputs = []
        while scheduler.has_work():
            outputs += _run_step(scheduler, 0, token=7)[1]
        assert outputs[-1].num_output_tokens == expected, kwargs


def test_cancel_frees_blocks_immediately_and_ignores_the_inflight_step(make_scheduler, make_request):
    scheduler = make_scheduler()
    scheduler.add(make_request("a", prompt_len=8))
    plan = scheduler.schedule(0)
    assert scheduler.cancel("a")
    assert scheduler.blocks.num_free_blocks == scheduler.blocks.num_blocks
    assert scheduler.update(plan, {"a": 5}) == []
    assert not scheduler.cancel("a")


def test_preemption_by_recompute_keeps_outputs_and_place_in_line(make_scheduler, make_request):
    # 4 blocks of 2 tokens: two sequences of 3 prompt tokens fit, growth does not.
    scheduler = make_scheduler(num_blocks=4, block_size=2, budget=16)
    scheduler.add(make_request("old", prompt_len=3, max_output=4))
    scheduler.add(make_request("new", prompt_len=3, max_output=4))
    outputs = []
    preempted = []
    for t in range(20):
        plan, step_outputs = _run_step(scheduler, t)
        preempted += plan.preempted_ids
        outputs += step_outputs
        if not scheduler.has_work():
            break
    assert preempted and preempted[0] == "new"  # the newest goes first
    finished = {o.request_id: o.num_output_tokens for o in outputs if o.finished}
    assert finished == {"old": 4, "new": 4}
    assert scheduler.num_preemptions_total >= 1
    assert scheduler.blocks.num_free_blocks == 4


def test_a_request_that_can_never_fit_is_refused(make_scheduler, make_request):
    scheduler = make_scheduler(num_blocks=2, block_size=4)
    import pytest

    with pytest.raises(ValueError, match="never fit"):
        scheduler.add(make_request("huge", prompt_len=20, max_output=4))
