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


def test_requests_of_different_cache_salts_never_share_blocks(make_scheduler, make_request):
    scheduler = make_scheduler(block_size=4, budget=64)
    shared = tuple(range(1, 13))  # 3 full blocks
    scheduler.add(make_request("mine", prompt=shared + (40,), max_output=3, cache_salt="tenant:a"))
    _run_step(scheduler, 0)
    scheduler.add(make_request("theirs", prompt=shared + (50,), max_output=2, cache_salt="tenant:b"))
    scheduler.add(make_request("mine-again", prompt=shared + (60,), max_output=2, cache_salt="tenant:a"))
    plan, _ = _run_step(scheduler, 1)
    starts = {c.request_id: c.start_position for c in plan.chunks}
    assert starts["theirs"] == 0  # the same tokens, another scope: computed afresh
    assert starts["mine-again"] == 12  # its own scope's blocks hit


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


# -- a waiting interactive sequence preempts running batch ---------------------

B = ServiceClass.BATCH


def _positional_step(scheduler, now_s: float):
    """A step whose sampled token depends only on (request, position), so a
    request's outputs are the same whether or not it was preempted."""
    plan = scheduler.schedule(now_s)
    sampled = {c.request_id: (hash(c.request_id) + c.start_position + len(c.token_ids)) % 50 + 1
               for c in plan.chunks if c.samples}
    return plan, scheduler.update(plan, sampled)


def _batch_fills_the_kv(make_scheduler, make_request, **kwargs):
    """6 blocks of 4: two batch sequences of 8 prompt tokens hold all 6 blocks
    after their first decode; neither needs a 4th block before it finishes."""
    scheduler = make_scheduler(num_blocks=6, block_size=4, budget=16, **kwargs)
    scheduler.add(make_request("b-old", prompt_len=8, max_output=4, service_class=B), 0.0)
    scheduler.add(make_request("b-new", prompt=tuple(range(20, 28)), max_output=4, service_class=B), 0.0)
    _positional_step(scheduler, 0.0)  # both prefilled
    _positional_step(scheduler, 0.5)  # both decoding in 3 blocks each
    assert scheduler.blocks.num_free_blocks == 0
    return scheduler


def test_a_waiting_interactive_preempts_the_newest_batch_after_the_threshold(make_scheduler, make_request):
    scheduler = _batch_fills_the_kv(make_scheduler, make_request, preempt_after_s=0.25)
    scheduler.add(make_request("chat", prompt_len=4, max_output=2), 1.0)

    plan, _ = _positional_step(scheduler, 1.2)  # waited 0.2 s: still waits
    assert [c.request_id for c in plan.chunks] == ["b-old", "b-new"] and not plan.preempted_ids

    plan, _ = _positional_step(scheduler, 1.25)  # waited 0.25 s
    assert plan.preempted_ids == ("b-new",)  # the newest batch; one is enough
    assert [c.request_id for c in plan.chunks] == ["chat"]  # its first-token step: b-old sits it out
    plan, _ = _positional_step(scheduler, 1.3)
    assert [c.request_id for c in plan.chunks] == ["chat", "b-old"]  # decodes, interactive first
    assert scheduler.num_preemptions_total == 1


def test_the_preempted_batch_resumes_ahead_of_new_batch_with_its_outputs(make_scheduler, make_request):
    def outputs_of(preempt_after_s):
        scheduler = _batch_fills_the_kv(make_scheduler, make_request, preempt_after_s=preempt_after_s)
        scheduler.add(make_request("chat", prompt_len=4, max_output=2), 1.0)
        plan, outputs = _positional_step(scheduler, 1.5)
        scheduler.add(make_request("b-late", prompt_len=3, max_output=1, service_class=B, tenant="other"), 1.5)
        order = []
        for t in range(2, 40):
            plan, step_outputs = _positional_step(scheduler, float(t))
            order += [c.request_id for c in plan.chunks if c.request_id not in order]
            outputs += step_outputs
            if not scheduler.has_work():
                break
        tokens = {}  # outputs after the KV filled up
        for output in outputs:
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
        finished = {o.request_id: o.num_output_tokens for o in outputs if o.finished}
        assert finished == {"b-old": 4, "b-new": 4, "chat": 2, "b-late": 1}
        return scheduler, order, tokens

    preempting, order, tokens = outputs_of(0.25)
    assert preempting.num_preemptions_total == 1
    assert order.index("b-new") < order.index("b-late")
    never, _, unpreempted_tokens = outputs_of(None)
    assert never.num_preemptions_total == 0
    assert tokens == unpreempted_tokens
    assert preempting.blocks.num_free_blocks == 6


