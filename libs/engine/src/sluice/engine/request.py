"""What the engine core knows about a request: token ids and stop rules.

Sampling parameters travel opaquely (`sampling`) because only the model
runner interprets them; the core decides when a sequence is finished.
"""

import enum
from dataclasses import dataclass
from typing import Any


class ServiceClass(enum.IntEnum):
    # Lower value is served first within a step.
    INTERACTIVE = 0
    BATCH = 1


class FinishReason(enum.Enum):
    STOP = "stop"          # EOS or a stop token id
    LENGTH = "length"      # max output tokens or the model's context
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class StopPolicy:
    max_output_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    min_tokens: int = 0  # EOS and stop ids do not end the sequence before this

    def finish_reason(self, token_id: int, num_output_tokens: int) -> FinishReason | None:
        """Why the sequence ends after emitting `token_id` as output number
        `num_output_tokens` (1-based), or None if it goes on."""
        if num_output_tokens >= self.min_tokens:
            if token_id in self.stop_token_ids:
                return FinishReason.STOP
            if token_id in self.eos_token_ids and not self.ignore_eos:
                return FinishReason.STOP
        if num_output_tokens >= self.max_output_tokens:
            return FinishReason.LENGTH
        return None


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    stop: StopPolicy
    service_class: ServiceClass = ServiceClass.INTERACTIVE
    fairness_key: str = ""  # opaque tenant key; prefill rotates across keys
    cache_salt: str = ""    # prefix-cache scope (block_hash.root_block_hash); "" = shared
    sampling: Any = None    # interpreted by the model runner only
    arrival_s: float = 0.0
    # A health probe (the replica's canary): admitted ahead of every waiting
    # request and past the sequence-slot limit, taking a block from the
    # newest running sequence if none is free, and never counted as
    # interactive work. A canary that queued behind real work would report
    # a busy replica as wedged.
    probe: bool = False
    # Prompt tokens whose KV another instance computed and transferred (the
    # decode side of a disaggregated deployment, as vLLM's KV connectors
    # do): admitted as computed, like a prefix-cache hit, into freshly
    # allocated blocks. At most prompt length - 1, so the last prompt token
    # is computed here and samples the next. Claimed at first admission
    # only: a preempted sequence's blocks, and the KV in them, are gone.
    external_prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")
        if self.stop.max_output_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_output_tokens must be >= 1")
        if not 0 <= self.external_prefix_tokens < len(self.prompt_token_ids):
            raise ValueError(f"request {self.request_id}: external_prefix_tokens must be in "
                             f"[0, prompt length {len(self.prompt_token_ids)}), got {self.external_prefix_tokens}")
