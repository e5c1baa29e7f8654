"""The rollout state machine (pure: no I/O, the clock passed in).

    begin ──▶ pending_quality ──pass──▶ stepping(0) ──▶ stepping(1) ──▶ … ──▶ stepping(last) ──▶ completed
                   │                     │   ▲    each step: dwell_s held, min_requests seen,
                 fail                 pause resume     no SLO breach, then the next one
                   │                     ▼   │
                   │                    paused
                   ▼                     │
              rolled_back ◀──────────────┴── SLO breach, abort, a step starved past max_step_s

`advance(plan, state, event, now_s)` returns the next state and the actions
the controller must carry out, in order; the machine never waits, reads or
writes anything. Weights move only through actions: nothing moves before
the quality check has passed, and every way out other than `completed`
puts all of the alias's traffic back on the serving version.

While paused the weights are held and the dwell clock stops; SLO breaches
are still judged (the candidate still serves its share) and roll back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from sluice.rollout.plan import RolloutPlan
from sluice.rollout.slo import MetricSample, VersionSample, breaches


class Phase(enum.StrEnum):
    PENDING_QUALITY = "pending_quality"
    STEPPING = "stepping"
    PAUSED = "paused"
    ROLLED_BACK = "rolled_back"
    COMPLETED = "completed"


TERMINAL = frozenset({Phase.ROLLED_BACK, Phase.COMPLETED})


class Command(enum.StrEnum):
    """What an operator may ask of a running rollout."""

    PAUSE = "pause"
    RESUME = "resume"
    ABORT = "abort"


@dataclass(frozen=True, slots=True)
class RolloutState:
    phase: Phase
    step_index: int = -1  # into plan.steps_pct; -1 while no traffic has moved
    # When the current step's dwell started (its weights were written, or
    # shifted on resume so the dwell served before a pause counts).
    step_started_s: float | None = None
    dwell_served_s: float = 0.0  # while paused: how much of the dwell the step had served
    # The serving version's latest sample with enough traffic, for the
    # relative gates once the serving version has little or none left (at 100 %).
    baseline: VersionSample | None = None
    reason: str = ""  # why it rolled back, or how it completed

    def candidate_pct(self, plan: RolloutPlan) -> int:
        """The candidate's share of the alias's traffic this state stands for."""
        if self.phase == Phase.COMPLETED:
            return 100
        if self.phase == Phase.ROLLED_BACK or self.step_index < 0:
            return 0
        return plan.steps_pct[self.step_index]

    def step_elapsed_s(self, now_s: float) -> float:
        """The dwell this step has served by `now_s` (frozen while paused)."""
        if self.phase == Phase.PAUSED:
            return self.dwell_served_s
        if self.step_started_s is None:
            return 0.0
        return max(0.0, now_s - self.step_started_s)

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL


# ---- events ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class QualityResult:
    passed: bool
    summary: str  # one line: the scores and what failed


@dataclass(frozen=True, slots=True)
class Operator:
    command: Command


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed without a metric sample (Prometheus unreachable or slow)."""


Event = QualityResult | MetricSample | Operator | Tick


# ---- actions --------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RunQualityCheck:
    """Score the candidate against the serving version; answer with a QualityResult."""


@dataclass(frozen=True, slots=True)
class SetWeights:
    candidate_pct: int  # the serving version gets 100 - candidate_pct