def test_none_disables_preemption_by_a_waiting_sequence(make_scheduler, make_request):
    scheduler = _batch_fills_the_kv(make_scheduler, make_request, preempt_after_s=None)
    scheduler.add(make_request("chat", prompt_len=4, max_output=2), 1.0)
    plan, _ = _positional_step(scheduler, 100.0)
    assert not plan.preempted_ids and "chat" not in {c.request_id for c in plan.chunks}


def test_a_waiting_interactive_takes_a_batch_sequence_slot(make_scheduler, make_request):
    scheduler = make_scheduler(budget=64, max_seqs=3)
    for i in range(3):
        scheduler.add(make_request(f"b{i}", prompt_len=4, max_output=20, service_class=B), 0.0)
    _positional_step(scheduler, 0.0)
    scheduler.add(make_request("chat", prompt_len=4, max_output=2), 1.0)
    plan, _ = _positional_step(scheduler, 1.1)
    assert "chat" not in {c.request_id for c in plan.chunks} and not plan.preempted_ids
    plan, _ = _positional_step(scheduler, 1.3)
    assert plan.preempted_ids == ("b2",)  # one slot is needed: only the newest goes
    assert {c.request_id for c in plan.chunks} == {"chat"}  # the others sit its first-token step out
    assert scheduler.num_running == 3
    plan, _ = _positional_step(scheduler, 1.4)
    assert {c.request_id for c in plan.chunks} == {"b0", "b1", "chat"}


def test_a_waiting_interactive_never_preempts_an_interactive_one(make_scheduler, make_request):
    scheduler = make_scheduler(budget=64, max_seqs=3)
    scheduler.add(make_request("batch", prompt_len=4, max_output=20, service_class=B), 0.0)
    _positional_step(scheduler, 0.0)
    scheduler.add(make_request("chat-a", prompt_len=4, max_output=20), 0.0)
    scheduler.add(make_request("chat-b", prompt_len=4, max_output=20), 0.0)
    _positional_step(scheduler, 0.5)
    scheduler.add(make_request("chat-c", prompt_len=4, max_output=20), 1.0)
    scheduler.add(make_request("chat-d", prompt_len=4, max_output=2), 1.0)
    plan, _ = _positional_step(scheduler, 5.0)
    assert plan.preempted_ids == ("batch",)  # older than both chats, still the one to go
    assert "chat-c" in {c.request_id for c in plan.chunks}
    for t in range(6, 10):  # chat-d waits on a slot; the interactive ones keep theirs
        plan, _ = _positional_step(scheduler, float(t))
        assert not plan.preempted_ids and "chat-d" not in {c.request_id for c in plan.chunks}


def test_no_batch_is_preempted_when_all_of_them_would_not_make_room(make_scheduler, make_request):
    # 6 blocks of 4: an interactive holds 4, a batch 2; "big" needs 3 more
    # than the 0 free, and the batch's 2 would not do.
    scheduler = make_scheduler(num_blocks=6, block_size=4, budget=32)
    scheduler.add(make_request("batch", prompt_len=5, max_output=3, service_class=B), 0.0)
    _positional_step(scheduler, 0.0)
    scheduler.add(make_request("chat-long", prompt=tuple(range(100, 113)), max_output=3), 0.0)  # no shared block
    _positional_step(scheduler, 0.0)
    assert scheduler.blocks.num_free_blocks == 0
    scheduler.add(make_request("big", prompt=tuple(range(30, 42)), max_output=1), 0.0)
    plan, _ = _positional_step(scheduler, 1.0)
    assert not plan.preempted_ids and scheduler.num_preemptions_total == 0
    assert {c.request_id for c in plan.chunks} == {"chat-long", "batch"}
