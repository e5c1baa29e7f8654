"""What a step holds besides decodes: long prefills chunked while others
decode, batch prefill capped beside interactive work, and a quiet tenant's
prompt admitted ahead of another tenant's long prompt part-way through."""

import pytest

from sluice.engine.block_manager import BlockManager
from sluice.engine.request import ServiceClass
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig


def make(budget: int = 64, chunk_cap: int = 0, batch_cap: int = 0, long_per_step: int = 1,
         long_over: int = 0) -> IterationScheduler:
    """`long_over`: the long-prompt threshold; 0 = the chunk cap (every
    chunked prompt is long)."""
    return IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=16, long_prefill_chunk_tokens=chunk_cap,
                        max_long_prefills_per_step=long_per_step, batch_prefill_tokens_beside_interactive=batch_cap,
                        long_prefill_threshold_tokens=long_over),
        BlockManager(256, 4),
    )


def own(first_token: int, length: int) -> tuple[int, ...]:
    """A prompt sharing no block with the others (no prefix-cache hits)."""
    return tuple(range(first_token, first_token + length))


def step(scheduler: IterationScheduler, now_s: float) -> dict[str, int]:
    plan = scheduler.schedule(now_s)
    scheduler.update(plan, {c.request_id: 7 for c in plan.chunks if c.samples})
    return {c.request_id: len(c.token_ids) for c in plan.chunks}


def test_a_long_prompt_prefills_in_capped_chunks_while_others_decode(make_request):
    scheduler = make(budget=64, chunk_cap=8)
    scheduler.add(make_request("chat", max_output=20, prompt=own(1000, 4)), now_s=0.0)
    assert step(scheduler, 0.0) == {"chat": 4}
    scheduler.add(make_request("long", max_output=2, prompt=own(4000, 100)), now_s=0.0)
    assert step(scheduler, 1.0) == {"chat": 1, "long": 8}
    assert step(scheduler, 2.0) == {"chat": 1, "long": 8}


def test_no_cap_means_the_budget(make_request):
    scheduler = make(budget=64, chunk_cap=0)
    scheduler.add(make_request("chat", max_output=20, prompt=own(1000, 4)), now_s=0.0)
    step(scheduler, 0.0)
    scheduler.add(make_request("long", max_output=2, prompt=own(4000, 100)), now_s=0.0)
    assert step(scheduler, 1.0) == {"chat": 1, "long": 63}


def test_batch_prefill_is_capped_while_interactive_work_is_here(make_request):
    scheduler = make(budget=64, batch_cap=6)
    scheduler.add(make_request("chat", max_output=20, prompt=own(1000, 4)), now_s=0.0)
    scheduler.add(make_request("job", prompt_len=100, max_output=2, service_class=ServiceClass.BATCH), now_s=0.0)
    assert step(scheduler, 0.0) == {"chat": 4}  # the chat's first-token step holds batch back
    assert step(scheduler, 1.0) == {"chat": 1, "job": 6}
    assert step(scheduler, 2.0)["job"] == 6


def test_batch_stays_capped_for_the_recent_window_after_interactive_work_leaves(make_request):
    scheduler = IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, long_prefill_chunk_tokens=0,
                        batch_prefill_tokens_beside_interactive=6, interactive_recent_s=1.0),
        BlockManager(256, 4),
    )
    scheduler.add(make_request("chat", max_output=1, prompt=own(1000, 4)), now_s=0.0)
    assert step(scheduler, 0.0) == {"chat": 4}  # its only token: the chat is gone
    scheduler.add(make_request("job", prompt=own(2000, 400), max_output=2, service_class=ServiceClass.BATCH),
                  now_s=0.1)
    assert step(scheduler, 0.5) == {"job": 6}  # the next chat of a steady stream may be a moment away
    assert step(scheduler, 0.99) == {"job": 6}
    assert step(scheduler, 1.0) == {"job": 64}  # a second without interactive arrivals: the whole budget


