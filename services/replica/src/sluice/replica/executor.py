"""Turns the engine core's StepPlan into a model-runner step and back.

Owns the per-request sampling generators (seeded requests draw from their
own generator on every step, wherever they sit in the batch).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from sluice.engine.plan import StepPlan
from sluice.model.runner import ModelInput, ModelRunner, SequenceInput
from sluice.model.sampler import SampleRequest, SamplingParams
from sluice.model.yielding import YieldCheck


@dataclass(frozen=True, slots=True)
class StepResult:
    sampled: Mapping[str, int]  # request id -> token, for chunks that sample
    # request id -> [vocab] float32 logits the token was sampled from; only
    # when asked for (tests, later logprobs), else empty.
    logits: Mapping[str, torch.Tensor] = field(default_factory=dict)


class StepExecutor:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._generators: dict[str, torch.Generator | None] = {}

    def execute(self, plan: StepPlan, should_yield: YieldCheck | None = None) -> Mapping[str, int]:
        """The sampled tokens; StepYielded if `should_yield` gave the step up."""
        return self.run(plan, should_yield=should_yield).sampled

    def run(self, plan: StepPlan, *, return_logits: bool = False, should_yield: YieldCheck | None = None) -> StepResult:
        sequences = []
        for chunk in plan.chunks:
            sample = None
            if chunk.samples:
                params: SamplingParams = chunk.sampling
                if chunk.request_id not in self._generators:
                    self._generators[chunk.request_id] = params.make_generator(self.runner.device)
                sample = SampleRequest(params, chunk.num_output_tokens, self._generators[chunk.request_id])
            sequences.append(SequenceInput(chunk.token_ids, chunk.start_position, chunk.block_table, sample))
        output = self.runner.execute(ModelInput(tuple(sequences), return_logits=return_logits), should_yield)
        sampled = {
            chunk.request_id: token
            for chunk, token in zip(plan.chunks, output.sampled_token_ids)
            if token is not None
        }
        if output.logits is None:
            return StepResult(sampled)
        # Logits rows come in sequence order, one per sampling chunk.
        return StepResult(sampled, dict(zip(sampled, output.logits)))

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
