"""Runs the quality gate's prompt set through both versions' weights with
the project's own model code (sluice.model), and scores it (score.py).

Torch lives here only: the state machine and the CLI import this module
lazily, when a quality check actually runs (`pip install
sluice-rollout[quality]`). The versions are loaded one after the other,
serving first, so the check needs the memory of one model, not two:

    serving:   greedy answer g per prompt, log p(reference) per token
    candidate: top-1 at each position of prompt + g (teacher forcing),
               log p(reference) per token, its own greedy answer

Both versions must share a tokenizer (the same ids for the same text):
token-level agreement and per-token log-likelihoods mean nothing across
vocabularies, so a mismatch is an error, not a low score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from sluice.model import ModelInput, ModelRunner, SequenceInput, allocate_kv_caches, load_llama
from sluice.model.attention import default_backend, preferred_kv_layout
from sluice.rollout.quality.prompts import PromptSet, PromptSpec
from sluice.rollout.quality.score import Answer, PromptObservation, QualityReport, QualityThresholds, score
from sluice.tokenization import Tokenizer

BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class EncodedPrompt:
    spec: PromptSpec
    prompt_ids: tuple[int, ...]
    reference_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ServingPass:
    greedy: tuple[int, ...]
    reference_logprobs: tuple[float, ...]
    answer: Answer


class VersionModel:
    """One version's model on one device, with KV room for one sequence of
    `max_tokens` (the prompt set is run a prompt at a time)."""

    def __init__(self, model_dir: Path, max_tokens: int, *, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> None:
        # The replica's attention path for the device (Triton on CUDA, the
        # native or vectorised kernels on CPU), so a check on a GPU runs at serving speed.
        where = torch.device(device)
        self.model = load_llama(model_dir, dtype=dtype, device=device, attention_backend=default_backend(where))
        self.eos_ids = frozenset(self.model.config.eos_token_ids)
        num_blocks = math.ceil(max_tokens / BLOCK_SIZE) + 1
        caches = allocate_kv_caches(self.model.config, num_blocks, BLOCK_SIZE, dtype, device,
                                    preferred_kv_layout(where, dtype))
        self.runner = ModelRunner(self.model, caches)
        self.block_table = tuple(range(num_blocks))

    def logits(self, token_ids: tuple[int, ...], start: int = 0) -> torch.Tensor:
        """float32 logits [len(token_ids), vocab] of token_ids at positions
        start.. (the positions before `start` are already in the cache)."""
        step = self.runner.prepare(ModelInput((SequenceInput(token_ids, start, self.block_table),)))
        with torch.inference_mode():
            hidden = self.model(step.input_ids, step.positions, step.attn, self.runner.kv_caches)  # [T, hidden]
            return self.model.compute_logits(hidden)  # [T, vocab]

    def greedy(self, prompt_ids: tuple[int, ...], max_new_tokens: int) -> tuple[tuple[int, ...], bool]:
        """The greedy continuation (EOS included when it stopped) and whether it stopped."""
        out: list[int] = []
        next_id = int(self.logits(prompt_ids)[-1].argmax())
        while True:
            out.append(next_id)
            if next_id in self.eos_ids:
                return tuple(out), True
            if len(out) >= max_new_tokens:
                return tuple(out), False
            next_id = int(self.logits((next_id,), start=len(prompt_ids) + len(out) - 1)[-1].argmax())

    def top1_and_logprobs(self, prompt_ids: tuple[int, ...], continuation: tuple[int, ...]
                          ) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """Teacher-forced over prompt + continuation: the argmax and the
        log-probability of each continuation token at its position."""
        logits = self.logits(prompt_ids + continuation)[len(prompt_ids) - 1: -1]  # [len(continuation), vocab]
        logprobs = torch.log_softmax(logits, dim=-1)  # [len(continuation), vocab]
        targets = torch.tensor(continuation, dtype=torch.int64).unsqueeze(1)  # [len(continuation), 1]
        chosen = logprobs.gather(1, targets.to(logprobs.device)).squeeze(1)  # [len(continuation)]
        return tuple(int(i) for i in logits.argmax(dim=-1)), tuple(float(x) for x in chosen)


def run_quality_check(serving_dir: Path, candidate_dir: Path, prompt_set: PromptSet,
                      thresholds: QualityThresholds, *, device: str = "cpu") -> QualityReport:
    serving_tokenizer = Tokenizer.from_pretrained(serving_dir)
    encoded = tuple(_encode(serving_tokenizer, spec) for spec in prompt_set.prompts)
    candidate_tokenizer = Tokenizer.from_pretrained(candidate_dir)
    if tuple(_encode(candidate_tokenizer, spec) for spec in prompt_set.prompts) != encoded:
        raise ValueError(f"{serving_dir} and {candidate_dir} tokenize the prompt set differently: "
                         "token-level quality scores need one tokenizer")
    max_tokens = max(len(e.prompt_ids) + max(prompt_set.max_new_tokens, len(e.reference_ids)) for e in encoded)

    serving = VersionModel(serving_dir, max_tokens, device=device)
    passes = [_serving_pass(serving, serving_tokenizer, e, prompt_set.max_new_tokens) for e in encoded]
    del serving  # one model in memory at a time

    candidate = VersionModel(candidate_dir, max_tokens, device=device)
    observations = []
    for e, seen in zip(encoded, passes):
        top1, _ = candidate.top1_and_logprobs(e.prompt_ids, seen.greedy)
        _, reference_lp = candidate.top1_and_logprobs(e.prompt_ids, e.reference_ids)
        ids, stopped = candidate.greedy(e.prompt_ids, prompt_set.max_new_tokens)
        observations.append(PromptObservation(
            e.spec.id, seen.greedy, top1, seen.reference_logprobs, reference_lp, seen.answer,
            Answer(candidate_tokenizer.decode(ids), stopped)))
    return score(prompt_set.prompts, tuple(observations), thresholds)


def _serving_pass(model: VersionModel, tokenizer: Tokenizer, e: EncodedPrompt, max_new_tokens: int) -> ServingPass:
    greedy, stopped = model.greedy(e.prompt_ids, max_new_tokens)
    _, reference_lp = model.top1_and_logprobs(e.prompt_ids, e.reference_ids)
    return ServingPass(greedy, reference_lp, Answer(tokenizer.decode(greedy), stopped))


def _encode(tokenizer: Tokenizer, spec: PromptSpec) -> EncodedPrompt:
    if tokenizer.has_chat_template:
        prompt_ids = tokenizer.apply_chat_template(spec.chat())
    else:  # a base model: the conversation as plain lines
        text = "\n".join(content for _, content in spec.messages) + "\n"
        prompt_ids = tokenizer.encode(text, add_special_tokens=True)
    reference_ids = tokenizer.encode(spec.reference)
    if not prompt_ids or not reference_ids:
        raise ValueError(f"prompt {spec.id!r} encodes to no tokens")
    return EncodedPrompt(spec, tuple(prompt_ids), tuple(reference_ids))
