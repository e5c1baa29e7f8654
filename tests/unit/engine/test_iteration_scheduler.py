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


def _admitted_order(scheduler, steps: int = 50) -> list[str]:
    order: list[str] = []
    for t in range(steps):
        plan, _ = _run_step(scheduler, t)
        order += [c.request_id for c in plan.chunks if c.request_id not in order]
        if not scheduler.has_work():
            break
    return order


def test_admission_rotates_across_tenants_within_a_class(make_scheduler, make_request):
    # One sequence slot: admissions happen one at a time, in line order.
    scheduler = make_scheduler(budget=64, max_seqs=1)
    for i in range(3):
        scheduler.add(make_request(f"a{i}", tenant="A", max_output=1))
    scheduler.add(make_request("b0", tenant="B", max_output=1))
    scheduler.add(make_request("a3", tenant="A", max_output=1))
    scheduler.add(make_request("c0", tenant="C", max_output=1))
    assert _admitted_order(scheduler) == ["a0", "b0", "c0", "a1", "a2", "a3"]


def test_interactive_goes_before_batch_whatever_the_tenants(make_scheduler, make_request):
    scheduler = make_scheduler(budget=64, max_seqs=1)
    scheduler.add(make_request("batch-x", tenant="X", service_class=ServiceClass.BATCH, max_output=1))
    scheduler.add(make_request("chat-a0", tenant="A", max_output=1))
    scheduler.add(make_request("chat-a1", tenant="A", max_output=1))
    assert _admitted_order(scheduler) == ["chat-a0", "chat-a1", "batch-x"]


def test_a_shared_prefix_is_computed_once_and_reported(make_scheduler, make_request):
    scheduler = make_scheduler(block_size=4, budget=64)
    shared = tuple(range(1, 13))  # 3 full blocks
    scheduler.add(make_request("first", prompt=shared + (40,), max_output=3))
    _run_step(scheduler, 0)  # prefilled: its full blocks are now cached
    scheduler.add(make_request("second", prompt=shared + (50, 51), max_output=2))
    plan, _ = _run_step(scheduler, 1)
    second = next(c for c in plan.chunks if c.request_id == "second")
    assert second.start_position == 12 and second.token_ids == (50, 51)
    first_table = scheduler.blocks.block_table("first").block_ids
    assert second.block_table[:3] == first_table[:3]
    outputs = []
    while scheduler.has_work():
        outputs += _run_step(scheduler, 2)[1]
    cached = {o.request_id: o.num_cached_tokens for o in outputs if o.finished}
    assert cached == {"first": 0, "second": 12}
    assert scheduler.blocks.prefix_cache_hit_tokens_total == 12
    assert scheduler.blocks.prefix_cache_queried_tokens_total == 13 + 14


def test_a_prompt_that_is_entirely_cached_still_computes_its_last_token(make_scheduler, make_request):
    scheduler = make_scheduler(block_size=4, budget=64)
    prompt = tuple(range(1, 9))  # exactly 2 blocks
    scheduler.add(make_request("first", prompt=prompt, max_output=1))
    _run_step(scheduler, 0)
    scheduler.add(make_request("again", prompt=prompt, max_output=1))
    plan, outputs = _run_step(scheduler, 1)
    assert [(c.start_position, c.token_ids, c.samples) for c in plan.chunks] == [(4, (5, 6, 7, 8), True)]
    assert outputs[0].num_cached_tokens == 4


def test_recompute_after_preemption_hits_its_own_cached_blocks(make_scheduler, make_request):
    # 6 blocks of 2: "old" grows until it must preempt "new", whose
    # computed full blocks stay cached and are found again on re-admission.
    scheduler = make_scheduler(num_blocks=6, block_size=2, budget=16)
    scheduler.add(make_request("old", prompt=(1, 2, 3), max_output=6))
    scheduler.add(make_request("new", prompt=(7, 8, 9, 10, 11), max_output=3))
    preempted, readmitted_at = [], None
    for t in range(40):
        plan, _ = _run_step(scheduler, t)
        preempted += plan.preempted_ids
        for chunk in plan.chunks:
            if chunk.request_id == "new" and preempted and readmitted_at is None:
                readmitted_at = chunk.start_position
        if not scheduler.has_work():
            break
    assert preempted == ["new"]
    assert readmitted_at and readmitted_at > 0
    assert scheduler.blocks.num_free_blocks == 6


def test_a_preempted_sequence_is_readmitted_before_newer_arrivals(make_scheduler, make_request):
    scheduler = make_scheduler(num_blocks=4, block_size=2, budget=16)
    scheduler.add(make_request("old", prompt_len=3, max_output=4))
    scheduler.add(make_request("mid", prompt_len=3, max_output=4))
    for t in range(20):
        plan, _ = _run_step(scheduler, t)
        if plan.preempted_ids:
            break
    assert plan.preempted_ids == ("mid",)
    scheduler.add(make_request("late", prompt_len=1, max_output=1, tenant="other"))
    order = _admitted_order(scheduler)
    assert order.index("mid") < order.index("late")
