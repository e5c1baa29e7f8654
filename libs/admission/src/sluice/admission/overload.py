"""The overload controller: one pool's degradation stage, from its signals.

    stage  what the scheduler does on top of normal admission
    0      nothing
    1      batch_paused: new batch-class calls are refused with a Retry-After
           from `resume_in_s` (queued batch already waits for interactive)
    2      + output_capped: degradable requests get max_tokens capped and
           very long prompts refused
    3      + fallback: requests whose tenant allows it go to the pool's
           fallback version (a smaller or quantized model)
    4      + rejecting: interactive calls that cannot start soon are refused
           early, with a Retry-After, instead of queueing toward the SLO

Critical tenants are exempt from every stage (they keep a reserved share
of KV and queue slots, see sluice.placement.config); health probes and the
replica canary never pass through the scheduler at all.

Signals, per pool: the age of the oldest queued interactive request, the
predicted start of an interactive request joining behind the queued ones
(0 while none is queued: a full pool that keeps up is busy, not
overloaded), and the share of the pool's KV held by interactive work
(reserved + queued). Batch soaking leftover KV is the design working, not
overload, so it is not counted.

Hysteresis: stage n+1 is entered when any signal has been at or past its
entry threshold for `enter_hold_s`; stage n is left (to n-1) when every
signal has been below stage n's exit thresholds for `exit_hold_s`. Exit
thresholds sit below entry ones, and the stage moves one step at a time,
so a load hovering at a threshold does not flap the pool between stages.

Pure: no I/O, the clock is passed in. The scheduler service and the
simulator run the same code.
"""

from dataclasses import dataclass, field
from enum import IntEnum


class OverloadStage(IntEnum):
    NORMAL = 0
    BATCH_PAUSED = 1
    OUTPUT_CAPPED = 2
    FALLBACK = 3
    REJECTING = 4


STAGE_NAMES = {
    OverloadStage.NORMAL: "normal",
    OverloadStage.BATCH_PAUSED: "batch_paused",
    OverloadStage.OUTPUT_CAPPED: "output_capped",
    OverloadStage.FALLBACK: "fallback",
    OverloadStage.REJECTING: "rejecting",
}


@dataclass(frozen=True, slots=True)
class PoolSignals:
    interactive_queue_age_s: float  # the oldest queued interactive request; 0 when none
    predicted_start_s: float        # for an interactive request joining behind the queue; 0 when none queued
    kv_occupancy: float             # interactive reserved + queued KV / pool KV, 0..1+


@dataclass(frozen=True, slots=True)
class StageThresholds:
    """When one stage is entered (any signal at or past its `enter_`) and
    left (every signal below its `exit_`)."""

    enter_queue_age_s: float
    exit_queue_age_s: float
    enter_predicted_start_s: float
    exit_predicted_start_s: float
    enter_kv_occupancy: float
    exit_kv_occupancy: float

    def __post_init__(self) -> None:
        pairs = (
            (self.enter_queue_age_s, self.exit_queue_age_s),
            (self.enter_predicted_start_s, self.exit_predicted_start_s),
            (self.enter_kv_occupancy, self.exit_kv_occupancy),
        )
        if any(exit_ < 0 or exit_ >= enter for enter, exit_ in pairs):
            raise ValueError(f"each exit threshold must be >= 0 and below its entry threshold: {self}")

    def entered_by(self, signals: PoolSignals) -> bool:
        return (
            signals.interactive_queue_age_s >= self.enter_queue_age_s
            or signals.predicted_start_s >= self.enter_predicted_start_s
            or signals.kv_occupancy >= self.enter_kv_occupancy
        )

    def cleared_by(self, signals: PoolSignals) -> bool:
        return (
            signals.interactive_queue_age_s < self.exit_queue_age_s
            and signals.predicted_start_s < self.exit_predicted_start_s
            and signals.kv_occupancy < self.exit_kv_occupancy
        )


def default_stage_thresholds(interactive_slo_s: float) -> tuple[StageThresholds, ...]:
    """Stages 1..4 for an interactive TTFT SLO: batch pauses while there is
    still half the SLO in hand, and early rejection starts before the
    prediction reaches the SLO (where plain admission would refuse anyway)."""
    slo = interactive_slo_s

    def stage(enter: float, exit_: float, enter_kv: float, exit_kv: float) -> StageThresholds:
        return StageThresholds(enter * slo, exit_ * slo, enter * slo, exit_ * slo, enter_kv, exit_kv)

    return (
        stage(0.25, 0.05, 0.90, 0.75),
        stage(0.40, 0.15, 0.94, 0.85),
        stage(0.55, 0.25, 0.97, 0.90),
        stage(0.70, 0.35, 0.99, 0.93),
    )


