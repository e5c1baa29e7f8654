"""The model catalog a local stack's router reads (SLUICE_MODELS_FILE),
and how its weights are rewritten while the stack runs.

The file is the router's own format (sluice.router.catalog), one alias
here:

    {"models": [{"name": "tiny-llama",
                 "versions": [{"version": "tiny-llama-v1", "path": ".../tiny-llama", "weight": 90},
                              {"version": "tiny-llama-v2", "path": ".../tiny-llama-small", "weight": 10}]}]}

The router polls the file's content and applies a change without a
restart. Writes go to a temporary file beside it and are renamed over it,
so the router never reads half a catalog (as kubelet's `..data` symlink
swap does for a mounted ConfigMap).

This module does not import the router: the devstack runs the services
as processes and only writes what they read.
"""

import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

DEFAULT_ALIAS = "tiny-llama"
V1, V2 = "tiny-llama-v1", "tiny-llama-v2"


@dataclass(frozen=True, slots=True)
class CatalogVersion:
    version: str      # the replica serving it reports this (SLUICE_MODEL_VERSION)
    model_dir: Path
    weight: int = 100  # share of the alias's new requests, relative to the others'


@dataclass(frozen=True, slots=True)
class LocalCatalog:
    """One alias and its versions; replica i of a stack serves versions[i % len]."""

    alias: str
    versions: tuple[CatalogVersion, ...]

    def __post_init__(self) -> None:
        if not self.versions:
            raise ValueError(f"catalog alias {self.alias} has no versions")
        names = [v.version for v in self.versions]
        if len(set(names)) != len(names):
            raise ValueError(f"catalog alias {self.alias} names a version twice: {names}")
        if any(v.weight < 0 for v in self.versions) or not any(v.weight for v in self.versions):
            raise ValueError(f"catalog alias {self.alias}: weights must be >= 0 and not all 0")

    def with_weights(self, *weights: int) -> "LocalCatalog":
        """The same versions with these weights, in version order."""
        if len(weights) != len(self.versions):
            raise ValueError(f"{len(self.versions)} versions, {len(weights)} weights given")
        return replace(self, versions=tuple(replace(v, weight=w) for v, w in zip(self.versions, weights)))

    def document(self) -> dict:
        return {"models": [{"name": self.alias, "versions": [
            {"version": v.version, "path": str(v.model_dir), "weight": v.weight} for v in self.versions
        ]}]}

    def write(self, path: Path) -> None:
        write_atomically(path, json.dumps(self.document(), indent=2) + "\n")


def two_versions(model_dir: Path, small_model_dir: Path, weights: tuple[int, int] = (100, 0)) -> LocalCatalog:
    """`tiny-llama` served by the 4-layer model (v1) and the 2-layer one
    with the same tokenizer (v2): what `make run CATALOG=two-versions` runs."""
    return LocalCatalog(DEFAULT_ALIAS, (
        CatalogVersion(V1, model_dir, weights[0]),
        CatalogVersion(V2, small_model_dir, weights[1]),
    ))


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one rename: a reader sees the old
    content or the new, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def set_weights(path: Path, weights: dict[str, int]) -> dict:
    """Rewrite the weights of the named versions in any catalog file (every
    alias that lists them), leaving the rest of it as it is. Unknown
    version names and negative weights are refused before anything is written."""
    document = json.loads(path.read_text())
    listed = {v["version"] for model in document["models"] for v in model["versions"]}
    unknown = set(weights) - listed
    if unknown:
        raise ValueError(f"{path} lists no version {sorted(unknown)}; it has {sorted(listed)}")
    if any(weight < 0 for weight in weights.values()):
        raise ValueError(f"weights must be >= 0: {weights}")
    for model in document["models"]:
        for version in model["versions"]:
            if version["version"] in weights:
                version["weight"] = weights[version["version"]]
        if not any(int(v.get("weight", 100)) for v in model["versions"]):
            raise ValueError(f"alias {model['name']} would have all weights 0")
    write_atomically(path, json.dumps(document, indent=2) + "\n")
    return document
