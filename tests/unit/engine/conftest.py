import pytest

from sluice.engine.block_manager import BlockManager
from sluice.engine.request import EngineRequest, ServiceClass, StopPolicy
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig


@pytest.fixture
def make_scheduler():
    def make(num_blocks: int = 64, block_size: int = 4, budget: int = 16, max_seqs: int = 8,
             max_model_len: int = 4096, preempt_after_s: float | None = 0.25) -> IterationScheduler:
        return IterationScheduler(
            SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len_tokens=max_model_len,
                            interactive_preempt_after_s=preempt_after_s),
            BlockManager(num_blocks, block_size),
        )
    return make


@pytest.fixture
def make_request():
    def make(request_id: str, prompt_len: int = 6, max_output: int = 4, *, service_class=ServiceClass.INTERACTIVE,
             eos: frozenset[int] = frozenset(), ignore_eos: bool = False, min_tokens: int = 0,
             tenant: str = "", prompt: tuple[int, ...] | None = None, cache_salt: str = "") -> EngineRequest:
        return EngineRequest(
            request_id=request_id,
            prompt_token_ids=prompt if prompt is not None else tuple(range(1, prompt_len + 1)),
            stop=StopPolicy(max_output_tokens=max_output, eos_token_ids=eos, ignore_eos=ignore_eos,
                            min_tokens=min_tokens),
            service_class=service_class,
            fairness_key=tenant,
            cache_salt=cache_salt,
        )
    return make
