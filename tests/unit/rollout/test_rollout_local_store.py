import json
from pathlib import Path

import pytest

from sluice.rollout.local_store import LocalCatalogStore
from sluice.rollout.machine import Command, Phase
from sluice.rollout.records import StatusRecord
from sluice.rollout.store import StoreError
from sluice.rollout.weights import CatalogError, alias_weights, check_rollout, with_weights
from sluice.router.catalog import load_catalog


def catalog_document(v1_weight: int = 100, v2_weight: int = 0, v3_weight: int = 0) -> dict:
    return {"models": [
        {"name": "tiny-llama", "versions": [
            {"version": "tiny-llama-v1", "path": "/models/v1", "weight": v1_weight, "fallback": "tiny-llama-v3"},
            {"version": "tiny-llama-v2", "path": "/models/v2", "weight": v2_weight},
            {"version": "tiny-llama-v3", "path": "/models/v3", "weight": v3_weight},
        ], "routes": [{"to": "tiny-llama-v3", "max_prompt_tokens": 64}]},
        {"name": "other", "versions": [{"version": "other-v1", "path": "/models/o"}]},
    ]}


def write_catalog(tmp_path: Path, document: dict) -> Path:
    path = tmp_path / "models.json"
    path.write_text(json.dumps(document))
    return path


def test_with_weights_changes_the_pair_only_and_keeps_everything_else():
    before = catalog_document()
    after = with_weights(before, "tiny-llama", "tiny-llama-v1", "tiny-llama-v2", 25)
    assert before == catalog_document()  # not modified in place
    assert alias_weights(after, "tiny-llama").weights == (
        ("tiny-llama-v1", 75), ("tiny-llama-v2", 25), ("tiny-llama-v3", 0))
    expected = catalog_document(75, 25)
    assert after == expected  # paths, fallbacks, routes, the other alias untouched


@pytest.mark.parametrize("alias, serving, candidate, message", [
    ("nope", "tiny-llama-v1", "tiny-llama-v2", "no alias 'nope'"),
    ("tiny-llama", "tiny-llama-v1", "tiny-llama-v9", "candidate version 'tiny-llama-v9'"),
    ("tiny-llama", "other-v1", "tiny-llama-v2", "serving version 'other-v1'"),
])
def test_a_rollout_the_catalog_cannot_carry_is_refused_by_name(alias, serving, candidate, message):
    with pytest.raises(CatalogError, match=message):
        check_rollout(catalog_document(), alias, serving, candidate)


def test_a_third_version_with_traffic_is_refused():
    with pytest.raises(CatalogError, match=r"tiny-llama-v3 \(10\)"):
        check_rollout(catalog_document(90, 0, 10), "tiny-llama", "tiny-llama-v1", "tiny-llama-v2")


def test_the_local_store_writes_a_catalog_the_router_loads(tmp_path):
    path = write_catalog(tmp_path, catalog_document())
    store = LocalCatalogStore(path)
    store.write_weights("tiny-llama", "tiny-llama-v1", "tiny-llama-v2", 5)
    aliases = {alias.name: alias for alias in load_catalog(path)}
    assert [(v.version, v.weight) for v in aliases["tiny-llama"].versions] == [
        ("tiny-llama-v1", 95), ("tiny-llama-v2", 5), ("tiny-llama-v3", 0)]
    assert aliases["tiny-llama"].versions[0].fallback == "tiny-llama-v3"
    # Atomic replace leaves no temporary file behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models.json"]


def test_commands_get_increasing_sequence_numbers_and_status_round_trips(tmp_path):
    store = LocalCatalogStore(write_catalog(tmp_path, catalog_document()))
    assert store.read_command() is None and store.read_status() is None
    first = store.send_command(Command.PAUSE, "2030-01-01T00:00:00+00:00")
    second = store.send_command(Command.RESUME, "2030-01-01T00:01:00+00:00")
    assert (first.seq, second.seq) == (1, 2)
    assert store.read_command() == second
    status = StatusRecord("tiny-llama", "tiny-llama-v1", "tiny-llama-v2", Phase.PAUSED, 25, (1, 5, 25, 50, 100), 2,
                          "", "paused by the operator", "2030-01-01T00:00:00+00:00")
    store.write_status(status)
    assert store.read_status() == status
    assert "[25]" in status.describe() and "paused" in status.describe()


def test_unreadable_files_are_store_errors_naming_the_path(tmp_path):
    store = LocalCatalogStore(tmp_path / "missing.json")
    with pytest.raises(StoreError, match="missing.json"):
        store.read_catalog()
    path = write_catalog(tmp_path, catalog_document())
    store = LocalCatalogStore(path)
    store.command_path.write_text("{not json")
    with pytest.raises(StoreError, match="rollout-command"):
        store.read_command()
    path.write_text('{"no": "models"}')
    with pytest.raises(CatalogError, match='no "models" list'):
        store.read_catalog()
