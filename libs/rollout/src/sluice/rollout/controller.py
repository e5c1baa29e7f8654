"""The rollout loop: feeds the state machine what the world says, and
carries out what it decides. All of the policy is in `machine`; this is
the thin part that reads the store, Prometheus and the clock.

    every poll_s:  operator command (if a new one)  ──▶ advance
                   else a metric sample (or a Tick)  ──▶ advance
    each transition's actions, in order: quality check, weights written,
    then the status document, so `sluice rollout status` shows it.

A weight write that fails mid-rollout is answered by one attempt to put
all traffic back on the serving version, then the error goes up: no
rollout continues on weights it could not set.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Protocol

from sluice.rollout.machine import (
    Command, Event, Finish, Operator, QualityResult, RollBack, RolloutState, RunQualityCheck, SetWeights, Tick, Transition,
    advance, begin,
)
from sluice.rollout.plan import RolloutPlan
from sluice.rollout.prometheus import PrometheusError
from sluice.rollout.records import StatusRecord
from sluice.rollout.slo import MetricSample
from sluice.rollout.store import RolloutStore, StoreError
from sluice.rollout.weights import check_rollout


class MetricsSource(Protocol):
    def sample(self, serving: str, candidate: str, window_s: float) -> MetricSample:
        """Both versions over the last `window_s`; raises PrometheusError."""


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True, slots=True)
class Clock:
    monotonic_s: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    wall_iso: Callable[[], str] = utc_now_iso


class RolloutController:
    def __init__(
        self,
        plan: RolloutPlan,
        store: RolloutStore,
        metrics: MetricsSource,
        quality: Callable[[], QualityResult] | None,
        *,
        poll_s: float = 10.0,
        clock: Clock = Clock(),
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        if plan.quality_gate and quality is None:
            raise ValueError("the plan has a quality gate but no quality check was given")
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s}")
        self.plan = plan
        self.store = store
        self.metrics = metrics
        self.quality = quality
        self.poll_s = poll_s
        self.clock = clock
        self.log = log
        self._last_command_seq = 0

    def run(self) -> RolloutState:
        """To the end: COMPLETED or ROLLED_BACK. Raises StoreError when the
        catalog cannot carry the rollout or cannot be written."""
        plan = self.plan
        check_rollout(self.store.read_catalog(), plan.alias, plan.serving, plan.candidate)
        before = self.store.read_command()
        self._last_command_seq = before.seq if before else 0  # commands sent before this rollout are old news
        state = self._apply(begin(plan, self.clock.monotonic_s()))
        try:
            while not state.finished:
                self.clock.sleep(self.poll_s)
                state = self._apply(advance(plan, state, self._next_event(state), self.clock.monotonic_s()))
        except KeyboardInterrupt:
            # Stopped (Ctrl-C, SIGTERM to the Job's pod): no one watches the
            # candidate's gates any more, so it does not keep its traffic.
            state = self._apply(advance(plan, state, Operator(Command.ABORT), self.clock.monotonic_s()))
            raise
        return state

    def _next_event(self, state: RolloutState) -> Event:
        command = self.store.read_command()
        if command is not None and command.seq > self._last_command_seq:
            self._last_command_seq = command.seq
            self.log(f"operator: {command.command} (sent {command.at})")
            return Operator(command.command)
        window_s = state.step_elapsed_s(self.clock.monotonic_s())
        try:
            return self.metrics.sample(self.plan.serving, self.plan.candidate, window_s)
        except PrometheusError as error:
            self.log(f"no metrics this round: {error}")
            return Tick()

    def _apply(self, transition: Transition) -> RolloutState:
        """Carry out `transition` and whatever the quality check leads to."""
        pending: list[Transition] = [transition]
        state = transition.state
        while pending:
            current = pending.pop(0)
            state = current.state
            if current.note:
                self.log(current.note)
            for action in current.actions:
                if isinstance(action, RunQualityCheck):
                    self._publish(state, "quality check running")
                    assert self.quality is not None  # checked at construction
                    result = self.quality()
                    pending.append(advance(self.plan, state, result, self.clock.monotonic_s()))
                else:
                    self._write_weights(action)
            if current.actions or current.note:
                self._publish(state, current.note)
        return state

    def _write_weights(self, action: SetWeights | RollBack | Finish) -> None:
        plan = self.plan
        pct = action.candidate_pct if isinstance(action, SetWeights) else 100 if isinstance(action, Finish) else 0
        try:
            self.store.write_weights(plan.alias, plan.serving, plan.candidate, pct)
        except (StoreError, ValueError) as error:
            if pct != 0:
                self.log(f"cannot write weights ({error}); putting all traffic back on {plan.serving}")
                try:
                    self.store.write_weights(plan.alias, plan.serving, plan.candidate, 0)
                except (StoreError, ValueError) as second:
                    self.log(f"the roll back failed too: {second}")
            raise
        self.log(f"weights of {plan.alias}: {plan.serving} {100 - pct}, {plan.candidate} {pct}")

    def _publish(self, state: RolloutState, note: str) -> None:
        plan = self.plan
        status = StatusRecord(
            alias=plan.alias, serving=plan.serving, candidate=plan.candidate, phase=state.phase,
            candidate_pct=state.candidate_pct(plan), steps_pct=plan.steps_pct, step_index=state.step_index,
            reason=state.reason, note=note, updated_at=self.clock.wall_iso(),
        )
        try:
            self.store.write_status(status)
        except StoreError as error:  # the status is for people; the rollout goes on without it
            self.log(f"cannot write the rollout status: {error}")
