"""Drive the replica's engine core and model runner synchronously, without
gRPC: the same three lines as the replica's engine loop."""

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from sluice.engine.block_manager import BlockManager
from sluice.engine.request import EngineRequest, StopPolicy
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig
from sluice.model.attention import default_backend, preferred_kv_layout
from sluice.model.cpu_tuning import tune_cpu_allocator
from sluice.model.kv_cache import allocate_kv_caches
from sluice.model.loader import load_llama
from sluice.model.runner import ModelRunner
from sluice.model.sampler import SamplingParams
from sluice.replica.executor import StepExecutor


@dataclass(frozen=True, slots=True)
class RunStats:
    wall_s: float
    output_tokens: int
    steps: int
    first_token_s: dict[str, float]
    token_times_s: dict[str, list[float]]

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s


def tune_process() -> None:
    """The replica's CPU start-up tuning (sluice.model.cpu_tuning), for a bench
    process: call first, so every side measured in the process shares it."""
    tune_cpu_allocator()


def build(model_dir: Path, *, num_blocks: int = 4096, block_size: int = 16, budget: int = 512,
          max_seqs: int = 128, single_thread_step_tokens: int = 0) -> tuple[IterationScheduler, StepExecutor]:
    cpu = torch.device("cpu")
    model = load_llama(model_dir, dtype=torch.float32, attention_backend=default_backend(cpu))
    caches = allocate_kv_caches(model.config, num_blocks, block_size, torch.float32, cpu,
                                layout=preferred_kv_layout(cpu))
    core = IterationScheduler(
        # No per-sequence chunk cap: these benchmarks measure what the step
        # budget alone does (the chunked-prefill one compares budgets).
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs,
                        max_model_len_tokens=model.config.max_position_embeddings, long_prefill_chunk_tokens=0),
        BlockManager(num_blocks, block_size),
    )
    return core, StepExecutor(ModelRunner(model, caches, single_thread_step_tokens=single_thread_step_tokens))


def greedy_request(request_id: str, prompt: list[int], max_output: int, fairness_key: str = "") -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=tuple(prompt),
        stop=StopPolicy(max_output_tokens=max_output, ignore_eos=True),
        fairness_key=fairness_key,
        sampling=SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_output),
        arrival_s=time.perf_counter(),
    )


def run_to_completion(core: IterationScheduler, executor: StepExecutor,
                      arrivals: list[tuple[float, EngineRequest]]) -> RunStats:
    """arrivals: (offset_s from start, request), added when their time comes."""
    pending = sorted(arrivals, key=lambda a: a[0])
    started = time.perf_counter()
    first: dict[str, float] = {}
    times: dict[str, list[float]] = {}
    produced = steps = 0
    while pending or core.has_work():
        now = time.perf_counter()
        while pending and pending[0][0] <= now - started:
            core.add(pending.pop(0)[1])
        if not core.has_work():
            time.sleep(0.0005)
            continue
        plan = core.schedule(now)
        outputs = core.update(plan, executor.execute(plan))
        steps += 1
        done_s = time.perf_counter() - started
        for output in outputs:
            produced += len(output.new_token_ids)
            first.setdefault(output.request_id, done_s)
            times.setdefault(output.request_id, []).append(done_s)
            if output.finished:
                executor.forget(output.request_id)
    return RunStats(time.perf_counter() - started, produced, steps, first, times)
