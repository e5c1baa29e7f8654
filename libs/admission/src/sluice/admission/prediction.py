"""When would a request start, and when should a refused one come back?

The pool's capacity is KV blocks and sequence seats. A request starts when
the blocks and seats free now, plus those the running work releases as it
finishes, cover it and everything queued ahead of it:

    time ──▶      now        f1      f2        f3
    running       ████████████│       │         │      expected finish of each
    freed                    +b1     +b2       +b3     (blocks, one seat each)
    needed        ahead + own ─────────────────▲       start = first time freed >= needed

The room each release frees goes to the work queued ahead, which holds it
for a mean service time and frees it again: a pool that filled at once
drains in waves, one service time apart, and a burst of three pools' worth
starts in three (see `_covered_at_s`). Expected finishes come from measured
service times (see `ServiceTimeEstimate`), never from a constant, and the
prediction only grows with the work ahead (tests check monotonicity).

A refused request is told when to come back (`PromisedReturns`): the time
its predicted start, behind the queue and everyone told to come back before
it, falls inside the SLO, stretched by how late the pool's predictions have
run of late (`ServiceTimeEstimate.late_factor`).
"""

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

# The finished requests whose lateness calibrates a refusal's advice (about
# four waves of a 16-seat pool), the fewest that replace the prior, and the
# prior: predictions on shared machines drift by ten or twenty percent.
LATENESS_WINDOW = 64
LATENESS_MIN_SAMPLES = 8
PRIOR_LATE_FACTOR = 1.2


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
    if needed.kv_blocks <= capacity.free_kv_blocks and needed.seqs <= capacity.free_seats:
        return 0.0
    running = list(running)
    blocks_at_s = _covered_at_s(
        now_s, capacity.free_kv_blocks, [(max(w.expected_finish_s, now_s), w.kv_blocks) for w in running],
        needed.kv_blocks, mean_service_s, capacity.total_kv_blocks,
    )
    seats_at_s = _covered_at_s(
        now_s, capacity.free_seats, [(max(w.expected_finish_s, now_s), 1) for w in running],
        needed.seqs, mean_service_s, capacity.total_seats,
    )
    return max(blocks_at_s, seats_at_s) - now_s


