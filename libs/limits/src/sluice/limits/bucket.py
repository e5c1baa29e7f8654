r"""Token-bucket arithmetic. Pure: no I/O, no asyncio, the clock passed in.

A bucket's capacity is the per-minute limit and it refills continuously at
limit/60 per second, so a tenant may burst up to one minute's allowance and
then sustains exactly the limit (OpenAI's limiter behaves the same way: a
60,000 TPM key may spend 1,000 tokens every second, or 60,000 at once).

    tokens
    limit ┤‾‾‾‾\          ___/‾‾‾‾‾   refill slope = limit / 60 per second
          │     \     ___/
          │      \___/                take() drops it by `amount`
        0 ┼───────────────────────    settle() with a larger actual count
          │                           may push it below 0: a debt
   -limit ┤ (floor on debt)

The Redis limiter repeats these formulas in Lua (`limiter.py`); the shared
integration suite keeps the two in step, so change both together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Roughly four characters of English text per BPE token: OpenAI's own rule
# of thumb, and what its rate limiter estimates from before tokenizing.
# The gateway knows no tokenizer (DESIGN: tokenizing is the router's job),
# so it reserves from the prompt's size; settle() corrects the estimate with
# the exact count when the request ends. Text that tokenizes denser (CJK,
# ~1 token per character) is under-estimated and repaid as debt at settle.
CHARS_PER_TOKEN = 4


@dataclass(slots=True, frozen=True)
class BucketState:
    """Tokens in a bucket as of `updated_at_s` (seconds on the caller's clock).

    `tokens` may be negative (a debt left by settle()); it never exceeds the
    limit after refill()."""

    tokens: float
    updated_at_s: float


@dataclass(slots=True, frozen=True)
class TakeResult:
    """The answer to try_take().

    allowed: the tokens were taken; `state` is the bucket after taking.
    Refused: `state` is the refilled bucket, nothing taken; retry_after_s is
    how long until the bucket will hold `amount` (at the refill rate, from
    the real level, debt included). exceeds_capacity: the amount is larger
    than the whole bucket, so no wait would ever satisfy it; retry_after_s
    is then math.inf.
    """

    allowed: bool
    state: BucketState
    retry_after_s: float
    exceeds_capacity: bool = False


def full_bucket(limit_per_min: int, now_s: float) -> BucketState:
    """A bucket nobody has drawn from (or idle long enough to be full again)."""
    return BucketState(tokens=float(limit_per_min), updated_at_s=now_s)


def refill(state: BucketState, limit_per_min: int, now_s: float) -> BucketState:
    """The bucket at `now_s`: refilled at limit/60 per second, capped at the limit.

    A clock that reads earlier than the last update (another gateway's clock,
    a step backwards) adds nothing and keeps the later stamp, so time is
    never counted twice. A lowered limit clamps the level at once.
    """
    elapsed_s = max(0.0, now_s - state.updated_at_s)
    # Same operation order as the Lua copy so both round identically.
    tokens = min(float(limit_per_min), state.tokens + elapsed_s * limit_per_min / 60.0)
    return BucketState(tokens=tokens, updated_at_s=max(now_s, state.updated_at_s))


def seconds_until(state: BucketState, amount: float, limit_per_min: int) -> float:
    """Seconds from `state.updated_at_s` until the bucket holds `amount`."""
    missing = amount - state.tokens
    if missing <= 0:
        return 0.0
    return missing * 60.0 / limit_per_min


def try_take(state: BucketState, amount: int, limit_per_min: int, now_s: float) -> TakeResult:
    """Take `amount` tokens if the bucket holds them now, else say when it will.

    A request larger than the limit is refused outright (exceeds_capacity),
    never allowed when the bucket happens to be full: OpenAI refuses
    requests above the TPM limit the same way, and allowing one would let a
    single request spend more than a minute's allowance.
    """
    if amount < 0:
        raise ValueError(f"amount must be >= 0, got {amount}")
    current = refill(state, limit_per_min, now_s)
    if amount > limit_per_min:
        return TakeResult(False, current, math.inf, exceeds_capacity=True)
    if current.tokens >= amount:
        taken = BucketState(tokens=current.tokens - amount, updated_at_s=current.updated_at_s)
        return TakeResult(True, taken, 0.0)
    return TakeResult(False, current, seconds_until(current, amount, limit_per_min))


def credit(state: BucketState, delta: float, limit_per_min: int, now_s: float) -> BucketState:
    """Give back `delta` tokens (or take -delta more) after refilling.

    A refund never lifts the bucket above the limit. A charge may drive it
    negative: the tokens were really spent, and a debt that the refill must
    pay off first keeps a tenant whose prompts are under-estimated at its
    limit over time instead of above it. The debt is floored at one minute's
    allowance so a single wildly wrong estimate delays the tenant by at most
    about two minutes rather than indefinitely.
    """
    current = refill(state, limit_per_min, now_s)
    tokens = min(float(limit_per_min), max(-float(limit_per_min), current.tokens + delta))
    return BucketState(tokens=tokens, updated_at_s=current.updated_at_s)


def idle_expiry_s(state: BucketState, limit_per_min: int) -> float:
    """Seconds after `state.updated_at_s` at which the bucket is full again.

    From then on a stored bucket and a missing one mean the same thing, so
    a store may forget it (Redis keys expire after this long idle)."""
    return seconds_until(state, float(limit_per_min), limit_per_min)


def estimate_tokens(prompt_chars: int, max_output_tokens: int) -> int:
    """Tokens to reserve before the exact count is known.

    Prompt: ceil(chars / CHARS_PER_TOKEN) (see CHARS_PER_TOKEN for why a
    size-based guess). Output: the request's bound (max_tokens, or the
    default the gateway applies), since a generation may run to it; most
    stop earlier and settle() refunds the rest.
    """
    if prompt_chars < 0 or max_output_tokens < 0:
        raise ValueError(
            f"prompt_chars and max_output_tokens must be >= 0, got {prompt_chars}, {max_output_tokens}"
        )
    return -(-prompt_chars // CHARS_PER_TOKEN) + max_output_tokens
