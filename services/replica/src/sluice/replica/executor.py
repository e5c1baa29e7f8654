"""Turns the engine core's StepPlan into a model-runner step and back.

Owns the per-request sampling generators (seeded requests draw from their
own generator on every step, wherever they sit in the batch).
"""

from collections.abc import Mapping

import torch

from sluice.engine.plan import StepPlan
from sluice.model.runner import ModelInput, ModelRunner, SequenceInput
from sluice.model.sampler import SampleRequest, SamplingParams


class StepExecutor:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._generators: dict[str, torch.Generator | None] = {}

    def execute(self, plan: StepPlan) -> Mapping[str, int]:
        sequences = []
        for chunk in plan.chunks:
            sample = None
            if chunk.samples:
                params: SamplingParams = chunk.sampling
                if chunk.request_id not in self._generators:
                    self._generators[chunk.request_id] = params.make_generator(self.runner.device)
                sample = SampleRequest(params, chunk.num_output_tokens, self._generators[chunk.request_id])
            sequences.append(SequenceInput(chunk.token_ids, chunk.start_position, chunk.block_table, sample))
        output = self.runner.execute(ModelInput(tuple(sequences)))
        return {
            chunk.request_id: token
            for chunk, token in zip(plan.chunks, output.sampled_token_ids)
            if token is not None
        }

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
