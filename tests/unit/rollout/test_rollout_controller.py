"""The controller loop on a virtual clock, with the real local catalog store
and scripted metrics and quality results."""

import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from sluice.rollout.controller import Clock, RolloutController
from sluice.rollout.local_store import LocalCatalogStore
from sluice.rollout.machine import Command, Phase, QualityResult
from sluice.rollout.plan import RolloutPlan, SloThresholds
from sluice.rollout.prometheus import PrometheusError
from sluice.rollout.slo import MetricSample, VersionSample
from sluice.rollout.store import StoreError
from sluice.rollout.weights import CatalogError, alias_weights

HEALTHY = VersionSample(requests=100, ttft_p99_s=0.2, itl_p99_s=0.03, error_rate=0.0)


class VirtualClock:
    def __init__(self) -> None:
        self.now_s = 0.0
        self.on_sleep: Callable[[float], None] = lambda now_s: None

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds
        self.on_sleep(self.now_s)

    def clock(self) -> Clock:
        return Clock(monotonic_s=lambda: self.now_s, sleep=self.sleep, wall_iso=lambda: f"t+{self.now_s:.0f}s")


class ScriptedMetrics:
    """Answers with `sample_at(now_s)`; records the windows asked for and
    the weights the catalog had at each sample."""

    def __init__(self, clock: VirtualClock, store: LocalCatalogStore, sample_at=lambda now_s: HEALTHY) -> None:
        self.clock, self.store, self.sample_at = clock, store, sample_at
        self.windows: list[float] = []
        self.weights_seen: list[int] = []

    def sample(self, serving: str, candidate: str, window_s: float) -> MetricSample:
        self.windows.append(window_s)
        self.weights_seen.append(alias_weights(self.store.read_catalog(), "tiny-llama").of(candidate))
        candidate_sample = self.sample_at(self.clock.now_s)
        if isinstance(candidate_sample, Exception):
            raise candidate_sample
        return MetricSample(candidate=candidate_sample, serving=HEALTHY)


@pytest.fixture()
def store(tmp_path) -> LocalCatalogStore:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [{"name": "tiny-llama", "versions": [
        {"version": "tiny-llama-v1", "path": "/m/v1", "weight": 100},
        {"version": "tiny-llama-v2", "path": "/m/v2", "weight": 0}]}]}))
    return LocalCatalogStore(path)


def make_plan(**overrides) -> RolloutPlan:
    settings = dict(alias="tiny-llama", serving="tiny-llama-v1", candidate="tiny-llama-v2", steps_pct=(10, 50, 100),
                    dwell_s=30.0, min_requests=10, slo=SloThresholds(max_ttft_p99_s=1.0, max_error_rate=0.05))
    settings.update(overrides)
    return RolloutPlan(**settings)


def controller(plan, store, metrics, clock, quality=lambda: QualityResult(True, "ok"), lines=None):
    return RolloutController(plan, store, metrics, quality, poll_s=10.0, clock=clock.clock(),
                             log=(lines.append if lines is not None else lambda line: None))


def test_a_healthy_rollout_writes_each_step_and_ends_with_the_candidate_at_100(store):
    clock = VirtualClock()
    metrics = ScriptedMetrics(clock, store)
    lines: list[str] = []
    state = controller(make_plan(), store, metrics, clock, lines=lines).run()
    assert state.phase == Phase.COMPLETED
    assert alias_weights(store.read_catalog(), "tiny-llama").weights == (("tiny-llama-v1", 0), ("tiny-llama-v2", 100))
    # Each step held for its 30 s dwell: three samples each, at its own weights.
    assert metrics.weights_seen == [10, 10, 10, 50, 50, 50, 100, 100, 100]
    assert metrics.windows[:3] == [10.0, 20.0, 30.0]  # the step's age, so a step is judged on its own traffic
    status = store.read_status()
    assert status.phase == Phase.COMPLETED and status.candidate_pct == 100
    assert any("tiny-llama-v1 can be removed" in line for line in lines)


def test_a_breach_mid_rollout_puts_all_traffic_back(store):
    clock = VirtualClock()
    metrics = ScriptedMetrics(clock, store, lambda now_s: replace(HEALTHY, error_rate=0.2) if now_s > 40 else HEALTHY)
    state = controller(make_plan(), store, metrics, clock).run()
    assert state.phase == Phase.ROLLED_BACK and "error rate" in state.reason and "50%" in state.reason
    assert alias_weights(store.read_catalog(), "tiny-llama").weights == (("tiny-llama-v1", 100), ("tiny-llama-v2", 0))
    assert store.read_status().phase == Phase.ROLLED_BACK


