"""A request's mutable progress inside the engine core.

Only `IterationScheduler` writes these fields; everyone else reads outputs.
"""

import enum
from dataclasses import dataclass, field

from sluice.engine.request import EngineRequest, FinishReason


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class Sequence:
    request: EngineRequest
    output_token_ids: list[int] = field(default_factory=list)
    # Tokens whose K/V are in the cache. The sequence catches up to
    # num_tokens step by step; a decode is simply num_tokens - 1 computed.
    num_computed_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.request.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def token_ids(self, start: int, stop: int) -> tuple[int, ...]:
        prompt = self.request.prompt_token_ids
        if stop <= len(prompt):
            return prompt[start:stop]
        outputs = self.output_token_ids
        head = prompt[start:] if start < len(prompt) else ()
        tail_start = max(start - len(prompt), 0)
        return tuple(head) + tuple(outputs[tail_start : stop - len(prompt)])