def test_no_recent_window_caps_batch_only_while_interactive_is_here(make_request):
    scheduler = IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, long_prefill_chunk_tokens=0,
                        batch_prefill_tokens_beside_interactive=6, interactive_recent_s=0.0),
        BlockManager(256, 4),
    )
    scheduler.add(make_request("chat", max_output=1, prompt=own(1000, 4)), now_s=0.0)
    step(scheduler, 0.0)
    scheduler.add(make_request("job", prompt=own(2000, 400), max_output=2, service_class=ServiceClass.BATCH),
                  now_s=0.0)
    assert step(scheduler, 0.0) == {"job": 64}


def test_batch_chunks_beside_interactive_shrink_with_depth(make_request):
    scheduler = IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, long_prefill_chunk_tokens=32,
                        long_prefill_threshold_tokens=32, prefill_depth_scale_tokens=16,
                        batch_prefill_tokens_beside_interactive=8),
        BlockManager(256, 4),
    )
    scheduler.add(make_request("chat", max_output=50, prompt=own(1000, 4)), now_s=0.0)
    scheduler.add(make_request("job", prompt=own(2000, 400), max_output=2, service_class=ServiceClass.BATCH),
                  now_s=0.0)
    step(scheduler, 0.0)  # the chat's first-token step
    chunks = [step(scheduler, 0.1 * i)["job"] for i in range(1, 6)]
    assert chunks[0] <= 8 and chunks[-1] < chunks[0]  # the batch cap, counted at the prompt's start
    assert chunks == sorted(chunks, reverse=True) and chunks[-1] >= 1


def test_batch_prefill_takes_the_budget_when_no_interactive_is_here(make_request):
    scheduler = make(budget=64, batch_cap=6)
    scheduler.add(make_request("job", prompt_len=100, max_output=2, service_class=ServiceClass.BATCH), now_s=0.0)
    assert step(scheduler, 0.0) == {"job": 64}


def test_a_quiet_tenant_is_admitted_before_another_tenants_prompt_part_way_through(make_request):
    scheduler = make(budget=16)
    scheduler.add(make_request("a-long", prompt_len=100, max_output=2, tenant="a"), now_s=0.0)
    assert step(scheduler, 0.0) == {"a-long": 16}
    scheduler.add(make_request("b-short", max_output=2, tenant="b", prompt=own(2000, 6)), now_s=0.5)
    chunks = step(scheduler, 1.0)
    assert chunks == {"b-short": 6, "a-long": 10}  # b first, a takes the rest of the budget
    # The same tenant's next prompt waits its turn behind its own long one.
    scheduler.add(make_request("a-short", max_output=2, tenant="a", prompt=own(3000, 6)), now_s=1.5)
    chunks = step(scheduler, 2.0)
    assert chunks["a-long"] == 15 and "a-short" not in chunks


def test_one_long_prefill_per_step_while_others_are_here(make_request):
    scheduler = make(budget=64, chunk_cap=8)
    scheduler.add(make_request("long-1", max_output=2, tenant="a", prompt=own(1000, 40)), now_s=0.0)
    scheduler.add(make_request("long-2", max_output=2, tenant="b", prompt=own(2000, 40)), now_s=0.0)
    scheduler.add(make_request("short", max_output=2, tenant="c", prompt=own(3000, 6)), now_s=0.0)
    first = step(scheduler, 0.0)
    assert first == {"long-1": 8}  # its chunk is this step's long one; long-2 keeps its place, and short behind it
    # Tenant a is part-way through: b's long prompt takes this step's long
    # chunk (tenants take turns), and the short one fits beside it.
    assert step(scheduler, 1.0) == {"long-2": 8, "short": 6}


def test_several_long_prefills_per_step_when_allowed(make_request):
    scheduler = make(budget=64, chunk_cap=8, long_per_step=2)
    scheduler.add(make_request("long-1", max_output=2, tenant="a", prompt=own(1000, 40)), now_s=0.0)
    scheduler.add(make_request("long-2", max_output=2, tenant="b", prompt=own(2000, 40)), now_s=0.0)
    assert step(scheduler, 0.0) == {"long-1": 8, "long-2": 8}


