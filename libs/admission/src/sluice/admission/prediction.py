"""When would a request start, and when should a refused one come back?

The pool's capacity is KV blocks and sequence seats. A request starts when
the blocks and seats free now, plus those the running work releases as it
finishes, cover it and everything queued ahead of it:

    time ──▶      now        f1      f2        f3
    running       ████████████│       │         │      expected finish of each
    freed                    +b1     +b2       +b3     (blocks, one seat each)
    needed        ahead + own ─────────────────▲       start = first time freed >= needed

Work that is still short after every running request has finished drains at
the pool's throughput (all its blocks turned over once per mean service
time). Expected finishes come from measured service times (see
`ServiceTimeEstimate`), never from a constant, and the prediction only grows
with the work ahead (tests check monotonicity).
"""

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RunningWork:
    expected_finish_s: float
    kv_blocks: int


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    total_kv_blocks: int
    total_seats: int
    free_kv_blocks: int  # unreserved now (may be negative when overbooked)
    free_seats: int


@dataclass(frozen=True, slots=True)
class WorkAhead:
    kv_blocks: int  # queued ahead, plus the request itself
    seqs: int


def predict_start_delay_s(
    now_s: float,
    capacity: PoolCapacity,
    needed: WorkAhead,
    running: Iterable[RunningWork],
    mean_service_s: float,
) -> float:
    """Seconds from `now_s` until `needed` fits in the pool."""
    short_blocks = needed.kv_blocks - capacity.free_kv_blocks
    short_seats = needed.seqs - capacity.free_seats
    if short_blocks <= 0 and short_seats <= 0:
        return 0.0
    at_s = now_s
    for work in sorted(running, key=lambda w: w.expected_finish_s):
        at_s = max(at_s, work.expected_finish_s)
        short_blocks -= work.kv_blocks
        short_seats -= 1
        if short_blocks <= 0 and short_seats <= 0:
            return at_s - now_s
    # Past the running work: the queued work ahead turns the pool over.
    turnovers = max(
        max(short_blocks, 0) / max(capacity.total_kv_blocks, 1),
        max(short_seats, 0) / max(capacity.total_seats, 1),
    )
    return at_s - now_s + turnovers * mean_service_s


@dataclass(slots=True)
class ServiceTimeEstimate:
    """Measured seconds a dispatched request takes: to its first token
    (queueing on the replica + prefill) and per output token after it.

    Exponentially smoothed over finished requests; `seconds_per_output_token`
    starts from the replicas' reported step time (one token per running
    sequence per step) until the first request finishes, and from
    `prior_seconds_per_output_token` before any replica has stepped. Only the
    scheduler service writes it (on Started and Release).
    """

    prior_seconds_per_output_token: float = 0.05
    prior_first_token_s: float = 0.2
    smoothing: float = 0.1  # weight of the newest sample (~the last 10 requests)
    seconds_per_output_token: float | None = None
    first_token_s: float | None = None
    # Output tokens a finished request generated, smoothed: what the pool
    # turns over in one mean service time (independent of what is queued,
    # so that more work ahead can only push a prediction later).
    output_tokens: float | None = None
    # Seconds of the pool's long-prefill lane a long prompt takes per prompt
    # token, from dispatch to its first token, smoothed over long prompts
    # (kept apart from first_token_s: one 32K prompt would swamp the chats'
    # figure). None until a long prompt started: the lane then adds nothing.
    long_prefill_s_per_token: float | None = None

    def observe_long_prefill(self, seconds: float, prompt_tokens: int) -> None:
        if prompt_tokens > 0:
            per_token = max(seconds, 0.0) / prompt_tokens
            self.long_prefill_s_per_token = _smooth(self.long_prefill_s_per_token, per_token, self.smoothing)

    def long_prefill_s(self, prompt_tokens: int) -> float:
        return 0.0 if self.long_prefill_s_per_token is None else prompt_tokens * self.long_prefill_s_per_token

    def observe_first_token(self, seconds: float) -> None:
        self.first_token_s = _smooth(self.first_token_s, max(seconds, 0.0), self.smoothing)

    def observe_decode(self, seconds: float, output_tokens: int) -> None:
        seconds = max(seconds, 0.0)  # a clock read out of order must not make time negative
        self.output_tokens = _smooth(self.output_tokens, float(output_tokens), self.smoothing)
        if output_tokens > 0:
            per_token = seconds / output_tokens
            self.seconds_per_output_token = _smooth(self.seconds_per_output_token, per_token, self.smoothing)

    def per_output_token_s(self, reported_step_time_s: float = 0.0) -> float:
        """Never less than the replicas' reported step time: a sequence gets
        one token per engine step. The measured figure can be far less
        where the router relays a short stream's tokens in one burst (its
        loop starved for a moment), so that Release follows Started at once."""
        if self.seconds_per_output_token is not None:
            return max(self.seconds_per_output_token, reported_step_time_s)
        return reported_step_time_s or self.prior_seconds_per_output_token

    def time_to_first_token_s(self) -> float:
        return self.first_token_s if self.first_token_s is not None else self.prior_first_token_s

    def expected_duration_s(self, output_tokens: int, reported_step_time_s: float = 0.0) -> float:
        return self.time_to_first_token_s() + output_tokens * self.per_output_token_s(reported_step_time_s)

    def mean_service_s(self, default_output_tokens: int, reported_step_time_s: float = 0.0) -> float:
        """Expected duration of a typical request: measured output lengths,
        or `default_output_tokens` before any request finished."""
        output = self.output_tokens if self.output_tokens is not None else default_output_tokens
        return self.expected_duration_s(round(output), reported_step_time_s)


def _smooth(current: float | None, sample: float, weight: float) -> float:
    return sample if current is None else current + weight * (sample - current)


@dataclass(slots=True)
class RetrySlots:
    """Spreads the Retry-After of refused requests over the capacity that
    will free, so that a burst told to come back does not come back at one
    instant and get refused again: each refusal takes the next slot after
    the time its work would fit, and moves the next slot on by the time the
    pool needs to drain that work."""

    next_slot_s: float = 0.0

    def retry_after_s(self, now_s: float, fits_at_s: float, drain_s: float) -> float:
        at_s = max(fits_at_s, self.next_slot_s, now_s)
        self.next_slot_s = at_s + drain_s
        return at_s - now_s
