"""The iteration scheduler: which tokens run in the next model step.

One algorithm, no phases. Every sequence catches its computed tokens up to
its length under a per-step token budget:

  1. one token for every running sequence that is decoding (protects ITL);
  2. the rest of the budget goes to prefill chunks: running sequences that
     are part-way through their prompt, then waiting ones, interactive before
     batch, oldest first;
  3. when KV blocks run out for a running sequence, the least important
     running sequence (batch before interactive, newest first) is preempted
     by recompute: its blocks are freed and it goes back to the head of the
     waiting line with its outputs kept.

`schedule(now_s)` returns a frozen `StepPlan`; `update(plan, sampled)`
applies the runner's sampled tokens and returns per-request outputs.
"""

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.engine.block_manager import BlockManager
from sluice.engine.plan import RequestOutput, ScheduledChunk, StepPlan
from sluice.engine.request import EngineRequest, FinishReason
from sluice.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    # Tokens per model step. Bigger steps prefill faster but every decode in
    # the batch waits for the whole step: this bounds inter-token latency.
    max_num_batched_tokens: int = 512
    # Sequences resident at once; bounds the decode batch and runner buffers.
    max_num_seqs: int = 128
    max_model_len_tokens: int = 4096

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")


class IterationScheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self._sequences: dict[str, Sequence] = {}
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []  # in admission order
        self.num_preemptions_total = 0

    # -- requests in and out -------------------------------------------------

    def add(self, request: EngineRequest) -> None:
        if request.request_id in self._sequences:
            raise ValueError(f"duplicate request id {request.request_id}")
        total = len(request.prompt_token_ids) + request.stop.max_output_tokens
        if self.blocks.blocks_for(min(total, self.config.max_model_len_tokens)) > self.blocks.num_blocks:
            raise ValueError(f"request {request.request_id} can never fit in the KV cache")
        sequence = Sequence(request)
        self._sequences[request.request_id] = sequence
        self._waiting.append(sequence)

    def cancel(self, request_id: str) -> bool:
        """Forget the request; its blocks are freed at once. False if unknown."""
        sequence = self._sequences.pop(request_id, None)
        if sequence is None:
            return False
        self._retire(sequence, FinishReason.CANCELLED)
        return True

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def has_work(self) -> bool:
        return bool(self._running or self._waiting)

    # -- one step ------------------------------------------------------------

    def schedule(self, now_s: float) -> StepPlan:
        chunks: dict[str, ScheduledChunk] = {}
        preempted: list[str] = []

        decoding = [s for s in self._running if s.num_uncomputed_tokens == 1]
        prefilling = [s for s in self._running if s.num_uncomputed_tokens > 1]
        for sequence in decoding + prefilling:
            # Recomputed each time: a preemption below may return a victim's tokens.
            budget = self.config.max_num_batched_tokens - sum(len(c.token_ids) for c in chunks.values())
            if budget == 0:
                break
            if sequence.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            chunk = self._grow_running(sequence, budget, chunks, preempted)
            if chunk is not None:
                chunks[sequence.request_id] = chunk
        budget = self.config.max_num_batched_tokens - sum(len(c.token_ids) for c in chunks.values())

        while budget > 0 and self._waiting and len(self._running) < self.config.max_num_seqs:
            sequence = self._next_waiting()
            chunk = self._chunk(sequence, budget)
            if chunk is None:
                break  # no blocks; waiting requests never preempt running ones
            self._waiting.remove(sequence)
            sequence.status = SequenceStatus.RUNNING
            self._running.append(sequence)
            chunks[sequence.request_id] = chunk
            budget -= len(chunk.token_ids)

        return StepPlan(tuple(chunks.values()), tuple(preempted), now_s)

    def update(self, plan: StepPlan, sampled: Mapping[str, int]) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        for chunk in plan.chunks:
            sequence = self._sequences.get(chunk.request_id)
            if sequence is None or sequence.status is not SequenceStatus.RUNNING:
                continue  # cancelled while the step ran
            sequence.num_computed_tokens += len(chunk.token_ids)
            if not chunk.samples:
                continue
            token_id = sampled[chunk.request_id]
            sequence.output_token_ids.append(token_id)
            reason = sequence.request.stop.finish_reason(token_id, len(sequence.output_token_ids))
            if reason is None and sequence.num_tokens >= self.config.max_model_len_tokens:
                reason = FinishReason.LENGTH
            if reason is not None:
                del self._sequences[sequence.request_id]
                self._retire(sequence, reason)
            outputs.append(self._output(sequence, (token_id,)))
        return outputs

    # -- internals -----------------------------------------------------------

    def _next_waiting(self) -> Sequence:
        # Interactive before batch; FIFO within a class (preempted sequences
        # were put back at the head, so they keep their place).
        return min(self._waiting, key=lambda s: s.request.service_class)

    def _chunk(self, sequence: Sequence, budget: int) -> ScheduledChunk | None:
        start = sequence.num_computed_tokens
        take = min(sequence.num_uncomputed_tokens, budget)
        kv = self.blocks.allocate(sequence.request_id, start + take)
        if kv is None:
            return None
        stop = start + take
        return ScheduledChunk(
            request_id=sequence.request_id,
            token_ids=sequence.token_ids(start, stop),
            start_position=start,
            block_table=kv.block_ids,
            samples=stop == sequence.num_tokens,
            num_output_tokens=len(sequence.output_token_ids),
            sampling=sequence.request.sampling,
        )

    def _grow_running(
        self, sequence: Sequence, budget: int, chunks: dict[str, ScheduledChunk], preempted: list[str]
    ) -> ScheduledChunk | None:
        while True:
            chunk = self._chunk(sequence, budget)
            if chunk is not None:
                return chunk
            victim = self._preemption_victim()
            chunks.pop(victim.request_id, None)
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is sequence:
                return None

    def _preemption_victim(self) -> Sequence:
        # Batch before interactive, then the most recently admitted.
        ranked = sorted(enumerate(self._running), key=lambda p: (p[1].request.service_class, p[0]))
        return ranked[-1][1]

    def _preempt(self, sequence: Sequence) -> None:
        self.blocks.free(sequence.request_id)
        self._running.remove(sequence)
        sequence.status = SequenceStatus.WAITING
        sequence.num_computed_tokens = 0
        sequence.num_preemptions += 1
        self.num_preemptions_total += 1
        self._waiting.appendleft(sequence)

    def _retire(self, sequence: Sequence, reason: FinishReason) -> None:
        self.blocks.free(sequence.request_id)
        if sequence.status is SequenceStatus.RUNNING:
            self._running.remove(sequence)
        elif sequence.status is SequenceStatus.WAITING:
            self._waiting.remove(sequence)
        sequence.status = SequenceStatus.FINISHED
        sequence.finish_reason = reason

    def _output(self, sequence: Sequence, new_token_ids: tuple[int, ...]) -> RequestOutput:
        return RequestOutput(
            request_id=sequence.request_id,
            new_token_ids=new_token_ids,
            finish_reason=sequence.finish_reason,
            num_prompt_tokens=len(sequence.request.prompt_token_ids),
            num_cached_tokens=0,
            num_output_tokens=len(sequence.output_token_ids),
        )