def test_a_prompt_alone_is_chunked_too(make_request):
    # Whoever arrives during its step waits for one capped step, not the prompt.
    scheduler = make(budget=64, chunk_cap=8)
    scheduler.add(make_request("long", max_output=2, prompt=own(1000, 100)), now_s=0.0)
    assert step(scheduler, 0.0) == {"long": 8}
    scheduler.add(make_request("chat", max_output=2, tenant="b", prompt=own(2000, 4)), now_s=0.0)
    assert step(scheduler, 1.0) == {"chat": 4}  # its first token's step carries no long chunk


def test_a_long_prompts_tail_takes_the_long_slot_too(make_request):
    # long-1's last 4 tokens are under the cap, but they are still part of a
    # long prefill: long-2's first chunk waits a step instead of doubling it.
    scheduler = make(budget=64, chunk_cap=8)
    scheduler.add(make_request("long-1", max_output=2, tenant="a", prompt=own(1000, 12)), now_s=0.0)
    scheduler.add(make_request("long-2", max_output=2, tenant="a", prompt=own(2000, 40)), now_s=0.0)
    assert step(scheduler, 0.0) == {"long-1": 8}
    assert step(scheduler, 1.0) == {"long-1": 4}
    assert step(scheduler, 2.0) == {"long-1": 1, "long-2": 8}


def test_a_quiet_tenants_first_token_step_carries_no_long_chunk_but_never_two_running(make_request):
    scheduler = make(budget=64, chunk_cap=8)
    scheduler.add(make_request("a-long", max_output=2, tenant="a", prompt=own(1000, 60)), now_s=0.0)
    scheduler.add(make_request("a-chat", max_output=20, tenant="a", prompt=own(5000, 4)), now_s=0.0)
    assert step(scheduler, 0.0) == {"a-long": 8, "a-chat": 4}
    scheduler.add(make_request("b-1", max_output=20, tenant="b", prompt=own(2000, 6)), now_s=0.5)
    assert step(scheduler, 1.0) == {"a-chat": 1, "b-1": 6}  # b's first token waits for no long chunk
    scheduler.add(make_request("c-1", max_output=20, tenant="c", prompt=own(3000, 6)), now_s=1.5)
    # c is admitted too, but a-long was left out last step: it goes now.
    assert step(scheduler, 2.0) == {"a-chat": 1, "b-1": 1, "c-1": 6, "a-long": 8}



def test_a_first_token_step_carries_no_long_batch_chunk_either(make_request):
    scheduler = make(budget=64, chunk_cap=8, batch_cap=16)
    scheduler.add(make_request("job", max_output=2, prompt=own(1000, 60), service_class=ServiceClass.BATCH),
                  now_s=0.0)
    scheduler.add(make_request("chat-0", max_output=20, prompt=own(5000, 4)), now_s=0.0)
    assert step(scheduler, 0.0) == {"chat-0": 4}  # chat-0's first token: the job starts next step
    assert step(scheduler, 1.0) == {"chat-0": 1, "job": 8}
    scheduler.add(make_request("chat-1", max_output=20, prompt=own(2000, 6)), now_s=1.5)
    assert step(scheduler, 2.0) == {"chat-0": 1, "chat-1": 6}  # same tenant, other class: still first
    assert step(scheduler, 3.0) == {"chat-0": 1, "chat-1": 1, "job": 8}


def test_chunks_shrink_deep_into_a_long_prompt_at_the_depth_scale():
    from sluice.engine.step_builder import chunk_at_depth

    sizes = [chunk_at_depth(256, start, 1000) for start in (0, 500, 1000, 2000, 4000, 100_000)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] < 256
    assert sizes[-1] == 32  # never under an eighth of the cap
    # The chunk's cost, counted in tokens at the prompt's start, stays within the cap.
    for start, n in zip((0, 500, 1000, 2000, 4000), sizes):
        assert n * (1 + (start + n / 2) / 1000) <= 256 + 1e-9
    assert chunk_at_depth(256, 4000, 0) == 256  # no scale: depth is ignored


