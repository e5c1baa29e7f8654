"""The repository's own distributions as their pyproject.toml files declare
them, and the `sluice.*` packages each one provides.

Shared by the image checks (tests/deploy): what a Dockerfile must copy and
build, and what a distribution may import, both come from here.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name (`Jinja2` -> `jinja2`, `prometheus_client` -> `prometheus-client`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The canonical distribution name of a PEP 508 requirement string."""
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return canonical(match.group(1))


@dataclass(frozen=True, slots=True)
class LocalDistribution:
    name: str  # canonical, e.g. "sluice-gateway"
    folder: str  # relative to the repository root, e.g. "services/gateway"
    packages: tuple[str, ...]  # the dotted packages it ships, e.g. ("sluice.v1", "sluice.rpc")
    requires: frozenset[str]  # canonical names in [project].dependencies
    extras: Mapping[str, frozenset[str]]  # [project.optional-dependencies], canonical names

    @property
    def source_root(self) -> Path:
        return REPO / self.folder / "src"

    def declares(self, distribution: str) -> bool:
        """Whether `distribution` is a dependency, required or in an extra."""
        return distribution in self.requires or any(distribution in names for names in self.extras.values())


def _packages(pyproject: dict, folder: str) -> tuple[str, ...]:
    find = pyproject.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
    packages = tuple(pattern for pattern in find.get("include", []) if "*" not in pattern)
    if not packages:
        raise ValueError(f"{folder}/pyproject.toml: [tool.setuptools.packages.find] include names no package")
    return packages


def local_distributions(repo: Path = REPO) -> dict[str, LocalDistribution]:
    """Every distribution under libs/ and services/, by canonical name."""
    found: dict[str, LocalDistribution] = {}
    for pyproject_path in sorted([*repo.glob("libs/*/pyproject.toml"), *repo.glob("services/*/pyproject.toml")]):
        folder = str(pyproject_path.parent.relative_to(repo))
        pyproject = tomllib.loads(pyproject_path.read_text())
        project = pyproject["project"]
        extras = {
            extra: frozenset(requirement_name(r) for r in requirements)
            for extra, requirements in project.get("optional-dependencies", {}).items()
        }
        name = canonical(project["name"])
        found[name] = LocalDistribution(
            name=name,
            folder=folder,
            packages=_packages(pyproject, folder),
            requires=frozenset(requirement_name(r) for r in project.get("dependencies", [])),
            extras=extras,
        )
    return found


def provider_of(module: str, distributions: Mapping[str, LocalDistribution]) -> LocalDistribution | None:
    """The local distribution whose package is the longest prefix of `module`."""
    best: tuple[int, LocalDistribution] | None = None
    for distribution in distributions.values():
        for package in distribution.packages:
            if module == package or module.startswith(package + "."):
                if best is None or len(package) > best[0]:
                    best = (len(package), distribution)
    return None if best is None else best[1]


def local_closure(roots: list[str], distributions: Mapping[str, LocalDistribution]) -> set[str]:
    """`roots` and every local distribution they require, transitively
    (required dependencies only: an extra is a choice the installer makes)."""
    pending, seen = list(roots), set()
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(dep for dep in distributions[name].requires if dep in distributions)
    return seen
