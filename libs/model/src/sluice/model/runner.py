"""Runs one engine step on the model: flatten, forward, logits, sample.

The engine (block manager + iteration scheduler, elsewhere) decides what
runs; it hands the runner a ``ModelInput`` per step::

    seq A: prefill chunk  token_ids=[t4..t7]  start_position=4  sample=None
    seq B: decode         token_ids=[t12]     start_position=12 sample=SampleRequest(...)
    seq C: last chunk     token_ids=[t8..t9]  start_position=8  sample=SampleRequest(...)

    flattened input_ids: [ t4 t5 t6 t7 | t12 | t8 t9 ]
    positions:           [  4  5  6  7 |  12 |  8  9 ]
    query_start_loc:     [ 0,           4,    5,     7 ]
    seq_lens:            [ 8,           13,   10 ]
    logits rows:         hidden[4] (B's last token), hidden[6] (C's last token)

The runner owns the model and the KV cache tensors; it writes only the
slots the block tables name, and trusts the engine that those are the
sequence's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Sequence

import torch

from sluice.model.attention import AttentionBackend, AttentionMetadata
from sluice.model.kv_cache import KVCache, allocate_kv_caches
from sluice.model.llama import LlamaModel
from sluice.model.loader import load_llama
from sluice.model import yielding
from sluice.model.sampler import SampleRequest, Sampler
from sluice.model.small_step_threads import SmallStepThreads
from sluice.model.yielding import YieldCheck


@dataclass(slots=True, frozen=True)
class SequenceInput:
    """One sequence's work this step.

    token_ids: the tokens to run now (a prefill chunk, or the one decode token).
    start_position: position of token_ids[0] = tokens of this sequence already cached.
    block_table: cache block ids covering positions [0, start_position + len(token_ids)).
    sample: set when this step must produce the next token (last prefill chunk,
        or decode); None for an intermediate prefill chunk.
    """

    token_ids: Sequence[int]
    start_position: int
    block_table: Sequence[int]
    sample: SampleRequest | None = None


@dataclass(slots=True, frozen=True)
class ModelInput:
    sequences: tuple[SequenceInput, ...]
    # Return the float32 logits of the sampled rows too (tests, logprobs later).
    return_logits: bool = False


@dataclass(slots=True, frozen=True)
class ModelOutput:
    """sampled_token_ids: aligned with ModelInput.sequences, None where no sample.
    logits: [num_sampled, vocab] float32 in sequence order, when requested."""

    sampled_token_ids: tuple[int | None, ...]
    logits: torch.Tensor | None = None


@dataclass(slots=True, frozen=True)
class PreparedStep:
    """The flattened tensors of one step, on the model's device."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    attn: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampled] int64, rows of hidden to sample from
    sample_seq_indices: tuple[int, ...]  # which sequences those rows belong to


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[KVCache],
        *,
        sampler: Sampler | None = None,
        single_thread_step_tokens: int = 0,
    ) -> None:
        if not kv_caches or len(kv_caches) != len(model.layers):
            raise ValueError(f"need {len(model.layers)} KV caches, got {len(kv_caches)}")
        if single_thread_step_tokens < 0:
            raise ValueError(f"single_thread_step_tokens must be >= 0, got {single_thread_step_tokens}")
        # A step of at most this many tokens runs on one torch thread or on
        # all of them (the threads torch had when the runner was built),
        # whichever the runner measures faster per token lately; larger ones
        # on all (0: the runner leaves torch's thread count alone). Where
        # other processes share the cores, every parallel region of a small
        # step waits at its barrier for a thread that is off a core; a
        # prefill step's GEMMs are long enough to pay.
        self.small_step_threads = SmallStepThreads(single_thread_step_tokens, torch.get_num_threads())
        self.model = model
        self.kv_caches = kv_caches
        self.sampler = sampler or Sampler(model.config.eos_token_ids)
        self.device = kv_caches[0].key_cache.device
        self.block_size = kv_caches[0].block_size
        self.num_blocks = kv_caches[0].num_blocks

    @classmethod
    def from_pretrained(
        cls,
        model_dir: Path,
        *,
        num_blocks: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        attention_backend: AttentionBackend | None = None,
    ) -> "ModelRunner":
        model = load_llama(model_dir, dtype=dtype, device=device, attention_backend=attention_backend)
        caches = allocate_kv_caches(model.config, num_blocks, block_size, dtype, device)
        return cls(model, caches)

    def execute(self, batch: ModelInput, should_yield: YieldCheck | None = None) -> ModelOutput:
        """Run one step. With `should_yield`, raises StepYielded if it says
        yes before a layer or the LM head (sluice.model.yielding)."""
        if not batch.sequences:
            return ModelOutput(sampled_token_ids=(), logits=None)
        return self.run(batch, self.prepare(batch), should_yield)

    def run(self, batch: ModelInput, step: PreparedStep, should_yield: YieldCheck | None = None) -> ModelOutput:
        """Run a step `prepare` flattened (`execute` in two halves, so the
        next step's tensors can be built while this one runs)."""
        num_tokens = step.input_ids.shape[0]
        threads = self._set_threads(num_tokens)
        started_s = time.perf_counter()
        output = self._run(batch, step, should_yield)
        if threads:
            self.small_step_threads.observe(threads, num_tokens, time.perf_counter() - started_s)
        return output

    def _run(self, batch: ModelInput, step: PreparedStep, should_yield: YieldCheck | None) -> ModelOutput:
        with torch.inference_mode():
            hidden = self.model(step.input_ids, step.positions, step.attn, self.kv_caches, should_yield)
            # hidden: [T, hidden_size]
            sampled: list[int | None] = [None] * len(batch.sequences)
            if not step.sample_seq_indices:
                return ModelOutput(tuple(sampled), None)
            yielding.check(should_yield)  # the last one: sampling moves generator state
            rows = hidden[step.logits_indices]  # [num_sampled, hidden]
            requests = [batch.sequences[i].sample for i in step.sample_seq_indices]
            logits: torch.Tensor | None = None
            if not batch.return_logits and self.sampler.argmax_suffices(requests):  # type: ignore[arg-type]
                tokens = self.model.greedy_token_ids(rows).tolist()
            else:
                logits = self.model.compute_logits(rows)  # [num_sampled, vocab]
                tokens = self.sampler.sample(logits, requests)  # type: ignore[arg-type]
        for seq_index, token in zip(step.sample_seq_indices, tokens):
            sampled[seq_index] = token
        return ModelOutput(tuple(sampled), logits if batch.return_logits else None)

    def _set_threads(self, num_tokens: int) -> int:
        """The threads this step runs on; 0 where the runner leaves them alone."""
        if not self.small_step_threads.max_step_tokens:
            return 0  # the threads are whatever the process set, as without the rule
        threads = self.small_step_threads.threads_for(num_tokens)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return threads

    def prepare(self, batch: ModelInput) -> PreparedStep:
        """Flatten the batch into tensors. Loops per sequence, never per token."""
        seqs = batch.sequences
        self._validate(seqs)
        if all(len(s.token_ids) == 1 for s in seqs):
            return self._prepare_decode(seqs)
        return self._prepare_any(seqs)

    def _prepare_any(self, seqs: Sequence[SequenceInput]) -> PreparedStep:
        bs = self.block_size
        q_lens = torch.tensor([len(s.token_ids) for s in seqs], dtype=torch.int64)  # [S]
        starts = torch.tensor([s.start_position for s in seqs], dtype=torch.int64)  # [S]
        query_start_loc = torch.zeros(len(seqs) + 1, dtype=torch.int64)  # [S + 1]
        torch.cumsum(q_lens, dim=0, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        seq_lens = starts + q_lens  # [S]

        block_tables = _padded_block_tables(seqs)  # [S, max_blocks]

        input_ids = torch.tensor(list(chain.from_iterable(s.token_ids for s in seqs)), dtype=torch.int64)
        seq_of_token = torch.repeat_interleave(torch.arange(len(seqs)), q_lens)  # [T]
        offset_in_seq = torch.arange(num_tokens) - query_start_loc[:-1][seq_of_token]  # [T]
        positions = starts[seq_of_token] + offset_in_seq  # [T]
        block_of_token = block_tables[seq_of_token, positions // bs].long()  # [T]
        slot_mapping = block_of_token * bs + positions % bs  # [T]

        sample_seq_indices = tuple(i for i, s in enumerate(seqs) if s.sample is not None)
        logits_indices = query_start_loc[1:][list(sample_seq_indices)] - 1  # [num_sampled]

        dev = self.device
        attn = AttentionMetadata(
            slot_mapping=slot_mapping.to(dev),
            block_tables=block_tables.to(dev),
            seq_lens=seq_lens.to(dev, torch.int32),
            query_start_loc=query_start_loc.to(dev, torch.int32),
            max_query_len=int(q_lens.max()),
            max_seq_len=int(seq_lens.max()),
        )
        return PreparedStep(
            input_ids=input_ids.to(dev),
            positions=positions.to(dev),
            attn=attn,
            logits_indices=logits_indices.to(dev),
            sample_seq_indices=sample_seq_indices,
        )

    def _prepare_decode(self, seqs: Sequence[SequenceInput]) -> PreparedStep:
        """`prepare` for a step of one token per sequence (most steps): the
        same tensors, each built once from Python lists, where the general
        path derives them with ~15 small tensor ops. On a CPU replica beside
        its event loop every op is a GIL hand-off, and this path is a third
        of the time."""
        bs = self.block_size
        positions = [s.start_position for s in seqs]
        block_tables = _padded_block_tables(seqs)  # [S, max_blocks]
        sample_seq_indices = tuple(i for i, s in enumerate(seqs) if s.sample is not None)
        dev = self.device
        attn = AttentionMetadata(
            slot_mapping=torch.tensor([s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, positions)],
                                      dtype=torch.int64).to(dev),
            block_tables=block_tables.to(dev),
            seq_lens=torch.tensor([p + 1 for p in positions], dtype=torch.int32).to(dev),
            query_start_loc=torch.arange(len(seqs) + 1, dtype=torch.int32).to(dev),
            max_query_len=1,
            max_seq_len=max(positions) + 1,
        )
        return PreparedStep(
            input_ids=torch.tensor([s.token_ids[0] for s in seqs], dtype=torch.int64).to(dev),
            positions=torch.tensor(positions, dtype=torch.int64).to(dev),
            attn=attn,
            logits_indices=torch.tensor(sample_seq_indices, dtype=torch.int64).to(dev),
            sample_seq_indices=sample_seq_indices,
        )

    def fill_tokens(self, step: PreparedStep, rows: Sequence[int], token_ids: Sequence[int]) -> None:
        """Set the input ids of flattened `rows` (tokens not known when the
        step was prepared: sampled by the step before it)."""
        vocab = self.model.config.vocab_size
        if len(rows) != len(token_ids):
            raise ValueError(f"{len(rows)} rows but {len(token_ids)} token ids")
        if not rows:
            return
        if min(token_ids) < 0 or max(token_ids) >= vocab:
            raise ValueError(f"token id outside [0, {vocab})")
        if min(rows) < 0 or max(rows) >= step.input_ids.shape[0]:
            raise ValueError(f"row outside [0, {step.input_ids.shape[0]})")
        step.input_ids[torch.tensor(rows, dtype=torch.int64, device=self.device)] = torch.tensor(
            token_ids, dtype=torch.int64).to(self.device)

    def _validate(self, seqs: Sequence[SequenceInput]) -> None:
        max_pos = self.model.config.max_position_embeddings
        vocab = self.model.config.vocab_size
        for i, s in enumerate(seqs):
            n = len(s.token_ids)
            end = s.start_position + n
            if n == 0 or s.start_position < 0:
                raise ValueError(f"sequence {i}: empty token_ids or negative start_position")
            if end > max_pos:
                raise ValueError(
                    f"sequence {i}: position {end - 1} beyond max_position_embeddings {max_pos}"
                )
            if len(s.block_table) * self.block_size < end:
                raise ValueError(
                    f"sequence {i}: {len(s.block_table)} blocks of {self.block_size} "
                    f"cannot hold {end} tokens"
                )
            if s.block_table and not 0 <= min(s.block_table) <= max(s.block_table) < self.num_blocks:
                raise ValueError(f"sequence {i}: block id outside [0, {self.num_blocks})")
            if min(s.token_ids) < 0 or max(s.token_ids) >= vocab:
                raise ValueError(f"sequence {i}: token id outside [0, {vocab})")


def _padded_block_tables(seqs: Sequence[SequenceInput]) -> torch.Tensor:
    """int32 [S, max_blocks]: each sequence's block table, rows padded with 0.
    One tensor from padded rows: a row-by-row copy costs a tensor per sequence."""
    max_blocks = max(len(s.block_table) for s in seqs)
    return torch.tensor([[*s.block_table, *[0] * (max_blocks - len(s.block_table))] for s in seqs],
                        dtype=torch.int32)
