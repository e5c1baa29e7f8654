"""What a rollout is asked to do: the traffic steps, how long each is
watched, how much traffic a step needs before it is judged, and the SLO
gates. Validated once, here; the state machine trusts it.

    steps_pct   1 -> 5 -> 25 -> 50 -> 100   share of the alias's traffic on the candidate
    dwell_s     each step is held at least this long ...
    min_requests ... and until the candidate finished this many requests in it
    max_step_s  a step that cannot gather min_requests by then is rolled back
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_STEPS_PCT = (1, 5, 25, 50, 100)


@dataclass(frozen=True, slots=True)
class SloThresholds:
    """The candidate's gates, judged over each step's window. None: not checked.

    Absolute limits hold whatever the serving version does. Relative ones
    compare with the serving version over the same window (a candidate
    twice as slow as today's version on today's traffic is a regression
    even under an absolute SLO); `relative_slack_s` keeps a 10 ms -> 21 ms
    wobble of a near-idle pool from reading as "2x slower".
    """

    max_ttft_p99_s: float | None = None
    max_itl_p99_s: float | None = None
    max_error_rate: float | None = None  # errors / (finished + errors), 0..1
    max_ttft_p99_ratio: float | None = None  # candidate / serving
    max_itl_p99_ratio: float | None = None
    max_error_rate_increase: float | None = None  # candidate - serving, in rate points (0.01 = 1 %)
    relative_slack_s: float = 0.05

    def __post_init__(self) -> None:
        for name in ("max_ttft_p99_s", "max_itl_p99_s", "max_ttft_p99_ratio", "max_itl_p99_ratio"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value}")
        for name in ("max_error_rate", "max_error_rate_increase"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and 0 <= value <= 1):
                raise ValueError(f"{name} must be within 0..1, got {value}")
        if not (math.isfinite(self.relative_slack_s) and self.relative_slack_s >= 0):
            raise ValueError(f"relative_slack_s must be >= 0, got {self.relative_slack_s}")


@dataclass(frozen=True, slots=True)
class RolloutPlan:
    alias: str
    serving: str  # the version that has the traffic now
    candidate: str  # the version the traffic moves to
    steps_pct: tuple[int, ...] = DEFAULT_STEPS_PCT
    dwell_s: float = 300.0
    min_requests: int = 50
    max_step_s: float | None = None  # None: a quiet step waits for traffic as long as it takes
    slo: SloThresholds = SloThresholds()
    quality_gate: bool = True  # False: the operator vouches for the candidate (no weights at hand)

    def __post_init__(self) -> None:
        if not self.alias:
            raise ValueError("the alias is empty")
        if not self.serving or not self.candidate:
            raise ValueError("both the serving and the candidate version must be named")
        if self.serving == self.candidate:
            raise ValueError(f"the candidate {self.candidate!r} is already the serving version")
        steps = self.steps_pct
        if not steps:
            raise ValueError("a rollout needs at least one step")
        if any(not isinstance(s, int) or not 0 < s <= 100 for s in steps):
            raise ValueError(f"every step must be a whole percentage in 1..100, got {list(steps)}")
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError(f"steps must increase, got {list(steps)}")
        if steps[-1] != 100:
            raise ValueError(f"the last step must be 100 (the cut), got {steps[-1]}")
        if not (math.isfinite(self.dwell_s) and self.dwell_s >= 0):
            raise ValueError(f"dwell_s must be >= 0, got {self.dwell_s}")
        if self.min_requests < 1:
            raise ValueError(f"min_requests must be >= 1, got {self.min_requests}")
        if self.max_step_s is not None and not self.max_step_s >= self.dwell_s:
            raise ValueError(f"max_step_s ({self.max_step_s}) must be at least dwell_s ({self.dwell_s})")


def parse_steps(text: str) -> tuple[int, ...]:
    """'1,5,25,50,100' -> (1, 5, 25, 50, 100); the plan validates the values."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"steps must be comma-separated whole percentages, got {text!r}") from None
