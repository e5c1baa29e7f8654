import json
from collections import Counter
from pathlib import Path

import grpc
import pytest

from sluice.router.catalog import ModelAliasSpec, ModelVersionSpec, load_catalog, pick_version
from sluice.router.limits import check_class_prompt_cap, output_budget_tokens
from sluice.rpc.errors import ServiceError


def test_version_choice_is_sticky_and_follows_weights():
    alias = ModelAliasSpec("m", (ModelVersionSpec("v1", Path("a"), 90), ModelVersionSpec("v2", Path("b"), 10)))
    assert pick_version(alias, "same-key") == pick_version(alias, "same-key")
    counts = Counter(pick_version(alias, f"req-{i}").version for i in range(4000))
    assert 0.07 < counts["v2"] / 4000 < 0.13


def test_zero_weight_version_gets_nothing():
    alias = ModelAliasSpec("m", (ModelVersionSpec("v1", Path("a"), 100), ModelVersionSpec("v2", Path("b"), 0)))
    assert {pick_version(alias, str(i)).version for i in range(500)} == {"v1"}


def test_catalog_file_round_trip_and_errors(tmp_path):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [{"name": "m", "versions": [{"version": "v1", "path": "/x"}]}]}))
    (alias,) = load_catalog(path)
    assert alias.versions[0] == ModelVersionSpec("v1", Path("/x"), 100)
    path.write_text(json.dumps({"models": [{"name": "m", "versions": []}]}))
    with pytest.raises(ValueError, match="no versions"):
        load_catalog(path)


def test_output_budget():
    assert output_budget_tokens(100, 0, 4096) == 3996
    assert output_budget_tokens(100, 50, 4096) == 50
    for prompt, requested in [(4096, 0), (4000, 200)]:
        with pytest.raises(ServiceError) as refused:
            output_budget_tokens(prompt, requested, 4096)
        assert refused.value.info.status == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.info.reason == "context_length_exceeded"


def test_class_prompt_cap():
    check_class_prompt_cap(500, 0, "interactive")  # no cap
    check_class_prompt_cap(500, 500, "interactive")
    with pytest.raises(ServiceError) as refused:
        check_class_prompt_cap(501, 500, "interactive")
    assert refused.value.info.reason == "context_length_exceeded"


@pytest.mark.parametrize("models, message", [
    ([], "no models"),
    ([{"name": "m", "versions": [{"version": "v1", "path": "/x"}]}] * 2, "listed twice"),
    ([{"name": "m", "versions": [{"version": "v1", "path": "/x"}, {"version": "v1", "path": "/x"}]}], "version twice"),
    ([{"name": "m", "versions": [{"version": "v1", "path": "/x"}]},
      {"name": "n", "versions": [{"version": "v1", "path": "/y"}]}], "two paths"),
    ([{"name": "m", "versions": [{"version": "v1", "path": "/x", "weight": "lots"}]}], "lots"),
    ([{"name": "m", "versions": [{"version": "v1", "path": "/x", "weight": -1}]}], "weights"),
    ({"name": "m"}, "invalid model catalog"),
])
def test_a_catalog_is_checked_as_a_whole(tmp_path, models, message):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": models}))
    with pytest.raises(ValueError, match=message):
        load_catalog(path)


def test_unreadable_or_malformed_files_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="invalid model catalog"):
        load_catalog(tmp_path / "missing.json")
    (tmp_path / "cut.json").write_text('{"models": [{"name": "m", "versions": [')
    with pytest.raises(ValueError, match="invalid model catalog"):
        load_catalog(tmp_path / "cut.json")
