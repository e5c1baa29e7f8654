"""The loaded side of the catalog: each version's tokenizer and limits.

A registry is one catalog, loaded: it never changes after it is built. A
reload builds a new one beside it (reusing the loaded tokenizers of the
versions it keeps) and swaps it in whole (live_models).
"""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from sluice.outcomes import Reason
from sluice.router.catalog import ModelAliasSpec, ModelVersionSpec
from sluice.rpc.errors import ServiceError
from sluice.tokenization.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class LoadedVersion:
    spec: ModelVersionSpec
    tokenizer: Tokenizer
    context_length_tokens: int
    tokenizer_digest: str  # of TOKENIZER_FILES: versions that share traffic must agree


# What decides the token ids a version reads and the chat template that
# makes them: versions that share traffic (fallbacks, routes) must agree.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def tokenizer_digest(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.exists():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _context_length(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    return int(config.get("max_position_embeddings") or config.get("max_sequence_length") or 2048)


def load_version(spec: ModelVersionSpec, previous: LoadedVersion | None = None) -> LoadedVersion:
    """`spec` loaded: a version already loaded from the same path keeps its
    tokenizer (a version's files do not change under its name; a new
    model is a new version), with the new spec's weight and fallback."""
    if previous is not None and previous.spec.path == spec.path:
        return LoadedVersion(spec, previous.tokenizer, previous.context_length_tokens, previous.tokenizer_digest)
    return LoadedVersion(spec, Tokenizer.from_pretrained(spec.path), _context_length(spec.path),
                         tokenizer_digest(spec.path))


class ModelRegistry:
    """Aliases -> loaded versions, of one catalog; read-only once built.

    `previous` (the registry this one replaces) lends the versions both
    list their loaded tokenizers, and the aliases both list their created
    time. Any error (a model directory that cannot be read, a stand-in
    with another tokenizer) raises before anything is returned."""

    def __init__(self, catalog: tuple[ModelAliasSpec, ...], created_unix_s: float,
                 previous: "ModelRegistry | None" = None) -> None:
        self.aliases = {alias.name: alias for alias in catalog}
        self.created_unix_s = created_unix_s
        self._created_unix_s = {
            name: previous.alias_created_unix_s(name) if previous is not None and name in previous.aliases
            else created_unix_s
            for name in self.aliases
        }
        self._versions: dict[str, LoadedVersion] = {}
        # The alias a version's response names when it serves another's
        # traffic: the first alias that lists it.
        self._alias_of: dict[str, str] = {}
        for alias in catalog:
            for spec in alias.versions:
                self._alias_of.setdefault(spec.version, alias.name)
                if spec.version not in self._versions:
                    kept = previous._versions.get(spec.version) if previous is not None else None
                    self._versions[spec.version] = load_version(spec, kept)
        for alias in catalog:
            for spec in alias.versions:
                if spec.fallback:
                    self._check_stand_in(spec.version, spec.fallback, "fallback")
            for rule in alias.routes:
                for spec in alias.versions:
                    self._check_stand_in(spec.version, rule.to, f"route of {alias.name}")

    def _check_stand_in(self, version: str, stand_in: str, role: str) -> None:
        if stand_in not in self._versions:
            raise ValueError(f"{version}: the {role} {stand_in} is not a version in the catalog")
        if self._versions[version].tokenizer_digest != self._versions[stand_in].tokenizer_digest:
            raise ValueError(
                f"{version}: the {role} {stand_in} has another tokenizer; a version that takes "
                "another's traffic must read the same token ids")

    def version(self, name: str) -> LoadedVersion:
        return self._versions[name]

    def has_version(self, name: str) -> bool:
        return name in self._versions

    def alias_created_unix_s(self, alias_name: str) -> float:
        """When the alias first appeared in this router's catalog (ListModels' `created`)."""
        return self._created_unix_s[alias_name]

    def alias_of(self, version: str) -> str:
        return self._alias_of[version]

    def alias(self, alias_name: str) -> ModelAliasSpec:
        alias = self.aliases.get(alias_name)
        if alias is None:
            raise ServiceError.of(Reason.MODEL_NOT_FOUND, f"The model `{alias_name}` does not exist.")
        return alias

    def versions_of(self, alias_name: str) -> list[LoadedVersion]:
        return [self._versions[spec.version] for spec in self.aliases[alias_name].versions]