def test_the_scheduler_sizes_long_chunks_by_their_depth(make_request):
    scheduler = IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, long_prefill_chunk_tokens=16,
                        prefill_depth_scale_tokens=16),
        BlockManager(256, 4),
    )
    scheduler.add(make_request("long", max_output=2, prompt=own(1000, 200)), now_s=0.0)
    chunks = [step(scheduler, float(i))["long"] for i in range(4)]
    assert chunks[0] < 16 and chunks == sorted(chunks, reverse=True) and chunks[-1] >= 2


def test_prompts_between_the_cap_and_the_long_threshold_are_chunked_but_not_one_per_step(make_request):
    scheduler = make(budget=64, chunk_cap=8, long_over=20)
    for i, tenant in enumerate("abc"):
        scheduler.add(make_request(f"mid-{tenant}", max_output=2, tenant=tenant, prompt=own(1000 * (i + 1), 12)),
                      now_s=0.0)
    scheduler.add(make_request("long", max_output=2, tenant="d", prompt=own(5000, 40)), now_s=0.0)
    # All three medium prompts get a capped chunk; the long one its single slot.
    assert step(scheduler, 0.0) == {"mid-a": 8, "mid-b": 8, "mid-c": 8, "long": 8}


def test_a_first_token_step_admits_no_batch_that_it_would_then_hold_back(make_request):
    scheduler = make(budget=64, chunk_cap=8)
    scheduler.add(make_request("long", prompt=own(1000, 100), max_output=2, service_class=ServiceClass.BATCH,
                               tenant="x"), now_s=0.0)
    assert step(scheduler, 0.0) == {"long": 8}  # part-way: tenant x is busy
    scheduler.add(make_request("job", prompt=own(3000, 20), max_output=2, service_class=ServiceClass.BATCH,
                               tenant="y"), now_s=0.5)
    scheduler.add(make_request("chat", prompt=own(5000, 4), max_output=5, tenant="z"), now_s=0.5)
    assert step(scheduler, 1.0) == {"chat": 4}  # the chat's first-token step: no batch at all
    assert scheduler.num_running == 2  # long and chat; job still waits (not admitted without a chunk)
    assert scheduler.num_waiting == 1


def test_a_quiet_tenants_prompt_that_loses_its_blocks_in_the_same_step_was_never_admitted(make_request):
    scheduler = IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, long_prefill_chunk_tokens=8,
                        long_prefill_threshold_tokens=64),
        BlockManager(5, 4),
    )
    scheduler.add(make_request("r0", prompt=own(1000, 16), max_output=2, tenant="x"), now_s=0.0)
    assert step(scheduler, 0.0) == {"r0": 8}  # part-way: 2 of 5 blocks
    scheduler.add(make_request("quiet", prompt=own(3000, 12), max_output=2, tenant="y"), now_s=0.5)
    # The quiet tenant goes first and takes 2 blocks; r0's next chunk needs 2
    # of the 1 left, so the newest (quiet) gives its blocks back.
    plan = scheduler.schedule(1.0)
    assert {c.request_id: len(c.token_ids) for c in plan.chunks} == {"r0": 8}
    assert plan.preempted_ids == () and scheduler.num_preemptions_total == 0  # it never ran
    assert scheduler.num_running == 1 and scheduler.num_waiting == 1


def beside_chats(chat_cap: int, *, chunk_cap: int = 8, recent_s: float = 1.0, long_over: int | None = None
                 ) -> IterationScheduler:
    """`long_over`: the long-prompt threshold; None = the chunk cap."""
    return IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, long_prefill_chunk_tokens=chunk_cap,
                        long_prefill_threshold_tokens=chunk_cap if long_over is None else long_over,
                        long_prefill_chunk_tokens_beside_chats=chat_cap,
                        interactive_recent_s=recent_s),
        BlockManager(256, 4),
    )


def test_a_long_prompt_takes_smaller_chunks_while_another_tenant_chats(make_request):
    scheduler = beside_chats(3)
    scheduler.add(make_request("long", max_output=2, tenant="a", prompt=own(1000, 100)), now_s=0.0)
    assert step(scheduler, 0.0) == {"long": 8}  # nobody else here: the ordinary cap
    scheduler.add(make_request("chat", max_output=20, tenant="b", prompt=own(2000, 4)), now_s=0.1)
    assert step(scheduler, 0.1) == {"chat": 4}  # the chat's first-token step holds the long chunk back
    assert step(scheduler, 0.2) == {"chat": 1, "long": 3}
    assert step(scheduler, 0.3) == {"chat": 1, "long": 3}


