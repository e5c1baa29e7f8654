"""The router's catalog watch on a real file and the real registry (the tiny
models' tokenizers): a content change applies without a restart, a bad one
is refused once and the last good catalog keeps serving, one refused only
because a version's files are not there yet is tried again and applies when
they arrive, a request keeps the version it resolved to across the swap,
ListModels shows the new catalog, and the metrics say what is live."""

import json
import logging
import shutil
from pathlib import Path

import pytest

import sluice.router.catalog_watch as catalog_watch
from sluice.router.catalog import parse_catalog
from sluice.router.catalog_watch import CatalogFile, CatalogWatch, describe_change, publish
from sluice.router.live_models import LiveModels
from sluice.router.metrics import RouterMetrics
from sluice.router.models import ModelRegistry
from sluice.router.servicer import RouterServicer
from sluice.v1 import router_pb2


def catalog_text(big: Path, small: Path, w1: int, w2: int, *, extra_alias: bool = False, v2: str = "v2") -> str:
    models = [{"name": "m", "versions": [{"version": "v1", "path": str(big), "weight": w1},
                                          {"version": v2, "path": str(small), "weight": w2}]}]
    if extra_alias:
        models.append({"name": "m-small", "versions": [{"version": v2, "path": str(small)}]})
    return json.dumps({"models": models})


class Clock:
    now_unix_s = 1000.0

    def __call__(self) -> float:
        return self.now_unix_s


RETRY_EVERY_POLLS = 3


@pytest.fixture
def watched(tmp_path, tiny_model_dir, small_model_dir):
    path = tmp_path / "models.json"
    path.write_text(catalog_text(tiny_model_dir, small_model_dir, 100, 0))
    found = CatalogFile.read(path)
    metrics = RouterMetrics.create()
    live = LiveModels(ModelRegistry(parse_catalog(found.text, str(path)), created_unix_s=1.0))
    publish(metrics, live.current, live.generation, found.hash_value, 1.0)
    clock = Clock()
    watch = CatalogWatch(path, live, metrics, interval_s=0.1, applied=found, clock_unix_s=clock,
                         retry_every_polls=RETRY_EVERY_POLLS)
    return path, live, metrics, watch, clock


@pytest.fixture
def registry_builds(monkeypatch) -> list[int]:
    """How many times the watch tried to load a catalog (the real registry still loads it)."""
    builds: list[int] = []

    def counted(*args, **kwargs):
        builds.append(1)
        return ModelRegistry(*args, **kwargs)

    monkeypatch.setattr(catalog_watch, "ModelRegistry", counted)
    return builds


def copy_tokenizer_files(source: Path, target: Path) -> None:
    """What the chart's copy sidecar leaves: the small files, tokenizer.json last."""
    target.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json"):
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)


def rejection_logs(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]


