"""A tiny random Llama and a synchronous engine harness for replica tests.

The harness runs the real pure core (IterationScheduler + BlockManager) and
the real StepExecutor over sluice.model's ModelRunner, one step after the
other on this thread: the replica's EngineLoop without its thread, command
queue and sinks, so a test sees every step's logits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from sluice.engine.block_manager import BlockManager
from sluice.engine.request import EngineRequest
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig
from sluice.model import LlamaModel, ModelRunner, allocate_kv_caches, load_llama
from sluice.replica.executor import StepExecutor
from support.tiny_llama import save_tiny_hf_model


@dataclass(frozen=True)
class TinyCheckpoint:
    path: Path
    hf_model: torch.nn.Module  # transformers LlamaForCausalLM, eval, fp32
    model: LlamaModel          # ours, loaded from the saved safetensors


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> TinyCheckpoint:
    path = tmp_path_factory.mktemp("tiny-llama-replica")
    # 4 query heads over 2 KV heads (GQA) and several blocks per sequence, at
    # ~1 ms a forward step on CPU; initializer 0.2 (not HF's 0.02) so logits
    # spread out and near-ties of the argmax are rare.
    hf_model = save_tiny_hf_model(path, llama3_rope=False)
    return TinyCheckpoint(path, hf_model, load_llama(path, dtype=torch.float32))


@dataclass
class EngineRun:
    tokens: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    # Per request, one [vocab] fp32 row per output token, in order.
    logits: dict[str, list[torch.Tensor]] = field(default_factory=lambda: defaultdict(list))
    cached_tokens: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    prefix_hit_tokens: int = 0  # all admissions, re-admissions after preemption included
    max_step_tokens: int = 0
    steps: int = 0


def run_engine(
    model: LlamaModel,
    requests: Sequence[EngineRequest],
    *,
    arrival_steps: Mapping[str, int] | None = None,  # request id -> step it is added at (default 0)
    num_blocks: int,
    block_size: int,
    budget_tokens: int,
    max_seqs: int = 16,
    max_steps: int = 5_000,
) -> EngineRun:
    """Drive core + runner step by step until every request finished."""
    caches = allocate_kv_caches(model.config, num_blocks, block_size, torch.float32, "cpu")
    executor = StepExecutor(ModelRunner(model, caches))
    core = IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=budget_tokens, max_num_seqs=max_seqs,
                        max_model_len_tokens=model.config.max_position_embeddings),
        BlockManager(num_blocks, block_size),
    )
    arrival_steps = arrival_steps or {}
    pending = sorted(requests, key=lambda r: arrival_steps.get(r.request_id, 0))
    run = EngineRun()
    for step in range(max_steps):
        while pending and arrival_steps.get(pending[0].request_id, 0) <= step:
            core.add(pending.pop(0), float(step))
        if not pending and not core.has_work():
            break
        plan = core.schedule(float(step))
        if plan.is_empty:
            continue
        run.max_step_tokens = max(run.max_step_tokens, plan.num_tokens)
        result = executor.run(plan, return_logits=True)
        for request_id, row in result.logits.items():
            run.logits[request_id].append(row.clone())
        for output in core.update(plan, result.sampled):
            run.tokens[output.request_id].extend(output.new_token_ids)
            if output.finished:
                run.cached_tokens[output.request_id] = output.num_cached_tokens
                executor.forget(output.request_id)
        run.steps = step + 1
    else:
        raise AssertionError(f"engine still busy after {max_steps} steps")
    run.preemptions = core.num_preemptions_total
    run.prefix_hit_tokens = core.blocks.prefix_cache_hit_tokens_total
    assert core.blocks.num_free_blocks == num_blocks  # idle: every block back
    return run


@pytest.fixture(scope="session")
def engine_runner():
    return run_engine


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Matrices this small gain nothing from intra-op threads, and on a busy
    2-core runner OpenMP threads spinning against other processes make each
    step ~20x slower. Restored after the module."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