@dataclass(frozen=True, slots=True)
class OverloadPolicy:
    # Thresholds of stages 1..4, in order; a later stage never enters
    # before an earlier one (the controller steps one stage at a time).
    stages: tuple[StageThresholds, ...] = field(default_factory=lambda: default_stage_thresholds(2.0))
    # A breach must last this long before the stage steps up: one burst of
    # arrivals inside a scheduling tick is not overload.
    enter_hold_s: float = 0.25
    # Every signal must stay clear this long before the stage steps down;
    # long against enter_hold_s so a recovering pool does not bounce.
    exit_hold_s: float = 3.0
    # Off: the stage stays 0 whatever the signals (plain admission only).
    enabled: bool = True

    def __post_init__(self) -> None:
        if len(self.stages) != len(OverloadStage) - 1:
            raise ValueError(f"give thresholds for stages 1..{len(OverloadStage) - 1}, got {len(self.stages)}")
        if self.enter_hold_s < 0 or self.exit_hold_s < 0:
            raise ValueError("hold times must be >= 0")

    def thresholds(self, stage: OverloadStage) -> StageThresholds:
        return self.stages[stage - 1]


@dataclass(frozen=True, slots=True)
class StageChange:
    previous: OverloadStage
    current: OverloadStage
    at_s: float
    signals: PoolSignals


class OverloadController:
    """One pool's stage. Only the pool's scheduler calls `observe`."""

    def __init__(self, policy: OverloadPolicy) -> None:
        self.policy = policy
        self.stage = OverloadStage.NORMAL
        self.signals = PoolSignals(0.0, 0.0, 0.0)
        self._changed_at_s = float("-inf")
        self._breach_since_s: float | None = None  # the next stage's entry condition, held since
        self._clear_since_s: float | None = None   # this stage's exit condition, held since

    def observe(self, signals: PoolSignals, now_s: float) -> StageChange | None:
        """Take the pool's signals; returns the change if the stage moved."""
        self.signals = signals
        if not self.policy.enabled:
            return None
        previous = self.stage
        if self.stage < OverloadStage.REJECTING and self.policy.thresholds(self.stage + 1).entered_by(signals):
            self._breach_since_s = now_s if self._breach_since_s is None else self._breach_since_s
        else:
            self._breach_since_s = None
        if self.stage > OverloadStage.NORMAL and self.policy.thresholds(self.stage).cleared_by(signals):
            self._clear_since_s = now_s if self._clear_since_s is None else self._clear_since_s
        else:
            self._clear_since_s = None
        since_change_s = now_s - self._changed_at_s
        if self._breach_since_s is not None and min(now_s - self._breach_since_s, since_change_s) >= (
            self.policy.enter_hold_s
        ):
            self.stage = OverloadStage(self.stage + 1)
        elif self._clear_since_s is not None and min(now_s - self._clear_since_s, since_change_s) >= (
            self.policy.exit_hold_s
        ):
            self.stage = OverloadStage(self.stage - 1)
        if self.stage == previous:
            return None
        self._changed_at_s = now_s
        self._breach_since_s = self._clear_since_s = None
        return StageChange(previous, self.stage, now_s, signals)

    def at_least(self, stage: OverloadStage) -> bool:
        return self.stage >= stage

    def resume_in_s(self, stage: OverloadStage, now_s: float) -> float:
        """An estimate of how long until the pool is below `stage` again:
        the backlog ahead of a new interactive request drains to `stage`'s
        exit level (its predicted start falls about a second per second
        once arrivals stop exceeding capacity), then each stage from the
        current one down to `stage` holds clear for `exit_hold_s`."""
        if self.stage < stage:
            return 0.0
        exit_level_s = self.policy.thresholds(stage).exit_predicted_start_s
        drain_s = max(0.0, self.signals.predicted_start_s - exit_level_s)
        steps = self.stage - stage + 1
        held_s = 0.0 if self._clear_since_s is None else now_s - self._clear_since_s
        return drain_s + max(0.0, steps * self.policy.exit_hold_s - held_s)
