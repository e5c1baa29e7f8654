"""What one request reserves, in KV blocks.

    reserved tokens = prompt + bounded output x (1 + buffer_fraction), at most prompt + room

The bounded output is `max_tokens` when the client gave it, otherwise the
class's default allowance: reserving the whole remaining context for every
request that omits max_tokens would make a pool look full at a fraction of
its real load (the engine still stops a sequence at the context length, and
preempts by recompute if a sequence outgrows what was reserved). The buffer
covers the unknown: a sequence that runs past its allowance.
"""

from dataclasses import dataclass

from sluice.admission.kv import blocks_for


@dataclass(frozen=True, slots=True)
class ReservationPolicy:
    # Output tokens reserved when the client gave no max_tokens. Chats are
    # short; batch items are often summaries or extractions of a long input.
    default_output_tokens_interactive: int = 512
    default_output_tokens_batch: int = 1024
    # Extra on top of the bounded output (0.1 = 10% more), never past the
    # context.
    buffer_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.default_output_tokens_interactive < 1 or self.default_output_tokens_batch < 1:
            raise ValueError("default output allowances must be >= 1 token")
        if not 0.0 <= self.buffer_fraction <= 4.0:
            raise ValueError("buffer_fraction must be within [0, 4]")


@dataclass(frozen=True, slots=True)
class KVReservation:
    output_tokens: int  # the bounded output this reservation covers
    tokens: int         # prompt + output + buffer
    blocks: int


def bounded_output_tokens(
    policy: ReservationPolicy, requested_output_tokens: int, room_tokens: int, is_batch: bool
) -> int:
    """`requested_output_tokens` 0 means the client gave no max_tokens;
    `room_tokens` is what the context leaves after the prompt."""
    if requested_output_tokens:
        return min(requested_output_tokens, room_tokens)
    default = policy.default_output_tokens_batch if is_batch else policy.default_output_tokens_interactive
    return min(default, room_tokens)


def reserve_for(
    policy: ReservationPolicy,
    prompt_tokens: int,
    requested_output_tokens: int,
    room_tokens: int,
    block_size_tokens: int,
    is_batch: bool,
) -> KVReservation:
    output = bounded_output_tokens(policy, requested_output_tokens, room_tokens, is_batch)
    buffered = output + int(output * policy.buffer_fraction)
    tokens = prompt_tokens + min(buffered, max(room_tokens, output))
    return KVReservation(output_tokens=output, tokens=tokens, blocks=blocks_for(tokens, block_size_tokens))
