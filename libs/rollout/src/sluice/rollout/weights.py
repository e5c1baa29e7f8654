"""Reading and rewriting the rollout weights in a routing catalog document
(the router's format, sluice.router.catalog; pure).

    {"models": [{"name": "tiny-llama",
                 "versions": [{"version": "tiny-llama-v1", "path": "...", "weight": 100},
                              {"version": "tiny-llama-v2", "path": "...", "weight": 0}]}]}

Only the two versions' `weight`s change; every other key (paths,
fallbacks, routes, other aliases) is kept as it was, so a rollout never
undoes an edit someone else made to the catalog meanwhile.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class CatalogError(ValueError):
    """The catalog cannot carry this rollout (names what is wrong)."""


@dataclass(frozen=True, slots=True)
class AliasWeights:
    """The weights of one alias's versions, in catalog order."""

    alias: str
    weights: tuple[tuple[str, int], ...]  # (version, weight)

    def of(self, version: str) -> int:
        return dict(self.weights)[version]

    def candidate_pct(self, serving: str, candidate: str) -> float:
        """The candidate's share of the pair's traffic, in percent."""
        total = self.of(serving) + self.of(candidate)
        return 100.0 * self.of(candidate) / total if total else 0.0


def parse_catalog(text: str, source: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except ValueError as error:
        raise CatalogError(f"{source} is not JSON: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("models"), list):
        raise CatalogError(f'{source} has no "models" list')
    return document


def render_catalog(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"


def alias_weights(document: dict[str, Any], alias: str) -> AliasWeights:
    model = _alias(document, alias)
    return AliasWeights(alias, tuple((str(v["version"]), int(v.get("weight", 100))) for v in model["versions"]))


def check_rollout(document: dict[str, Any], alias: str, serving: str, candidate: str) -> AliasWeights:
    """The alias's weights, if this pair can be rolled out in it: both
    versions listed, and no third version with traffic (a step's
    percentage would not be the candidate's share of the alias then)."""
    weights = alias_weights(document, alias)
    names = [name for name, _ in weights.weights]
    for version, role in ((serving, "serving"), (candidate, "candidate")):
        if version not in names:
            raise CatalogError(f"{role} version {version!r} is not a version of {alias!r} (it has {', '.join(names)})")
    others = [f"{name} ({weight})" for name, weight in weights.weights if name not in (serving, candidate) and weight]
    if others:
        raise CatalogError(f"{alias!r} routes traffic to versions outside the rollout: {', '.join(others)}; "
                           "set their weight to 0 first")
    return weights


def with_weights(document: dict[str, Any], alias: str, serving: str, candidate: str,
                 candidate_pct: int) -> dict[str, Any]:
    """A copy of the document with the pair's weights at
    (100 - candidate_pct, candidate_pct); the input is not modified."""
    if not 0 <= candidate_pct <= 100:
        raise CatalogError(f"a weight share must be within 0..100, got {candidate_pct}")
    check_rollout(document, alias, serving, candidate)
    copy = json.loads(json.dumps(document))
    wanted = {serving: 100 - candidate_pct, candidate: candidate_pct}
    for version in _alias(copy, alias)["versions"]:
        if version["version"] in wanted:
            version["weight"] = wanted[version["version"]]
    return copy


def _alias(document: dict[str, Any], alias: str) -> dict[str, Any]:
    models = document.get("models")
    if not isinstance(models, list):
        raise CatalogError('the catalog has no "models" list')
    for model in models:
        if isinstance(model, dict) and model.get("name") == alias:
            if not isinstance(model.get("versions"), list):
                raise CatalogError(f'{alias!r} has no "versions" list')
            return model
    names = [m.get("name") for m in models if isinstance(m, dict)]
    raise CatalogError(f"no alias {alias!r} in the catalog (it has {', '.join(map(str, names)) or 'none'})")