def test_a_failed_quality_check_never_moves_traffic(store):
    clock = VirtualClock()
    metrics = ScriptedMetrics(clock, store)
    state = controller(make_plan(), store, metrics, clock, quality=lambda: QualityResult(False, "agreement 0.1")).run()
    assert state.phase == Phase.ROLLED_BACK and metrics.windows == []
    assert alias_weights(store.read_catalog(), "tiny-llama").of("tiny-llama-v2") == 0


def test_operator_commands_reach_the_running_controller_through_the_store(store):
    clock = VirtualClock()
    operator = LocalCatalogStore(store.catalog_path)  # a second `sluice rollout` invocation
    operator.send_command(Command.ABORT, "before")  # old news: sent before this rollout started

    def script(now_s: float) -> None:
        if now_s == 20:
            operator.send_command(Command.PAUSE, "t20")
        if now_s == 200:
            operator.send_command(Command.RESUME, "t200")

    clock.on_sleep = script
    metrics = ScriptedMetrics(clock, store)
    state = controller(make_plan(), store, metrics, clock).run()
    assert state.phase == Phase.COMPLETED
    # Paused at 10 % from t=20 to t=200: the weights held there all that time.
    assert metrics.weights_seen.count(10) > 15


def test_an_abort_command_rolls_back(store):
    clock = VirtualClock()
    operator = LocalCatalogStore(store.catalog_path)
    clock.on_sleep = lambda now_s: operator.send_command(Command.ABORT, "t") if now_s == 40 else None
    state = controller(make_plan(), store, ScriptedMetrics(clock, store), clock).run()
    assert state.phase == Phase.ROLLED_BACK and state.reason == "aborted by the operator"
    assert alias_weights(store.read_catalog(), "tiny-llama").of("tiny-llama-v2") == 0


def test_prometheus_away_holds_the_step_and_starves_it_past_max_step_s(store):
    clock = VirtualClock()
    metrics = ScriptedMetrics(clock, store, lambda now_s: PrometheusError("connection refused"))
    lines: list[str] = []
    state = controller(make_plan(max_step_s=60.0), store, metrics, clock, lines=lines).run()
    assert state.phase == Phase.ROLLED_BACK and "insufficient traffic at 10%" in state.reason
    assert any("no metrics this round" in line for line in lines)


def test_an_interrupted_controller_rolls_back_before_it_stops(store):
    clock = VirtualClock()

    def interrupt(now_s: float) -> None:
        if now_s == 50:
            raise KeyboardInterrupt

    clock.on_sleep = interrupt
    with pytest.raises(KeyboardInterrupt):
        controller(make_plan(), store, ScriptedMetrics(clock, store), clock).run()
    assert alias_weights(store.read_catalog(), "tiny-llama").of("tiny-llama-v2") == 0
    assert store.read_status().phase == Phase.ROLLED_BACK


def test_a_catalog_that_cannot_carry_the_rollout_fails_before_anything_is_written(store):
    clock = VirtualClock()
    with pytest.raises(CatalogError, match="candidate version 'tiny-llama-v9'"):
        controller(make_plan(candidate="tiny-llama-v9"), store, ScriptedMetrics(clock, store), clock).run()
    assert store.read_status() is None


def test_a_weight_write_that_fails_is_followed_by_a_roll_back_attempt(store):
    clock = VirtualClock()

    class FailsOnce(LocalCatalogStore):
        writes: list[int] = []

        def write_weights(self, alias, serving, candidate, candidate_pct):
            self.writes.append(candidate_pct)
            if candidate_pct == 50:
                raise StoreError("disk full")
            super().write_weights(alias, serving, candidate, candidate_pct)

    failing = FailsOnce(store.catalog_path)
    with pytest.raises(StoreError, match="disk full"):
        controller(make_plan(), failing, ScriptedMetrics(clock, failing), clock).run()
    assert failing.writes == [10, 50, 0]
    assert alias_weights(store.read_catalog(), "tiny-llama").of("tiny-llama-v2") == 0
