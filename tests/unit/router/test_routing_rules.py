"""Small-model routing rules and the catalog's stand-in versions (fallbacks
and route targets): what a rule matches, how the catalog file reads them,
and that the registry refuses a stand-in with another tokenizer."""

import json
import shutil
from pathlib import Path

import pytest

from sluice.router.catalog import load_catalog
from sluice.router.models import ModelRegistry
from sluice.router.routing_rules import RouteRule, route_for

EASY = RouteRule("small", max_prompt_tokens=64, max_output_tokens=16)


@pytest.mark.parametrize(("prompt", "max_tokens", "expected"), [
    (64, 16, True),
    (65, 16, False),   # prompt over the bound
    (10, 17, False),   # output over the bound
    (10, 0, False),    # no max_tokens: nothing says the answer is short
])
def test_a_rule_bounds_prompt_and_output(prompt, max_tokens, expected):
    assert EASY.matches(prompt, max_tokens, "interactive", "acme") is expected


def test_a_rule_filters_on_class_and_tenant_allow_list():
    rule = RouteRule("small", classes=frozenset({"batch"}), tenants=frozenset({"acme"}))
    assert rule.matches(10_000, 0, "batch", "acme")
    assert not rule.matches(10, 4, "interactive", "acme")
    assert not rule.matches(10, 4, "batch", "globex")


def test_the_first_matching_rule_wins_and_none_leaves_the_alias_choice():
    rules = (RouteRule("tiny", max_prompt_tokens=8, max_output_tokens=4), EASY)
    assert route_for(rules, 8, 4, "interactive", "acme") == "tiny"
    assert route_for(rules, 30, 4, "interactive", "acme") == "small"
    assert route_for(rules, 300, 4, "interactive", "acme") is None
    assert route_for((), 1, 1, "interactive", "acme") is None


def test_rules_are_validated():
    with pytest.raises(ValueError, match="unknown classes"):
        RouteRule("small", classes=frozenset({"urgent"}))
    with pytest.raises(ValueError, match=">= 0"):
        RouteRule("small", max_prompt_tokens=-1)


def catalog_file(tmp_path: Path, big: Path, small: Path) -> Path:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [
        {"name": "m", "versions": [{"version": "big", "path": str(big), "fallback": "small"}]},
        {"name": "m-small", "versions": [{"version": "small", "path": str(small)}]},
        {"name": "auto", "versions": [{"version": "big", "path": str(big)}],
         "routes": [{"to": "small", "max_prompt_tokens": 64, "max_output_tokens": 16, "classes": ["interactive"]}]},
    ]}))
    return path


def test_the_catalog_reads_fallbacks_and_routes_and_names_each_versions_alias(tmp_path, tiny_model_dir, small_model_dir):
    registry = ModelRegistry(load_catalog(catalog_file(tmp_path, tiny_model_dir, small_model_dir)), 0.0)
    assert registry.version("big").spec.fallback == "small"
    assert registry.aliases["auto"].routes == (
        RouteRule("small", max_prompt_tokens=64, max_output_tokens=16, classes=frozenset({"interactive"})),)
    assert registry.alias_of("small") == "m-small"
    assert registry.alias_of("big") == "m"


def test_a_stand_in_with_another_tokenizer_is_refused_at_load(tmp_path, tiny_model_dir):
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[0]['content'] }}"  # another template: other token ids for the same chat
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="another tokenizer"):
        ModelRegistry(load_catalog(catalog_file(tmp_path, tiny_model_dir, other)), 0.0)


def test_a_stand_in_missing_from_the_catalog_is_refused_at_load(tmp_path, tiny_model_dir):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [
        {"name": "m", "versions": [{"version": "big", "path": str(tiny_model_dir), "fallback": "ghost"}]}]}))
    with pytest.raises(ValueError, match="ghost is not a version"):
        ModelRegistry(load_catalog(path), 0.0)