def _covered_at_s(
    now_s: float, free: int, releases: list[tuple[float, int]], needed: int, cycle_s: float, total: int,
) -> float:
    """The first time the room released from `now_s` on covers `needed`
    units of one resource (KV blocks or seats).

    The room free now and each running request's room, once released, is
    taken by the work queued ahead, which holds it for one mean service
    time and releases it again: each release repeats every `cycle_s`. So a
    pool that filled at once drains in waves (a burst of three pools' worth
    starts in three waves, one service time apart), not in a trickle. With
    r_i the release times and b_i their sizes, the room released by t is

        A(t) = sum_i b_i * (number of k >= 0 with r_i + k * cycle_s <= t)

    and the answer is the first t with A(t) >= needed. The room free now is
    one more release, at `now_s`."""
    if needed <= free:
        return now_s
    cycle_s = max(cycle_s, 1e-9)
    per_cycle = free + sum(size for _, size in releases)
    if per_cycle <= 0:
        # Nothing net is ever released (every unit is held by work outside
        # `releases`): the whole pool turns over once per service time.
        last_s = max((at_s for at_s, _ in releases), default=now_s)
        return last_s + max(needed - per_cycle, 0) / max(total, 1) * cycle_s
    # An overbooked pool (free < 0) repays its debt from the first releases,
    # once: that room never reaches the work ahead.
    debt = max(-free, 0)
    circulating = [(now_s, free)] if free > 0 else []
    for at_s, size in sorted(releases):
        repaid = min(debt, size)
        debt -= repaid
        if size > repaid:
            circulating.append((at_s, size - repaid))
    # Each release as (whole cycles after now, offset inside its cycle, size).
    streams = []
    for at_s, size in circulating:
        whole = int((at_s - now_s) // cycle_s)
        streams.append((whole, at_s - now_s - whole * cycle_s, size))
    cycle = _first_covering_cycle(streams, needed)
    # Inside that cycle: what the earlier cycles released, then this
    # cycle's releases in time order.
    covered = sum(size * (cycle - whole) for whole, _, size in streams if whole <= cycle)
    for whole, offset, size in sorted((s for s in streams if s[0] <= cycle), key=lambda s: s[1]):
        covered += size
        if covered >= needed:
            return now_s + cycle * cycle_s + offset
    raise AssertionError("the covering cycle covers")  # _first_covering_cycle found it


def _first_covering_cycle(streams: list[tuple[int, float, int]], needed: int) -> int:
    """The first cycle k by whose end the releases cover `needed`:
    A_end(k) = sum over streams begun by cycle k of size * (k - whole + 1).
    Between the cycles where streams begin, A_end grows linearly in k (the
    slope is the size of the streams begun, all positive); solve each piece
    in turn."""
    begins = sorted({whole for whole, _, _ in streams})
    for index, first in enumerate(begins):
        slope = sum(size for whole, _, size in streams if whole <= first)
        offset = sum(size * (whole - 1) for whole, _, size in streams if whole <= first)
        last = begins[index + 1] - 1 if index + 1 < len(begins) else None
        # slope * k - offset >= needed
        k = max(first, -(-(needed + offset) // slope))
        if last is None or k <= last:
            return k
    raise AssertionError("a pool that releases room each cycle covers any need")


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
    # What share of its output bound (max_tokens, or the class default) a
    # finished request generated, smoothed: a request's expected output is
    # its bound times this.
    output_fraction: float | None = None
    # Seconds of the pool's long-prefill lane a long prompt takes per prompt
    # token, from dispatch to its first token, smoothed over long prompts
    # (kept apart from first_token_s: one 32K prompt would swamp the chats'
    # figure). None until a long prompt started: the lane then adds nothing.
    long_prefill_s_per_token: float | None = None

    # How late the finished requests ran against what was predicted at
    # their dispatch (actual ÷ predicted seconds), the most recent ones.
    # Only requests of at least `lateness_min_output_tokens`: a few-token
    # request's ratio is mostly the noise of its first step, and a pool's
    # waits are made of long ones.
    lateness: deque[float] = field(default_factory=lambda: deque(maxlen=LATENESS_WINDOW))
    lateness_min_output_tokens: int = 32

    def observe_lateness(self, actual_s: float, predicted_s: float, output_tokens: int) -> None:
        if predicted_s > 0.0 and output_tokens >= self.lateness_min_output_tokens:
            self.lateness.append(max(actual_s, 0.0) / predicted_s)

    def late_factor(self) -> float:
        """What to stretch a predicted wait by so that it is seldom short:
        the recent lateness's spread (90th percentile over the median),
        plus its median where that is late, within [1, 2].

        The spread, not the smoothed mean: requests dispatched together run
        late together (a wave shares its batch's step time), and the
        estimates adapt to each wave, so the last waves' bias says little
        about the next one's while their spread says how far off the next
        may be. A pool whose predictions run early is not told to come
        sooner: the wait is advice a client acts on once.
        `PRIOR_LATE_FACTOR` until enough have finished."""
        if len(self.lateness) < LATENESS_MIN_SAMPLES:
            return PRIOR_LATE_FACTOR
        ordered = sorted(self.lateness)
        p50 = ordered[len(ordered) // 2]
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        return min(1.0 + max(p50 - 1.0, 0.0) + (p90 - p50), 2.0)

    def observe_long_prefill(self, seconds: float, prompt_tokens: int) -> None:
        if prompt_tokens > 0:
            per_token = max(seconds, 0.0) / prompt_tokens
            self.long_prefill_s_per_token = _smooth(self.long_prefill_s_per_token, per_token, self.smoothing)

    def long_prefill_s(self, prompt_tokens: int) -> float:
        return 0.0 if self.long_prefill_s_per_token is None else prompt_tokens * self.long_prefill_s_per_token

    def observe_first_token(self, seconds: float) -> None:
        self.first_token_s = _smooth(self.first_token_s, max(seconds, 0.0), self.smoothing)

    def observe_decode(self, seconds: float, output_tokens: int, output_bound_tokens: int = 0,
                       occupancy: float = 1.0) -> None:
        """A request finished: `seconds` from its first token, on a replica
        `occupancy` full (0-1, the larger of its seat and KV shares held,
        the request included) as it ended.

        The per-token sample counts in proportion to `occupancy`: a
        prediction matters when the pool is full, and a full replica's step
        is slower than one running the few stragglers that end a burst.
        Weighted equally, those stragglers (the last to finish, so the
        freshest samples) pulled the estimate down by ~15% just before the
        next burst arrived, and its retries were told to come back early."""
        seconds = max(seconds, 0.0)  # a clock read out of order must not make time negative
        self.output_tokens = _smooth(self.output_tokens, float(output_tokens), self.smoothing)
        if output_bound_tokens > 0:
            fraction = min(output_tokens / output_bound_tokens, 1.0)
            self.output_fraction = _smooth(self.output_fraction, fraction, self.smoothing)
        if output_tokens > 0:
            per_token = seconds / output_tokens
            weight = self.smoothing * min(max(occupancy, 0.0), 1.0)
            self.seconds_per_output_token = _smooth(self.seconds_per_output_token, per_token, weight)

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

    def expected_output_tokens(self, output_bound_tokens: int) -> float:
        """What a request bounded at `output_bound_tokens` is expected to generate."""
        fraction = self.output_fraction if self.output_fraction is not None else 1.0
        return output_bound_tokens * fraction

    def mean_service_s(self, default_output_tokens: int, reported_step_time_s: float = 0.0,
                       output_bound_tokens: int = 0) -> float:
        """Expected duration of a typical request: measured output lengths,
        or `default_output_tokens` before any request finished; and no less
        than a request bounded at `output_bound_tokens` is expected to run
        (the request being predicted: a burst of requests longer than the
        pool's history is not told the history's turnover)."""
        output = self.output_tokens if self.output_tokens is not None else default_output_tokens
        output = max(output, self.expected_output_tokens(output_bound_tokens))
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


@dataclass(slots=True)
class PromisedReturns:
    """Refused requests told when to come back, counted as work ahead of
    the next refusal's advice until they are due back (and `grace_s` after,
    for the trip). A burst told to return is then told to return in the
    waves the pool can take, each wave at the time its own predicted start
    comes inside the SLO, instead of one slot after another that ignores
    when the pool really frees."""

    grace_s: float = 0.25
    kv_blocks: int = 0
    seqs: int = 0
    _until: list[tuple[float, int]] = field(default_factory=list)  # heap of (counted until, kv blocks)

    def outstanding(self, now_s: float) -> WorkAhead:
        while self._until and self._until[0][0] <= now_s:
            _, blocks = heapq.heappop(self._until)
            self.kv_blocks -= blocks
            self.seqs -= 1
        return WorkAhead(self.kv_blocks, self.seqs)

    def promise(self, back_at_s: float, kv_blocks: int) -> None:
        heapq.heappush(self._until, (back_at_s + self.grace_s, kv_blocks))
        self.kv_blocks += kv_blocks
        self.seqs += 1