def sample(metrics: RouterMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def weights(live: LiveModels) -> dict[str, int]:
    return {v.version: v.weight for v in live.current.aliases["m"].versions}


async def test_a_weight_change_applies_and_kept_versions_keep_their_tokenizer(
        watched, tiny_model_dir, small_model_dir):
    path, live, metrics, watch, clock = watched
    before = live.current
    assert await watch.check() == "unchanged"
    path.write_text(catalog_text(tiny_model_dir, small_model_dir, 0, 100))
    clock.now_unix_s = 2000.0
    assert await watch.check() == "applied"
    assert weights(live) == {"v1": 0, "v2": 100}
    assert live.current.version("v1").tokenizer is before.version("v1").tokenizer  # not read again
    assert {live.resolve("m", f"id-{i}").version.spec.version for i in range(50)} == {"v2"}
    assert await watch.check() == "unchanged"
    assert sample(metrics, "sluice_router_catalog_reloads_total", outcome="applied") == 1
    assert sample(metrics, "sluice_router_catalog_reloads_total", outcome="rejected") == 0
    assert sample(metrics, "sluice_router_catalog_generation") == 2
    assert sample(metrics, "sluice_router_catalog_applied_timestamp_seconds") == 2000.0
    assert sample(metrics, "sluice_router_catalog_content_hash") == CatalogFile.read(path).hash_value
    assert sample(metrics, "sluice_router_catalog_weight_ratio", model="m", version="v2") == 1.0


async def test_a_bad_catalog_is_refused_once_and_the_last_good_one_serves(
        watched, tiny_model_dir, caplog, tmp_path):
    path, live, metrics, watch, _ = watched
    before = live.current
    bad_contents = [
        '{"models": [{"name": "m", "versions": [',  # cut short
        catalog_text(tiny_model_dir, tmp_path / "no-such-model", 50, 50),  # a new version's files missing
        catalog_text(tiny_model_dir, tiny_model_dir, 0, 0),  # no weight at all
    ]
    with caplog.at_level(logging.ERROR, logger="sluice.router.catalog_watch"):
        for content in bad_contents:
            path.write_text(content)
            assert await watch.check() == "rejected"
            assert await watch.check() == "unchanged"  # the same bad bytes: not counted or logged again
    assert live.current is before and live.generation == 1
    assert len([r for r in caplog.records if "rejected" in r.getMessage()]) == len(bad_contents)
    assert sample(metrics, "sluice_router_catalog_reloads_total", outcome="rejected") == len(bad_contents)
    assert sample(metrics, "sluice_router_catalog_generation") == 1
    path.unlink()  # gone: refused too, the catalog in memory stays
    assert await watch.check() == "rejected" and live.current is before


async def test_a_catalog_refused_for_missing_files_is_retried_and_applies_when_they_arrive(
        watched, tiny_model_dir, small_model_dir, tmp_path, caplog, registry_builds):
    path, live, metrics, watch, _ = watched
    arriving = tmp_path / "arriving" / "v2"  # named by the catalog before its files are there
    path.write_text(catalog_text(tiny_model_dir, arriving, 50, 50))
    with caplog.at_level(logging.ERROR, logger="sluice.router.catalog_watch"):
        assert await watch.check() == "rejected"
        # Still missing: tried again on the RETRY_EVERY_POLLS-th poll only, never counted again.
        assert [await watch.check() for _ in range(RETRY_EVERY_POLLS)] == ["unchanged"] * RETRY_EVERY_POLLS
        assert len(registry_builds) == 2
        copy_tokenizer_files(small_model_dir, arriving)
        assert [await watch.check() for _ in range(RETRY_EVERY_POLLS - 1)] == ["unchanged"] * (RETRY_EVERY_POLLS - 1)
        assert live.generation == 1 and len(registry_builds) == 2
        assert await watch.check() == "applied"  # the next retry finds the files
    assert weights(live) == {"v1": 50, "v2": 50}
    assert live.current.version("v2").spec.path == arriving
    (message,) = rejection_logs(caplog)  # logged once
    assert "retried every 3 polls" in message and "tokenizer.json" in message
    assert sample(metrics, "sluice_router_catalog_reloads_total", outcome="rejected") == 1
    assert sample(metrics, "sluice_router_catalog_reloads_total", outcome="applied") == 1
    assert await watch.check() == "unchanged"


async def test_a_catalog_refused_for_a_permanent_cause_is_not_tried_again_until_it_changes(
        watched, tiny_model_dir, small_model_dir, tmp_path, registry_builds):
    path, live, metrics, watch, _ = watched
    other = tmp_path / "other-tokenizer"
    copy_tokenizer_files(tiny_model_dir, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[0]['content'] }}"  # other token ids for the same chat
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    mismatch = json.loads(catalog_text(tiny_model_dir, other, 50, 50))
    mismatch["models"][0]["versions"][1]["fallback"] = "v1"  # a stand-in must share the tokenizer
    path.write_text(json.dumps(mismatch))
    assert await watch.check() == "rejected"
    assert [await watch.check() for _ in range(3 * RETRY_EVERY_POLLS)] == ["unchanged"] * (3 * RETRY_EVERY_POLLS)
    assert len(registry_builds) == 1  # the same bytes are never loaded again
    mismatch["models"][0]["versions"][1].pop("fallback")  # the operator fixes it: new content, tried at once
    path.write_text(json.dumps(mismatch))
    assert await watch.check() == "applied" and len(registry_builds) == 2
    assert sample(metrics, "sluice_router_catalog_reloads_total", outcome="rejected") == 1


