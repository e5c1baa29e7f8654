"""The loaded side of the catalog: each version's tokenizer and limits."""

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


def _context_length(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    return int(config.get("max_position_embeddings") or config.get("max_sequence_length") or 2048)


class ModelRegistry:
    """Aliases -> loaded versions. Built once at start-up; read-only after."""

    def __init__(self, catalog: tuple[ModelAliasSpec, ...], created_unix_s: float) -> None:
        self.aliases = {alias.name: alias for alias in catalog}
        self.created_unix_s = created_unix_s
        self._versions: dict[str, LoadedVersion] = {}
        for alias in catalog:
            for spec in alias.versions:
                if spec.version not in self._versions:
                    self._versions[spec.version] = LoadedVersion(
                        spec, Tokenizer.from_pretrained(spec.path), _context_length(spec.path)
                    )

    def resolve(self, alias_name: str, request_id: str) -> LoadedVersion:
        alias = self.aliases.get(alias_name)
        if alias is None:
            raise ServiceError.of(Reason.MODEL_NOT_FOUND, f"The model `{alias_name}` does not exist.")
        return self._versions[pick_version(alias, request_id).version]

    def versions_of(self, alias_name: str) -> list[LoadedVersion]:
        return [self._versions[spec.version] for spec in self.aliases[alias_name].versions]
