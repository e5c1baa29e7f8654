"""One step's plan under construction, and how long a prefill chunk may be.

The iteration scheduler fills a `StepBuilder` in priority order; the
builder keeps the token budget, the long-prefill slots and the chunk cap,
and lets preemption take a chunk back out.
"""

import math
from dataclasses import dataclass, field

from sluice.engine.plan import ScheduledChunk


@dataclass(slots=True)
class StepBuilder:
    """The plan under construction; preemption can take a chunk back out."""

    budget_tokens: int
    chunks: dict[str, ScheduledChunk] = field(default_factory=dict)
    preempted_ids: list[str] = field(default_factory=list)
    admitted_ids: set[str] = field(default_factory=set)  # admitted from the waiting line in this step
    chunk_cap_tokens: int = 0  # 0 = a prefill may take the whole budget
    depth_scale_tokens: int = 0  # see SchedulerConfig.prefill_depth_scale_tokens
    long_slots: int = 0        # chunks left this step for long prefills
    first_chunks: int = 0      # interactive short prompts admitted this step
    batch_held: bool = False   # a first-token step: no batch work in it

    def take(self, uncomputed_tokens: int, long: bool, start_tokens: int = 0, cap_tokens: int = 0) -> int:
        """Tokens of a prefill to schedule now; 0 = none this step. Any
        chunk is at most the cap, or `cap_tokens` when that is smaller
        (smaller still the deeper it starts, at `start_tokens`); a `long`
        prefill also needs one of the step's long-prefill slots."""
        take = min(uncomputed_tokens, self.budget_tokens)
        if not self.chunk_cap_tokens:
            return take
        if long and not self.long_slots:
            return 0
        cap = min(self.chunk_cap_tokens, cap_tokens) if cap_tokens else self.chunk_cap_tokens
        return min(take, chunk_at_depth(cap, start_tokens, self.depth_scale_tokens))

    def claim(self, long: bool) -> None:
        """A chunk of a prefill was scheduled."""
        if self.chunk_cap_tokens and long:
            self.long_slots -= 1

    def add(self, chunk: ScheduledChunk) -> None:
        self.chunks[chunk.request_id] = chunk
        self.budget_tokens -= len(chunk.token_ids)

    def drop(self, request_id: str) -> None:
        chunk = self.chunks.pop(request_id, None)
        if chunk is not None:
            self.budget_tokens += len(chunk.token_ids)


def chunk_at_depth(cap_tokens: int, start_tokens: int, depth_scale_tokens: int) -> int:
    """The largest chunk starting at `start_tokens` whose cost
    n x (1 + (start + n/2) / scale) is within `cap_tokens`; at least an
    eighth of the cap, so a near-context prompt still advances in chunks
    worth a step."""
    if not depth_scale_tokens:
        return cap_tokens
    depth = start_tokens / depth_scale_tokens + 1.0
    n = depth_scale_tokens * (math.sqrt(depth * depth + 2.0 * cap_tokens / depth_scale_tokens) - depth)
    return max(int(n), max(cap_tokens // 8, 1))