@dataclass(frozen=True, slots=True)
class RollBack:
    """All traffic back on the serving version (serving 100, candidate 0)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Finish:
    """The candidate has all the traffic; the serving version may be removed."""


Action = RunQualityCheck | SetWeights | RollBack | Finish


@dataclass(frozen=True, slots=True)
class Transition:
    state: RolloutState
    actions: tuple[Action, ...] = ()
    note: str = ""  # one line for the operator's log; "" when nothing worth saying happened


# ---- transitions ------------------------------------------------------------

def begin(plan: RolloutPlan, now_s: float) -> Transition:
    if plan.quality_gate:
        return Transition(RolloutState(Phase.PENDING_QUALITY), (RunQualityCheck(),),
                          f"quality check of {plan.candidate} against {plan.serving}")
    return _enter_step(plan, RolloutState(Phase.PENDING_QUALITY), 0, now_s, "quality gate skipped")


def advance(plan: RolloutPlan, state: RolloutState, event: Event, now_s: float) -> Transition:
    if state.finished:
        return Transition(state, note=f"rollout already {state.phase}: {type(event).__name__} ignored")
    if isinstance(event, Operator):
        return _operator(state, event.command, now_s)
    if isinstance(event, QualityResult):
        return _quality(plan, state, event, now_s)
    if isinstance(event, MetricSample):
        return _observed(plan, state, event, now_s)
    return _starved(plan, state, now_s, "no metrics")


def _quality(plan: RolloutPlan, state: RolloutState, result: QualityResult, now_s: float) -> Transition:
    if state.phase != Phase.PENDING_QUALITY:
        return Transition(state, note="a quality result outside the quality gate is ignored")
    if not result.passed:
        return _roll_back(state, f"quality check failed: {result.summary}")
    return _enter_step(plan, state, 0, now_s, f"quality check passed: {result.summary}")


def _operator(state: RolloutState, command: Command, now_s: float) -> Transition:
    if command == Command.ABORT:
        return _roll_back(state, "aborted by the operator")
    if command == Command.PAUSE:
        if state.phase != Phase.STEPPING:
            return Transition(state, note=f"pause ignored: the rollout is {state.phase}")
        paused = replace(state, phase=Phase.PAUSED, dwell_served_s=state.step_elapsed_s(now_s))
        return Transition(paused, note=f"paused by the operator after {paused.dwell_served_s:.0f}s of the step")
    if state.phase != Phase.PAUSED:
        return Transition(state, note=f"resume ignored: the rollout is {state.phase}")
    resumed = replace(state, phase=Phase.STEPPING, step_started_s=now_s - state.dwell_served_s, dwell_served_s=0.0)
    return Transition(resumed, note="resumed by the operator")


def _observed(plan: RolloutPlan, state: RolloutState, sample: MetricSample, now_s: float) -> Transition:
    if state.phase not in (Phase.STEPPING, Phase.PAUSED):
        return Transition(state)  # no traffic has moved: nothing to judge
    if sample.candidate.requests < plan.min_requests:
        if state.phase == Phase.PAUSED:
            return Transition(state)
        return _starved(plan, state, now_s, f"{sample.candidate.requests:.0f} of {plan.min_requests} requests")
    enough_serving = sample.serving.requests >= plan.min_requests
    baseline = sample.serving if enough_serving else state.baseline
    judged = replace(state, baseline=baseline)
    failed = breaches(plan.slo, sample.candidate, baseline)
    pct = state.candidate_pct(plan)
    if failed:
        return _roll_back(judged, f"SLO breach at {pct}%: " + "; ".join(failed))
    if state.phase == Phase.PAUSED or state.step_elapsed_s(now_s) < plan.dwell_s:
        return Transition(judged)
    return _enter_step(plan, judged, state.step_index + 1, now_s, f"step {pct}% passed")


def _starved(plan: RolloutPlan, state: RolloutState, now_s: float, what: str) -> Transition:
    """Not enough to judge the step yet; past max_step_s that is a failure:
    a candidate no one could vouch for does not keep its traffic."""
    if (state.phase == Phase.STEPPING and plan.max_step_s is not None
            and state.step_elapsed_s(now_s) >= plan.max_step_s):
        pct = state.candidate_pct(plan)
        return _roll_back(state, f"insufficient traffic at {pct}%: {what} after {plan.max_step_s:g}s")
    return Transition(state)


def _enter_step(plan: RolloutPlan, state: RolloutState, index: int, now_s: float, why: str) -> Transition:
    if index >= len(plan.steps_pct):
        done = replace(state, phase=Phase.COMPLETED, step_started_s=None,
                       reason=f"{plan.candidate} serves all of {plan.alias}")
        return Transition(done, (Finish(),), f"{why}; rollout completed, {plan.serving} can be removed")
    pct = plan.steps_pct[index]
    stepping = replace(state, phase=Phase.STEPPING, step_index=index, step_started_s=now_s, dwell_served_s=0.0)
    return Transition(stepping, (SetWeights(pct),), f"{why}; {pct}% of {plan.alias} to {plan.candidate}")


def _roll_back(state: RolloutState, reason: str) -> Transition:
    rolled = replace(state, phase=Phase.ROLLED_BACK, step_started_s=None, reason=reason)
    return Transition(rolled, (RollBack(reason),), f"rolled back: {reason}")
