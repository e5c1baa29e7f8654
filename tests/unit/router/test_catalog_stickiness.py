"""Sticky version choice across weight changes: the hashed slices move only
the ids in the shifted weight, and the router's memory of recent ids keeps
a retry on the version it got while the alias still sends traffic there."""

from collections import Counter
from pathlib import Path

import pytest

from sluice.router.catalog import ModelAliasSpec, ModelVersionSpec, pick_version
from sluice.router.live_models import LiveModels
from sluice.router.models import ModelRegistry
from sluice.router.recent_assignments import RecentAssignments

IDS = [f"key-{i}" for i in range(20_000)]


def alias(*weights: int, names: tuple[str, ...] = ("v1", "v2", "v3"), path: Path = Path("m")) -> ModelAliasSpec:
    return ModelAliasSpec("m", tuple(ModelVersionSpec(n, path, w) for n, w in zip(names, weights)))


def choices(spec: ModelAliasSpec) -> list[str]:
    return [pick_version(spec, request_id).version for request_id in IDS]


@pytest.mark.parametrize("before, after", [((90, 10), (75, 25)), ((99, 1), (95, 5)), ((50, 50), (100, 0))])
def test_shifting_weight_moves_only_the_shifted_slice(before, after):
    moved = Counter((a, b) for a, b in zip(choices(alias(*before)), choices(alias(*after))) if a != b)
    shifted = (before[0] - after[0]) / 100
    assert set(moved) == {("v1", "v2") if shifted > 0 else ("v2", "v1")}  # nobody moves against the shift
    assert sum(moved.values()) / len(IDS) == pytest.approx(abs(shifted), abs=0.01)


def test_the_same_shares_under_another_total_or_file_order_move_nobody():
    assert choices(alias(90, 10)) == choices(alias(9, 1))
    reordered = ModelAliasSpec("m", tuple(reversed(alias(90, 10).versions)))
    assert choices(alias(90, 10)) == choices(reordered)


def test_shares_follow_the_weights_with_three_versions():
    counts = Counter(choices(alias(60, 30, 10)))
    assert [counts[v] / len(IDS) for v in ("v1", "v2", "v3")] == pytest.approx([0.6, 0.3, 0.1], abs=0.015)


def test_recent_assignments_expire_and_stay_bounded():
    memory = RecentAssignments(ttl_s=10.0, max_entries=3)
    memory.remember("m", "a", "v1", now_s=0.0)
    assert memory.recall("m", "a", now_s=9.9) == "v1"
    assert memory.recall("other-alias", "a", now_s=9.9) is None
    assert memory.recall("m", "a", now_s=10.0) is None
    for i, key in enumerate("bcde"):
        memory.remember("m", key, "v2", now_s=20.0 + i)
    assert len(memory) == 3 and memory.recall("m", "b", now_s=24.0) is None  # the least recent went first
    memory.remember("m", "c", "v1", now_s=25.0)  # seen again: now the most recent
    memory.remember("m", "f", "v1", now_s=26.0)
    assert memory.recall("m", "c", now_s=26.0) == "v1" and memory.recall("m", "d", now_s=26.0) is None
    with pytest.raises(ValueError):
        RecentAssignments(ttl_s=0)


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def live_factory(tiny_model_dir, small_model_dir):
    def registry(*weights: int, names=("v1", "v2"), previous=None) -> ModelRegistry:
        paths = {"v1": tiny_model_dir, "v2": small_model_dir, "v3": small_model_dir}
        spec = ModelAliasSpec("m", tuple(ModelVersionSpec(n, paths[n], w) for n, w in zip(names, weights)))
        return ModelRegistry((spec,), created_unix_s=0.0, previous=previous)
    return registry


def test_a_remembered_id_sticks_across_a_weight_change(live_factory):
    clock = Clock()
    live = LiveModels(live_factory(90, 10), RecentAssignments(ttl_s=600.0), clock)
    before, after = alias(90, 10), alias(75, 25)
    movers = [i for i in IDS[:2000] if pick_version(before, i).version == "v1" != pick_version(after, i).version]
    assert movers  # ~15% of them
    for request_id in movers:
        assert live.resolve("m", request_id).version.spec.version == "v1"
    live.swap(live_factory(75, 25, previous=live.current))
    clock.now_s = 300.0
    assert {live.resolve("m", i).version.spec.version for i in movers} == {"v1"}  # retries stay
    fresh = [i for i in IDS[2000:4000] if pick_version(after, i).version == "v2"]
    assert {live.resolve("m", i).version.spec.version for i in fresh} == {"v2"}  # new ids follow the weights
    clock.now_s = 300.0 + 600.0  # past the TTL since they were last seen: the weights decide again
    assert {live.resolve("m", i).version.spec.version for i in movers} == {"v2"}


def test_a_remembered_version_that_left_the_alias_or_went_to_zero_is_not_used(live_factory):
    clock = Clock()
    live = LiveModels(live_factory(0, 100), RecentAssignments(), clock)
    on_v2 = IDS[:200]
    assert {live.resolve("m", i).version.spec.version for i in on_v2} == {"v2"}
    live.swap(live_factory(100, 0, previous=live.current))  # rolled back: v2 takes no new requests
    assert {live.resolve("m", i).version.spec.version for i in on_v2} == {"v1"}
    live.swap(live_factory(0, 100, previous=live.current))
    live.swap(live_factory(100, 50, names=("v1", "v3"), previous=live.current))  # v2 gone from the alias
    assert {live.resolve("m", i).version.spec.version for i in on_v2} <= {"v1", "v3"}


def test_an_id_no_retry_brings_back_is_not_remembered(live_factory):
    """An attempt id (no Idempotency-Key) is unique: it gets the hashed
    choice and leaves the memory to the keys that can come back."""
    clock = Clock()
    assignments = RecentAssignments()
    live = LiveModels(live_factory(90, 10), assignments, clock)
    chosen = {i: live.resolve("m", i, remember=False).version.spec.version for i in IDS[:200]}
    assert chosen == {i: pick_version(alias(90, 10), i).version for i in IDS[:200]}
    assert len(assignments) == 0
    live.resolve("m", IDS[0])
    assert len(assignments) == 1
