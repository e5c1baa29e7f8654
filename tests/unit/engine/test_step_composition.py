"""What a step holds besides decodes: long prefills chunked while others
decode, batch prefill capped beside interactive work, and a quiet tenant's
prompt admitted ahead of another tenant's long prompt part-way through."""

from sluice.engine.block_manager import BlockManager
from sluice.engine.request import ServiceClass
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig


def make(budget: int = 64, chunk_cap: int = 0, batch_cap: int = 0) -> IterationScheduler:
    return IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=16, long_prefill_chunk_tokens=chunk_cap,
                        batch_prefill_tokens_beside_interactive=batch_cap),
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
    scheduler.add(make_request("long-alone", prompt_len=100, max_output=2), now_s=0.0)
    assert step(scheduler, 0.0) == {"long-alone": 64}  # nobody decodes: the whole budget
    scheduler.add(make_request("chat", max_output=20, prompt=own(1000, 4)), now_s=0.0)
    step(scheduler, 1.0)  # chat prefills (with the long one's rest)
    scheduler.add(make_request("long", max_output=2, prompt=own(4000, 100)), now_s=1.0)
    chunks = step(scheduler, 2.0)
    assert chunks["chat"] == 1 and chunks["long"] == 8


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
    first = step(scheduler, 0.0)
    assert first["chat"] == 4 and first["job"] == 6
    assert step(scheduler, 1.0)["job"] == 6


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
