"""Steps that give way to an arriving chat (SchedulerConfig.yield_to_chats):
which plans may be given up, what `abandon` leaves behind, and that work
given up again and again still finishes."""

import pytest

from sluice.engine.block_manager import BlockManager
from sluice.engine.request import ServiceClass
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig


def make(yield_to_chats: bool = True, chunk_cap: int = 0, long_over: int = 0) -> IterationScheduler:
    return IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, long_prefill_chunk_tokens=chunk_cap,
                        long_prefill_threshold_tokens=long_over, batch_prefill_tokens_beside_interactive=0,
                        yield_to_chats=yield_to_chats),
        BlockManager(256, 4),
    )


def own(first_token: int, length: int) -> tuple[int, ...]:
    return tuple(range(first_token, first_token + length))


def run(scheduler: IterationScheduler, plan) -> None:
    scheduler.update(plan, {c.request_id: 7 for c in plan.chunks if c.samples})


def test_a_batch_step_yields_and_a_first_token_step_does_not(make_request):
    scheduler = make()
    scheduler.add(make_request("job", prompt=own(1000, 100), max_output=8, service_class=ServiceClass.BATCH), 0.0)
    scheduler.add(make_request("job2", prompt=own(2000, 4), max_output=8, service_class=ServiceClass.BATCH), 0.0)
    plan = scheduler.schedule(0.0)
    assert plan.yields_to_chats
    run(scheduler, plan)
    scheduler.add(make_request("chat", prompt=own(5000, 4), max_output=4), 1.0)
    first_token_step = scheduler.schedule(1.0)
    assert {c.request_id for c in first_token_step.chunks} == {"chat"}
    assert not first_token_step.yields_to_chats  # holds batch back: nothing to give up for
    run(scheduler, first_token_step)
    batch_turn = scheduler.schedule(2.0)
    assert "job" in {c.request_id for c in batch_turn.chunks}
    assert not batch_turn.yields_to_chats  # batch's turn after a first-token step runs to its end
    run(scheduler, batch_turn)
    assert scheduler.schedule(3.0).yields_to_chats


def test_only_a_step_mostly_of_batch_yields(make_request):
    """Chats decoding beside batch: giving the step up costs each of them
    the part done, so it yields only where batch sequences outnumber them."""
    scheduler = make()
    for i in range(2):
        scheduler.add(make_request(f"chat{i}", prompt=own(1000 * (i + 1), 8), max_output=20), 0.0)
    run(scheduler, scheduler.schedule(0.0))
    scheduler.add(make_request("job0", prompt=own(9000, 8), max_output=20, service_class=ServiceClass.BATCH), 1.0)
    scheduler.add(make_request("job1", prompt=own(9100, 8), max_output=20, service_class=ServiceClass.BATCH), 1.0)
    plan = scheduler.schedule(1.0)
    assert sorted(c.request_id for c in plan.chunks) == ["chat0", "chat1", "job0", "job1"]
    assert not plan.yields_to_chats  # two and two: not mostly batch
    run(scheduler, plan)
    scheduler.cancel("chat0")
    plan = scheduler.schedule(2.0)
    assert sorted(c.request_id for c in plan.chunks) == ["chat1", "job0", "job1"]
    assert plan.yields_to_chats


def test_chats_alone_never_yield(make_request):
    scheduler = make()
    for i in range(3):
        scheduler.add(make_request(f"chat{i}", prompt=own(1000 * (i + 1), 8), max_output=4), 0.0)
    for now_s in range(5):
        plan = scheduler.schedule(float(now_s))
        assert not plan.yields_to_chats
        run(scheduler, plan)


def test_a_long_prompts_chunk_alone_does_not_yield(make_request):
    scheduler = make(chunk_cap=16, long_over=16)
    scheduler.add(make_request("doc", prompt=own(1000, 100), max_output=2, tenant="a"), 0.0)
    plan = scheduler.schedule(0.0)
    assert [len(c.token_ids) for c in plan.chunks] == [16]
    assert not plan.yields_to_chats  # nobody chats: nothing to give way to


def _doc_beside_chats(make_request, chats: int, chat_tenant: str, chunk_cap: int = 16):
    """A 200-token prompt of tenant "a" part-way through, beside `chats`
    decoding chats of `chat_tenant` that arrived just now: the next plan."""
    scheduler = make(chunk_cap=chunk_cap, long_over=16)
    scheduler.add(make_request("doc", prompt=own(1000, 200), max_output=2, tenant="a"), 0.0)
    run(scheduler, scheduler.schedule(0.0))
    for i in range(chats):
        scheduler.add(make_request(f"chat{i}", prompt=own(5000 + 100 * i, 4), max_output=20, tenant=chat_tenant), 0.1)
    first_token_step = scheduler.schedule(0.1)
    assert "doc" not in {c.request_id for c in first_token_step.chunks}  # held for the chats' first tokens
    assert not first_token_step.yields_to_chats
    run(scheduler, first_token_step)
    long_turn = scheduler.schedule(0.2)
    assert "doc" in {c.request_id for c in long_turn.chunks}
    assert not long_turn.yields_to_chats  # the held prompt's turn runs to its end
    run(scheduler, long_turn)
    return scheduler.schedule(0.3)


def test_a_step_mostly_of_another_tenants_long_prompt_yields(make_request):
    plan = _doc_beside_chats(make_request, chats=2, chat_tenant="b")
    assert sorted(c.request_id for c in plan.chunks) == ["chat0", "chat1", "doc"]
    assert plan.yields_to_chats


