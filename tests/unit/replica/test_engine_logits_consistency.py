"""A request's logits do not depend on what the engine did around it.

The real core (IterationScheduler + BlockManager) drives the real model
runner over a tiny random Llama in fp32. Each request must get the same
logits at every output step whether it ran alone, batched with others,
chunked under a small token budget, preempted and recomputed in a tiny
block pool, or started from another request's cached prefix; and those
logits must match Hugging Face transformers' full-sequence forward of the
same checkpoint.

Tolerance: 1e-4 absolute on fp32 logits of magnitude up to ~6.5. Every path
runs the same fp32 math on the same weights; they differ only in summation
order (BLAS kernels picked by batch shape, chunked vs whole prefill, SDPA vs
the paged reference attention in transformers' case), which moves logits by
at most ~8e-6 here. Real bookkeeping errors (a wrong block, a stale cached
prefix, a recompute that skips or repeats a token, a wrong position) move
them by orders of magnitude more. Greedy tokens must agree wherever the reference's top
two logits are further apart than the tolerance; nearer than that, the
argmax is a coin toss of rounding.
"""

from __future__ import annotations

import pytest
import torch

from sluice.engine.request import EngineRequest, ServiceClass, StopPolicy
from sluice.model.sampler import SamplingParams

ATOL = 1e-4
OUTPUT_TOKENS = 12
EOS = 2


def random_prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 128, (n,), generator=g).tolist()


SHARED = random_prompt(40, seed=10)
PROMPTS = {
    "shared-a": SHARED + random_prompt(5, seed=11),
    "shared-b": SHARED + random_prompt(9, seed=12),
    "shared-a-again": SHARED + random_prompt(5, seed=11),  # identical prompt, its own request
    "long": random_prompt(70, seed=13),
    "short": random_prompt(3, seed=14),
}


def greedy(request_id: str, *, service_class: ServiceClass = ServiceClass.INTERACTIVE,
           tenant: str = "t") -> EngineRequest:
    return EngineRequest(
        request_id=request_id,
        prompt_token_ids=tuple(PROMPTS[request_id]),
        stop=StopPolicy(max_output_tokens=OUTPUT_TOKENS, eos_token_ids=frozenset({EOS}), ignore_eos=True),
        service_class=service_class,
        fairness_key=tenant,
        sampling=SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=OUTPUT_TOKENS),
    )


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    top2 = logits.topk(2, dim=-1).values  # [rows, 2]
    return top2[:, 0] - top2[:, 1]


def hf_logits(hf_model, prompt: list[int], outputs: list[int]) -> torch.Tensor:
    """Logits at every output step: [len(outputs), vocab], one full forward."""
    ids = prompt + outputs[:-1]
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()  # [len(ids), vocab]
    return logits[len(prompt) - 1 :]


def assert_matches_transformers(run, hf_model) -> None:
    for request_id, tokens in run.tokens.items():
        assert len(tokens) == OUTPUT_TOKENS
        ours = torch.stack(run.logits[request_id])  # [OUTPUT_TOKENS, vocab]
        theirs = hf_logits(hf_model, PROMPTS[request_id], tokens)
        assert ours.shape == theirs.shape
        assert (ours - theirs).abs().max() < ATOL, request_id
        decisive = top2_gap(theirs) > ATOL
        assert decisive.any()
        assert torch.equal(torch.tensor(tokens)[decisive], theirs.argmax(-1)[decisive]), request_id


def assert_matches_alone(run, alone) -> None:
    """Step by step against the request run alone, up to the first token
    where a near-tie let the two runs pick differently (never seen here)."""
    for request_id, tokens in run.tokens.items():
        reference_id = "shared-a" if request_id == "shared-a-again" else request_id
        ref_tokens, ref_logits = alone.tokens[reference_id], alone.logits[reference_id]
        for step, (ours, ref) in enumerate(zip(run.logits[request_id], ref_logits, strict=True)):
            assert (ours - ref).abs().max() < ATOL, (request_id, step)
            if tokens[step] != ref_tokens[step]:
                assert top2_gap(ref[None])[0] <= ATOL, (request_id, step)
                break  # the contexts differ from here on