def test_the_smaller_chunks_last_the_recent_window_after_the_last_chat(make_request):
    scheduler = beside_chats(3, recent_s=1.0)
    scheduler.add(make_request("chat", max_output=1, tenant="b", prompt=own(2000, 4)), now_s=0.0)
    assert step(scheduler, 0.0) == {"chat": 4}  # its only token: the chat is gone
    scheduler.add(make_request("long", max_output=2, tenant="a", prompt=own(1000, 100)), now_s=0.1)
    assert step(scheduler, 0.5) == {"long": 3}  # b's next chat of a steady stream may be a moment away
    assert step(scheduler, 0.99) == {"long": 3}
    assert step(scheduler, 1.0) == {"long": 8}  # a second without b's chats: the ordinary cap


def test_a_tenants_own_chats_leave_its_long_chunks_alone(make_request):
    # Its own chats waiting on its own documents is the tenant's trade-off;
    # the cap is there so one tenant's long prompts do not set another's TTFT.
    scheduler = beside_chats(3)
    scheduler.add(make_request("long", max_output=2, tenant="a", prompt=own(1000, 100)), now_s=0.0)
    scheduler.add(make_request("a-chat", max_output=20, tenant="a", prompt=own(2000, 4)), now_s=0.0)
    step(scheduler, 0.0)
    assert step(scheduler, 0.1)["long"] == 8
    scheduler.add(make_request("b-chat", max_output=20, tenant="b", prompt=own(3000, 4)), now_s=0.2)
    step(scheduler, 0.2)  # b's first-token step
    assert step(scheduler, 0.3)["long"] == 3


def test_another_tenants_long_prompts_are_no_chats(make_request):
    scheduler = beside_chats(3)
    scheduler.add(make_request("long-a", max_output=2, tenant="a", prompt=own(1000, 100)), now_s=0.0)
    scheduler.add(make_request("long-b", max_output=2, tenant="b", prompt=own(2000, 100)), now_s=0.0)
    assert step(scheduler, 0.0) == {"long-a": 8}
    assert step(scheduler, 0.1) == {"long-b": 8}


def test_batch_chats_do_not_shrink_long_chunks(make_request):
    scheduler = beside_chats(3)
    scheduler.add(make_request("long", max_output=2, tenant="a", prompt=own(1000, 100)), now_s=0.0)
    scheduler.add(make_request("job", max_output=20, tenant="b", prompt=own(2000, 4),
                               service_class=ServiceClass.BATCH), now_s=0.0)
    assert step(scheduler, 0.0)["long"] == 8


@pytest.mark.parametrize("chat_cap", [0, 32], ids=["none", "above-the-chunk-cap"])
def test_a_chat_cap_of_none_or_above_the_chunk_cap_leaves_the_ordinary_cap(make_request, chat_cap):
    scheduler = beside_chats(chat_cap)
    scheduler.add(make_request("long", max_output=2, tenant="a", prompt=own(1000, 100)), now_s=0.0)
    scheduler.add(make_request("chat", max_output=20, tenant="b", prompt=own(2000, 4)), now_s=0.0)
    step(scheduler, 0.0)
    assert step(scheduler, 0.1)["long"] == 8


def test_a_chat_is_any_prompt_that_would_not_be_long(make_request):
    # Threshold 0: long means over the chunk cap (8), so a 6-token prompt is a chat.
    scheduler = beside_chats(3, long_over=0)
    scheduler.add(make_request("long", max_output=2, tenant="a", prompt=own(1000, 100)), now_s=0.0)
    scheduler.add(make_request("chat", max_output=20, tenant="b", prompt=own(2000, 6)), now_s=0.0)
    step(scheduler, 0.0)
    assert step(scheduler, 0.1)["long"] == 3