def test_a_long_prompt_beside_its_own_tenants_chats_does_not_yield(make_request):
    scheduler = make(chunk_cap=16, long_over=16)
    scheduler.add(make_request("doc", prompt=own(1000, 200), max_output=2, tenant="a"), 0.0)
    for i in range(2):
        scheduler.add(make_request(f"chat{i}", prompt=own(5000 + 100 * i, 4), max_output=20, tenant="a"), 0.0)
    plans = []
    for step in range(4):
        plans.append(scheduler.schedule(0.1 * step))
        run(scheduler, plans[-1])
    assert all("doc" in {c.request_id for c in plan.chunks} for plan in plans)
    assert not any(plan.yields_to_chats for plan in plans)  # its tenant's own trade-off, as with its chunk size


@pytest.mark.parametrize(("chunk_cap", "yields"), [(8, False), (16, True)])
def test_a_step_mostly_of_decodes_does_not_yield(make_request, chunk_cap, yields):
    """12 chats decoding beside the long prompt's chunk: giving the step up
    costs each of them the part done, so it yields only where the chunk
    holds more tokens than their decodes."""
    plan = _doc_beside_chats(make_request, chats=12, chat_tenant="b", chunk_cap=chunk_cap)
    assert [len(c.token_ids) for c in plan.chunks if c.request_id == "doc"] == [chunk_cap]
    assert sum(len(c.token_ids) == 1 for c in plan.chunks) == 12
    assert plan.yields_to_chats is yields


def test_off_nothing_yields(make_request):
    scheduler = make(yield_to_chats=False)
    scheduler.add(make_request("job", prompt=own(1000, 100), max_output=8, service_class=ServiceClass.BATCH), 0.0)
    plan = scheduler.schedule(0.0)
    assert plan.chunks and not plan.yields_to_chats
    with pytest.raises(ValueError):
        scheduler.abandon(plan)


def test_an_abandoned_plan_is_planned_again_and_the_next_runs_to_its_end(make_request):
    scheduler = make()
    scheduler.add(make_request("job", prompt=own(1000, 100), max_output=8, service_class=ServiceClass.BATCH), 0.0)
    run(scheduler, scheduler.schedule(0.0))  # 64 of 100 prompt tokens computed
    given_up = scheduler.schedule(1.0)
    assert given_up.yields_to_chats
    scheduler.abandon(given_up)
    free_before = scheduler.blocks.num_free_blocks
    again = scheduler.schedule(2.0)
    assert [(c.request_id, c.start_position, c.token_ids) for c in again.chunks] == \
        [(c.request_id, c.start_position, c.token_ids) for c in given_up.chunks]
    assert scheduler.blocks.num_free_blocks == free_before  # its blocks stayed with it, none twice
    assert not again.yields_to_chats
    run(scheduler, again)
    assert scheduler.schedule(3.0).yields_to_chats


def test_work_given_up_at_every_chance_still_finishes(make_request):
    """A chat arrives during every step and every step that may yield is
    given up: batch still runs at least every third step."""
    scheduler = make(chunk_cap=16, long_over=16)
    scheduler.add(make_request("job", prompt=own(1000, 60), max_output=6, service_class=ServiceClass.BATCH), 0.0)
    scheduler.add(make_request("job2", prompt=own(3000, 12), max_output=3, service_class=ServiceClass.BATCH), 0.0)
    done: set[str] = set()
    chats = abandoned = 0
    for now_s in range(300):
        plan = scheduler.schedule(float(now_s))
        # The chat arrives while the step runs (it joins the next plan).
        scheduler.add(make_request(f"chat{chats}", prompt=own(10_000 + 10 * chats, 4), max_output=1), now_s + 0.5)
        chats += 1
        if plan.yields_to_chats:
            scheduler.abandon(plan)
            abandoned += 1
            continue
        outputs = scheduler.update(plan, {c.request_id: 7 for c in plan.chunks if c.samples})
        done |= {o.request_id for o in outputs if o.finished}
        if {"job", "job2"} <= done:
            break
    assert {"job", "job2"} <= done
    assert abandoned > 0
    assert now_s < 60  # ~10 batch steps of work, at least every third step


def test_a_long_prompt_given_up_at_every_chance_still_finishes(make_request):
    """Another tenant's chats arrive all along and every step that may yield
    is given up: the long prompt still takes a chunk at least every third
    step."""
    scheduler = make(chunk_cap=16, long_over=16)
    scheduler.add(make_request("doc", prompt=own(1000, 120), max_output=3, tenant="a"), 0.0)
    done = False
    abandoned = 0
    for now_s in range(300):
        plan = scheduler.schedule(now_s * 0.1)
        # A chat arrives while the step runs (it joins the next plan), every
        # third step: more often leaves only first-token steps and the long
        # prompt's turns after them, which never yield.
        if now_s % 3 == 0:
            scheduler.add(make_request(f"chat{now_s}", prompt=own(10_000 + 10 * now_s, 4), max_output=3,
                                       tenant="b"), now_s * 0.1 + 0.05)
        if plan.yields_to_chats:
            scheduler.abandon(plan)
            abandoned += 1
            continue
        outputs = scheduler.update(plan, {c.request_id: 7 for c in plan.chunks if c.samples})
        if any(o.request_id == "doc" and o.finished for o in outputs):
            done = True
            break
    assert done and abandoned > 0
    assert now_s < 40  # 8 chunks and 3 tokens, at least every third step