@pytest.fixture(scope="module")
def alone(tiny_checkpoint, engine_runner):
    """Every request on an engine of its own, roomy and unchunked."""
    runs = [engine_runner(tiny_checkpoint.model, [greedy(rid)], num_blocks=32, block_size=16, budget_tokens=512)
            for rid in PROMPTS]
    merged = runs[0]
    for run in runs[1:]:
        merged.tokens.update(run.tokens)
        merged.logits.update(run.logits)
    return merged


def test_alone_matches_transformers(alone, tiny_checkpoint):
    assert_matches_transformers(alone, tiny_checkpoint.hf_model)
    assert alone.tokens["shared-a"] == alone.tokens["shared-a-again"]


def test_batched_together(alone, tiny_checkpoint, engine_runner):
    run = engine_runner(tiny_checkpoint.model, [greedy(rid) for rid in PROMPTS],
                        num_blocks=64, block_size=16, budget_tokens=512)
    assert_matches_alone(run, alone)
    assert_matches_transformers(run, tiny_checkpoint.hf_model)


def test_chunked_under_a_small_budget(alone, tiny_checkpoint, engine_runner):
    # 5 tokens a step: prompts split mid-block, decodes share steps with chunks.
    run = engine_runner(tiny_checkpoint.model, [greedy(rid) for rid in PROMPTS],
                        num_blocks=64, block_size=16, budget_tokens=5)
    assert run.max_step_tokens == 5
    assert_matches_alone(run, alone)
    assert_matches_transformers(run, tiny_checkpoint.hf_model)


def test_preempted_and_recomputed_in_a_tiny_pool(alone, tiny_checkpoint, engine_runner):
    # 21 blocks of 4 tokens hold "long" (70 + 12 tokens) alone and no more.
    requests = [greedy("long"), greedy("shared-b", service_class=ServiceClass.BATCH, tenant="u"), greedy("short")]
    run = engine_runner(tiny_checkpoint.model, requests, num_blocks=21, block_size=4, budget_tokens=64)
    assert run.preemptions > 0
    assert_matches_alone(run, alone)
    assert_matches_transformers(run, tiny_checkpoint.hf_model)


def test_prefix_hits_on_a_shared_prompt(alone, tiny_checkpoint, engine_runner):
    requests = [greedy("shared-a"), greedy("shared-b", tenant="u"), greedy("shared-a-again", tenant="v")]
    run = engine_runner(tiny_checkpoint.model, requests, arrival_steps={"shared-b": 2, "shared-a-again": 4},
                        num_blocks=32, block_size=16, budget_tokens=512)
    # 40 shared tokens = 2 full blocks of 16; the identical prompt hits no
    # more because its third block is not full.
    assert run.cached_tokens == {"shared-a": 0, "shared-b": 32, "shared-a-again": 32}
    assert_matches_alone(run, alone)
    assert_matches_transformers(run, tiny_checkpoint.hf_model)


def test_everything_at_once(alone, tiny_checkpoint, engine_runner):
    """Small blocks, a tight pool, a small budget, staggered arrivals, both
    classes and three tenants: chunks, prefix hits and recompute together."""
    classes = {"long": ServiceClass.BATCH, "shared-b": ServiceClass.BATCH}
    tenants = {"shared-a": "t", "shared-b": "u", "shared-a-again": "v", "long": "u", "short": "t"}
    requests = [greedy(rid, service_class=classes.get(rid, ServiceClass.INTERACTIVE), tenant=tenants[rid])
                for rid in PROMPTS]
    run = engine_runner(tiny_checkpoint.model, requests, num_blocks=24, block_size=4, budget_tokens=7,
                        arrival_steps={"shared-a": 0, "long": 0, "shared-b": 6, "short": 9, "shared-a-again": 14})
    assert run.preemptions > 0 and run.max_step_tokens <= 7
    assert any(run.cached_tokens.values())
    assert_matches_alone(run, alone)
    assert_matches_transformers(run, tiny_checkpoint.hf_model)
