"""What one engine step runs, and what it produced."""

from dataclasses import dataclass
from typing import Any

from sluice.engine.request import FinishReason


# ScheduledChunk and RequestOutput are built once per sequence per step (the
# simulator builds millions): not frozen, since a frozen dataclass's
# __init__ sets each field through object.__setattr__, ~5x the cost. Treat
# them as read-only all the same.
@dataclass(slots=True)
class ScheduledChunk:
    """Tokens of one sequence computed this step: a decode token, a prefill
    chunk, or a recompute after preemption; the runner does not care which.
    A decode planned while the step that samples its token is in flight
    carries PLACEHOLDER_TOKEN_ID (sluice.engine.sequence): the runner takes
    the id from that step's sample."""

    request_id: str
    token_ids: tuple[int, ...]
    start_position: int           # position of token_ids[0] in the sequence
    block_table: tuple[int, ...]  # covers start_position + len(token_ids) tokens
    samples: bool                 # this chunk reaches the end: sample one token
    num_output_tokens: int        # produced before this chunk's sample, known or pending (min_tokens)
    sampling: Any = None          # the request's opaque sampling parameters


@dataclass(frozen=True, slots=True)
class StepPlan:
    chunks: tuple[ScheduledChunk, ...]
    preempted_ids: tuple[str, ...] = ()
    now_s: float = 0.0
    # The runner may give this step up part-way for a chat that arrives
    # meanwhile (SchedulerConfig.yield_to_chats); given up, it is never
    # passed to `update`, and the next `schedule` plans its work again.
    yields_to_chats: bool = False
    # Which plan of its scheduler this is (from 1; 0 = an empty plan, never
    # updated): plans are updated in the order they were made.
    index: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(len(chunk.token_ids) for chunk in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    new_token_ids: tuple[int, ...]
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_output_tokens: int

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
