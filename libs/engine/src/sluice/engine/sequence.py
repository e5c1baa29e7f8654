"""A request's mutable progress inside the engine core.

Only `IterationScheduler` writes these fields; everyone else reads outputs.
"""

import enum
from dataclasses import dataclass, field

from sluice.engine.block_hash import BlockHash, extend_block_hashes, root_block_hash
from sluice.engine.request import EngineRequest, FinishReason


# The id of a token a step in flight samples, in a chunk planned before it is
# known (a decode right behind its sampling step). Never a vocabulary id.
PLACEHOLDER_TOKEN_ID = -1


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# eq=False: sequences are compared by identity (queues remove them by it).
@dataclass(slots=True, eq=False)
class Sequence:
    request: EngineRequest
    # Order of arrival at this engine: ranks sequences for the waiting line
    # and for preemption (newest first), and never changes on re-admission.
    arrival_index: int
    block_size_tokens: int
    # Arrival at this engine, on the scheduler's clock: how long it has
    # waited decides whether an interactive sequence may preempt batch ones.
    arrival_s: float = 0.0
    # Prompt then outputs, one list so block hashing can slice it cheaply.
    all_token_ids: list[int] = field(init=False)
    # Hashes of every full block of all_token_ids (computed or not), chained
    # from the root of the request's cache scope.
    block_hashes: list[BlockHash] = field(default_factory=list)
    _root_hash: BlockHash = field(init=False, repr=False)
    # Tokens whose K/V are in the cache or are written by a step already
    # planned (a plan counts its chunks as computed when it is made, so the
    # next plan can be made while it runs). The sequence catches up to
    # num_tokens step by step; a decode is simply num_tokens - 1 computed.
    num_computed_tokens: int = 0
    # Tokens a planned step samples that are not known yet (update brings
    # them): at most one per plan in flight. They count in num_tokens, so
    # the next plan decodes them; their ids go to the runner as
    # PLACEHOLDER_TOKEN_ID, filled in from the step that samples them.
    num_pending_tokens: int = 0
    # The pending token is certainly its last (the length limit): no step
    # decodes it; update ends the sequence once the token is known.
    final_token_pending: bool = False
    # Prompt tokens found in the prefix cache at first admission (billing).
    num_cached_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    # Admitted with more than the long-prefill threshold left to compute:
    # every chunk of this prefill, the short tail included, takes one of a
    # step's long-prefill slots (else a tail beside the next prompt's first
    # chunk doubles the step).
    long_prefill: bool = False
    # Prompt tokens whose K/V arrive from another instance (the request's
    # external_prefix_tokens) and are not computed here; zeroed when the
    # sequence loses its blocks, since the transferred K/V went with them.
    num_external_tokens: int = field(init=False)
    # len(request.prompt_token_ids), kept: read for every output of every step.
    num_prompt_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.request.prompt_token_ids)
        self.num_prompt_tokens = len(self.all_token_ids)
        self.num_external_tokens = self.request.external_prefix_tokens
        self._root_hash = root_block_hash(self.request.cache_salt)
        extend_block_hashes(self.block_hashes, self.all_token_ids, self.block_size_tokens, self._root_hash)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids) + self.num_pending_tokens

    @property
    def num_known_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def num_output_tokens(self) -> int:  # known and pending
        return self.num_tokens - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:  # the known ones
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_long_prefilling(self) -> bool:
        """Part-way through a long prefill (more than one token left: one is a decode)."""
        return self.long_prefill and self.num_uncomputed_tokens > 1

    def token_ids(self, start: int, stop: int) -> tuple[int, ...]:
        known = self.all_token_ids[start:stop]
        if stop - start > len(known):  # the pending tokens' ids come from the runner
            known += [PLACEHOLDER_TOKEN_ID] * (stop - start - len(known))
        return tuple(known)

    def append_output(self, token_id: int) -> None:
        """A sampled token is known: the oldest pending one, if any."""
        if self.num_pending_tokens:
            self.num_pending_tokens -= 1
        tokens = self.all_token_ids
        tokens.append(token_id)
        if len(tokens) >= (len(self.block_hashes) + 1) * self.block_size_tokens:  # a block just filled
            extend_block_hashes(self.block_hashes, tokens, self.block_size_tokens, self._root_hash)
