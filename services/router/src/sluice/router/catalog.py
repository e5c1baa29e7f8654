"""Model aliases, their versions and rollout weights.

A catalog file looks like:

    {"models": [{"name": "tiny-llama",
                 "versions": [{"version": "tiny-llama-v1", "path": "/models/a", "weight": 90},
                              {"version": "tiny-llama-v2", "path": "/models/b", "weight": 10}]}]}

A request's version is chosen by hashing its id into the weights, so a
retry with the same idempotency key lands on the same version, and a
weight change moves only the ids in the slice of weight that moved
(pick_version).

A version may name a `fallback` (another version in the catalog, with the
same tokenizer): while its pool is overloaded, requests of tenants that
allow it are served there. An alias may carry `routes`
(sluice.router.routing_rules) that send easy requests to a smaller version.

The router re-reads the file while it runs (catalog_watch): everything
here is checked before a new catalog replaces the old one.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from sluice.router.routing_rules import RouteRule

_POINTS = 1 << 64  # a request id hashes to one of this many points: [0, 1) in 2^-64 steps


@dataclass(frozen=True, slots=True)
class ModelVersionSpec:
    version: str
    path: Path
    weight: int = 100
    fallback: str = ""  # the version that may serve its traffic in overload; "" = none


@dataclass(frozen=True, slots=True)
class ModelAliasSpec:
    name: str
    versions: tuple[ModelVersionSpec, ...]
    routes: tuple[RouteRule, ...] = ()

    def __post_init__(self) -> None:
        if not self.versions:
            raise ValueError(f"model {self.name} has no versions")
        if any(v.weight < 0 for v in self.versions) or sum(v.weight for v in self.versions) <= 0:
            raise ValueError(f"model {self.name}: weights must be >= 0 and not all 0")
        names = [v.version for v in self.versions]
        if len(set(names)) != len(names):
            raise ValueError(f"model {self.name} lists a version twice: {names}")

    def serves(self, version: str) -> bool:
        """Whether new requests of this alias may go to `version` (listed, weight > 0)."""
        return any(v.version == version and v.weight > 0 for v in self.versions)


def request_point(request_id: str) -> int:
    """The id's point in [0, 2^64): where it falls among the weight slices."""
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big")


def pick_version(alias: ModelAliasSpec, request_id: str) -> ModelVersionSpec:
    """Sticky weighted choice: the same request id always gets the same
    version under the same weights.

    The versions, in name order (not the file's, so reordering the file
    moves nothing), split [0, 1) into slices as wide as their share of the
    weight; the id's hash is a point in it:

        weights v1=90 v2=10:   [0 ........ v1 ........ 0.9) [0.9 v2 1)
        weights v1=75 v2=25:   [0 ...... v1 ...... 0.75) [0.75 .. v2 .. 1)

    so shifting weight between neighbours moves exactly the ids in the
    shifted slice (0.75-0.9 above), and scaling every weight alike moves
    none. Integer arithmetic: no rounding at a slice's edge.
    """
    total = sum(v.weight for v in alias.versions)
    scaled_point = request_point(request_id) * total  # point / 2^64 < cumulative / total, without division
    cumulative = 0
    for version in sorted(alias.versions, key=lambda v: v.version):
        cumulative += version.weight
        if scaled_point < cumulative * _POINTS:
            return version
    raise AssertionError("unreachable: every point is below the whole weight")


def parse_catalog(text: str, source: str) -> tuple[ModelAliasSpec, ...]:
    """The catalog in `text` (a file's content; `source` names it in errors),
    checked as a whole: a ValueError says what is wrong."""
    try:
        document = json.loads(text)
        catalog = tuple(
            ModelAliasSpec(
                name=model["name"],
                versions=tuple(
                    ModelVersionSpec(v["version"], Path(v["path"]), int(v.get("weight", 100)), v.get("fallback", ""))
                    for v in model["versions"]
                ),
                routes=tuple(RouteRule.from_document(r) for r in model.get("routes", ())),
            )
            for model in document["models"]
        )
        _check_whole(catalog)
        return catalog
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"invalid model catalog {source}: {error}") from error


def _check_whole(catalog: tuple[ModelAliasSpec, ...]) -> None:
    """What no single alias can check: names unique, a version one model."""
    if not catalog:
        raise ValueError("no models")
    names = [alias.name for alias in catalog]
    if len(set(names)) != len(names):
        raise ValueError(f"a model name is listed twice: {names}")
    paths: dict[str, Path] = {}
    for alias in catalog:
        for spec in alias.versions:
            if paths.setdefault(spec.version, spec.path) != spec.path:
                raise ValueError(f"version {spec.version} has two paths: {paths[spec.version]} and {spec.path}")


def load_catalog(path: Path) -> tuple[ModelAliasSpec, ...]:
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"invalid model catalog {path}: {error}") from error
    return parse_catalog(text, str(path))


def single_model_catalog(name: str, version: str, path: Path) -> tuple[ModelAliasSpec, ...]:
    return (ModelAliasSpec(name, (ModelVersionSpec(version, path),)),)
