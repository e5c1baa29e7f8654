"""The quality gate's fixed prompt set (package data, prompts.json), or an
operator's own file of the same shape (torch-free)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

CHECKS = ("non_empty", "no_refusal", "stops", "json")


@dataclass(frozen=True, slots=True)
class PromptSpec:
    id: str
    messages: tuple[tuple[str, str], ...]  # (role, content)
    reference: str  # a good answer: its log-likelihood under each version is compared
    checks: tuple[str, ...]  # from CHECKS, applied to the greedy answer

    def chat(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


@dataclass(frozen=True, slots=True)
class PromptSet:
    prompts: tuple[PromptSpec, ...]
    max_new_tokens: int  # the greedy answer's length bound


def default_prompt_set() -> PromptSet:
    text = resources.files("sluice.rollout.quality").joinpath("prompts.json").read_text()
    return parse_prompt_set(text, "the built-in prompt set")


def load_prompt_set(path: Path) -> PromptSet:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"cannot read the prompt set {path}: {error.strerror or error}") from None
    return parse_prompt_set(text, str(path))


def parse_prompt_set(text: str, source: str) -> PromptSet:
    try:
        document = json.loads(text)
        prompts = tuple(_prompt(entry) for entry in document["prompts"])
        max_new_tokens = int(document.get("max_new_tokens", 24))
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"invalid prompt set {source}: {error}") from None
    if not prompts:
        raise ValueError(f"the prompt set {source} has no prompts")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"the prompt set {source} repeats an id")
    if max_new_tokens < 1:
        raise ValueError(f"the prompt set {source}: max_new_tokens must be >= 1")
    return PromptSet(prompts, max_new_tokens)


def _prompt(entry: dict) -> PromptSpec:
    checks = tuple(entry.get("checks", ()))
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"prompt {entry.get('id')!r}: unknown checks {unknown} (known: {', '.join(CHECKS)})")
    messages = tuple((str(m["role"]), str(m["content"])) for m in entry["messages"])
    if not messages or not str(entry["reference"]):
        raise ValueError(f"prompt {entry.get('id')!r} needs messages and a reference")
    return PromptSpec(str(entry["id"]), messages, str(entry["reference"]), checks)
