"""Turns the engine core's StepPlan into a model-runner step and back.

Owns the per-request sampling generators (seeded requests draw from their
own generator on every step, wherever they sit in the batch). A plan is
prepared (flattened into tensors) and run in two calls, so the engine loop
can prepare step N+1 while step N runs; a decode planned before its token
was sampled gets the token from the step before it at run time.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from sluice.engine.plan import StepPlan
from sluice.engine.sequence import PLACEHOLDER_TOKEN_ID
from sluice.model.runner import ModelInput, ModelRunner, PreparedStep, SequenceInput
from sluice.model.sampler import SampleRequest, SamplingParams
from sluice.model.yielding import YieldCheck


@dataclass(frozen=True, slots=True)
class StepResult:
    sampled: Mapping[str, int]  # request id -> token, for chunks that sample
    # request id -> [vocab] float32 logits the token was sampled from; only
    # when asked for (tests, later logprobs), else empty.
    logits: Mapping[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PreparedPlan:
    plan: StepPlan
    batch: ModelInput
    step: PreparedStep | None  # None for an empty plan
    # (flattened row, request id) of each placeholder token: the id is what
    # the step before this one sampled for that request.
    placeholders: tuple[tuple[int, str], ...] = ()


class StepExecutor:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self._generators: dict[str, torch.Generator | None] = {}

    def execute(self, plan: StepPlan, should_yield: YieldCheck | None = None) -> Mapping[str, int]:
        """The sampled tokens; StepYielded if `should_yield` gave the step up."""
        return self.run(plan, should_yield=should_yield).sampled

    def run(self, plan: StepPlan, *, return_logits: bool = False, should_yield: YieldCheck | None = None) -> StepResult:
        return self.run_prepared(self.prepare(plan, return_logits=return_logits), should_yield=should_yield)

    def prepare(self, plan: StepPlan, *, return_logits: bool = False) -> PreparedPlan:
        sequences = []
        placeholders = []
        row = 0
        for chunk in plan.chunks:
            sample = None
            if chunk.samples:
                params: SamplingParams = chunk.sampling
                if chunk.request_id not in self._generators:
                    self._generators[chunk.request_id] = params.make_generator(self.runner.device)
                sample = SampleRequest(params, chunk.num_output_tokens, self._generators[chunk.request_id])
            token_ids = chunk.token_ids
            if token_ids[-1] == PLACEHOLDER_TOKEN_ID:  # only ever a decode's one token
                placeholders.append((row + len(token_ids) - 1, chunk.request_id))
                token_ids = (*token_ids[:-1], 0)  # a valid id until the real one is filled in
            row += len(token_ids)
            sequences.append(SequenceInput(token_ids, chunk.start_position, chunk.block_table, sample))
        batch = ModelInput(tuple(sequences), return_logits=return_logits)
        step = self.runner.prepare(batch) if sequences else None
        return PreparedPlan(plan, batch, step, tuple(placeholders))

    def run_prepared(self, prepared: PreparedPlan, previous: Mapping[str, int] | None = None,
                     should_yield: YieldCheck | None = None) -> StepResult:
        """Run a prepared plan; `previous`: the samples of the step before
        it, which fill its placeholders."""
        if prepared.step is None:
            return StepResult({})
        if prepared.placeholders:
            if previous is None:
                raise ValueError("a plan with placeholder tokens needs the previous step's samples")
            rows = [row for row, _ in prepared.placeholders]
            self.runner.fill_tokens(prepared.step, rows, [previous[request_id] for _, request_id in prepared.placeholders])
        output = self.runner.run(prepared.batch, prepared.step, should_yield)
        plan = prepared.plan
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