async def test_files_that_arrive_wrong_turn_a_retried_catalog_into_a_permanent_refusal(
        watched, tiny_model_dir, tmp_path, caplog, registry_builds):
    path, live, metrics, watch, _ = watched
    arriving = tmp_path / "arriving" / "v2"
    catalog = json.loads(catalog_text(tiny_model_dir, arriving, 50, 50))
    catalog["models"][0]["versions"][1]["fallback"] = "v1"
    path.write_text(json.dumps(catalog))
    with caplog.at_level(logging.ERROR, logger="sluice.router.catalog_watch"):
        assert await watch.check() == "rejected"
        copy_tokenizer_files(tiny_model_dir, arriving)
        config = json.loads((arriving / "tokenizer_config.json").read_text())
        config["chat_template"] = "{{ messages[0]['content'] }}"
        (arriving / "tokenizer_config.json").write_text(json.dumps(config))
        assert [await watch.check() for _ in range(RETRY_EVERY_POLLS)] == ["unchanged"] * RETRY_EVERY_POLLS
        assert len(registry_builds) == 2  # retried once, now fails on the tokenizer
        assert [await watch.check() for _ in range(3 * RETRY_EVERY_POLLS)] == ["unchanged"] * (3 * RETRY_EVERY_POLLS)
    assert len(registry_builds) == 2  # not retried any more
    first, last = rejection_logs(caplog)
    assert "retried every" in first and "no longer retried" in last and "another tokenizer" in last
    assert sample(metrics, "sluice_router_catalog_reloads_total", outcome="rejected") == 1
    assert live.generation == 1


def test_a_retry_cadence_below_one_poll_is_refused(tmp_path, tiny_model_dir, small_model_dir):
    path = tmp_path / "models.json"
    path.write_text(catalog_text(tiny_model_dir, small_model_dir, 100, 0))
    found = CatalogFile.read(path)
    live = LiveModels(ModelRegistry(parse_catalog(found.text, str(path)), created_unix_s=1.0))
    with pytest.raises(ValueError, match="retry_every_polls"):
        CatalogWatch(path, live, RouterMetrics.create(), 0.1, found, retry_every_polls=0)


async def test_a_resolved_request_keeps_its_version_after_it_leaves_the_catalog(
        watched, tiny_model_dir, small_model_dir):
    path, live, metrics, watch, _ = watched
    path.write_text(catalog_text(tiny_model_dir, small_model_dir, 50, 50))
    assert await watch.check() == "applied"
    in_flight = next(r for r in (live.resolve("m", f"id-{i}") for i in range(100)) if r.version.spec.version == "v2")
    path.write_text(catalog_text(tiny_model_dir, small_model_dir, 100, 50, v2="v3"))  # v2 replaced by v3
    assert await watch.check() == "applied"
    assert not live.current.has_version("v2")
    assert in_flight.registry.version("v2") is in_flight.version  # its snapshot still has all it needs
    assert in_flight.version.tokenizer.encode("hello")
    assert {live.resolve("m", f"id-{i}").version.spec.version for i in range(100)} <= {"v1", "v3"}
    assert sample(metrics, "sluice_router_catalog_weight_ratio", model="m", version="v2") is None  # series gone


async def test_list_models_shows_the_live_catalog(watched, tiny_model_dir, small_model_dir):
    path, live, _, watch, clock = watched
    servicer = RouterServicer(relay=None, models=live)  # ListModels reads only the catalog
    listed = await servicer.ListModels(router_pb2.ListModelsRequest(), None)
    assert [m.id for m in listed.models] == ["m"]
    path.write_text(catalog_text(tiny_model_dir, small_model_dir, 90, 10, extra_alias=True))
    clock.now_unix_s = 5000.0
    assert await watch.check() == "applied"
    listed = {m.id: m for m in (await servicer.ListModels(router_pb2.ListModelsRequest(), None)).models}
    assert sorted(listed) == ["m", "m-small"]
    assert listed["m"].created_unix_s == 1.0  # an alias kept keeps its created time
    assert listed["m-small"].created_unix_s == 5000.0
    assert list(listed["m-small"].versions) == ["v2"]


def test_describe_change_names_what_moved(tiny_model_dir, small_model_dir):
    old = {a.name: a for a in parse_catalog(catalog_text(tiny_model_dir, small_model_dir, 90, 10), "old")}
    new = {a.name: a for a in parse_catalog(
        catalog_text(tiny_model_dir, small_model_dir, 75, 25, extra_alias=True), "new")}
    assert describe_change(old, new) == "added ['m-small']; m: v1 90->75, v2 10->25"
    assert describe_change(old, old) == "no change in aliases or weights"
