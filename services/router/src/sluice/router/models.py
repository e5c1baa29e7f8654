"""The loaded side of the catalog: each version's tokenizer and limits."""

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from sluice.outcomes import Reason
from sluice.router.catalog import ModelAliasSpec, ModelVersionSpec, pick_version
from sluice.rpc.errors import ServiceError
from sluice.tokenization.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class LoadedVersion:
    spec: ModelVersionSpec
    tokenizer: Tokenizer
    context_length_tokens: int


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


class ModelRegistry:
    """Aliases -> loaded versions. Built once at start-up; read-only after."""

    def __init__(self, catalog: tuple[ModelAliasSpec, ...], created_unix_s: float) -> None:
        self.aliases = {alias.name: alias for alias in catalog}
        self.created_unix_s = created_unix_s
        self._versions: dict[str, LoadedVersion] = {}
        # The alias a version's response names when it serves another's
        # traffic: the first alias that lists it.
        self._alias_of: dict[str, str] = {}
        for alias in catalog:
            for spec in alias.versions:
                self._alias_of.setdefault(spec.version, alias.name)
                if spec.version not in self._versions:
                    self._versions[spec.version] = LoadedVersion(
                        spec, Tokenizer.from_pretrained(spec.path), _context_length(spec.path)
                    )
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
        if tokenizer_digest(self._versions[version].spec.path) != tokenizer_digest(self._versions[stand_in].spec.path):
            raise ValueError(
                f"{version}: the {role} {stand_in} has another tokenizer; a version that takes "
                "another's traffic must read the same token ids")

    def version(self, name: str) -> LoadedVersion:
        return self._versions[name]

    def alias_of(self, version: str) -> str:
        return self._alias_of[version]

    def resolve(self, alias_name: str, request_id: str) -> LoadedVersion:
        alias = self.aliases.get(alias_name)
        if alias is None:
            raise ServiceError.of(Reason.MODEL_NOT_FOUND, f"The model `{alias_name}` does not exist.")
        return self._versions[pick_version(alias, request_id).version]

    def versions_of(self, alias_name: str) -> list[LoadedVersion]:
        return [self._versions[spec.version] for spec in self.aliases[alias_name].versions]
