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


def test_a_long_interactive_prompts_chunk_does_not_yield(make_request):
    scheduler = make(chunk_cap=16, long_over=16)
    scheduler.add(make_request("doc", prompt=own(1000, 100), max_output=2), 0.0)
    plan = scheduler.schedule(0.0)
    assert [len(c.token_ids) for c in plan.chunks] == [16]
    assert not plan.yields_to_chats


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
