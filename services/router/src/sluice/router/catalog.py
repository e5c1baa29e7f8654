"""Model aliases, their versions and rollout weights.

A catalog file looks like:

    {"models": [{"name": "tiny-llama",
                 "versions": [{"version": "tiny-llama-v1", "path": "/models/a", "weight": 90},
                              {"version": "tiny-llama-v2", "path": "/models/b", "weight": 10}]}]}

A request's version is chosen by hashing its id into the weights, so a
retry with the same idempotency key lands on the same version.

A version may name a `fallback` (another version in the catalog, with the
same tokenizer): while its pool is overloaded, requests of tenants that
allow it are served there. An alias may carry `routes`
(sluice.router.routing_rules) that send easy requests to a smaller version.
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from sluice.router.routing_rules import RouteRule


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


def pick_version(alias: ModelAliasSpec, request_id: str) -> ModelVersionSpec:
    """Sticky weighted choice: the same request id always gets the same version."""
    total = sum(v.weight for v in alias.versions)
    digest = hashlib.sha256(request_id.encode()).digest()
    point = int.from_bytes(digest[:8], "big") % total
    for version in alias.versions:
        if point < version.weight:
            return version
        point -= version.weight
    raise AssertionError("unreachable: point < total weight")


def load_catalog(path: Path) -> tuple[ModelAliasSpec, ...]:
    try:
        document = json.loads(path.read_text())
        return tuple(
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
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"invalid model catalog {path}: {error}") from error


def single_model_catalog(name: str, version: str, path: Path) -> tuple[ModelAliasSpec, ...]:
    return (ModelAliasSpec(name, (ModelVersionSpec(version, path),)),)
