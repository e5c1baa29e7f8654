"""Every distribution declares what it imports, directly.

An image installs a distribution with its declared dependencies and nothing
else, so an import that works in the dev venv only because something else
pulled the package in fails in the image (sluice-replica used to import
sluice.engine without declaring it). The check reads each distribution's
source under src/ with `ast` (the tests of a distribution live in tests/ and
are not part of it) and maps each absolute import to the distribution that
provides it: `sluice.<pkg>` to the local distribution whose pyproject ships
that package, anything else through the dev venv's installed metadata.

Declared means listed in [project].dependencies or in an extra (an extra is
the declaration of an optional feature's needs, e.g. sluice-sim[plots]).
Exempt, on purpose: the standard library (`sys.stdlib_module_names`),
imports inside `if TYPE_CHECKING:` (never executed), and imports in a `try:`
that catches ImportError/ModuleNotFoundError (the code runs without them).
A dependency on something that is only imported transitively is not enough:
sluice-gateway must list grpcio even though sluice-rpc brings it.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from support.image_distributions import REPO, LocalDistribution, local_distributions, provider_of
from support.image_imports import ImportSite, imports_in, is_stdlib, providers_of

DISTRIBUTIONS = local_distributions()


def _providers(site: ImportSite) -> tuple[str, ...]:
    if site.module == "sluice" or site.module.startswith("sluice."):
        local = provider_of(site.module, DISTRIBUTIONS)
        return (local.name,) if local else ()
    return providers_of(site)


def undeclared_imports(distribution: LocalDistribution) -> dict[str, list[str]]:
    """Providing distribution (or the module, where nothing provides it) ->
    the places that import it without the distribution declaring it."""
    problems: dict[str, list[str]] = defaultdict(list)
    for site in imports_in(distribution.source_root):
        if is_stdlib(site.module) or site.optional:
            continue
        providers = _providers(site)
        if distribution.name in providers or any(distribution.declares(p) for p in providers):
            continue
        key = " or ".join(providers) if providers else f"{site.module} (provided by nothing installed)"
        place = site.where(REPO / distribution.folder)
        if place not in problems[key]:  # `from x import a, b` is one place
            problems[key].append(place)
    return dict(problems)


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_distribution_declares_every_import(name: str) -> None:
    problems = undeclared_imports(DISTRIBUTIONS[name])
    assert not problems, f"{name} imports without declaring: " + "; ".join(
        f"{provider} at {', '.join(places[:3])}" for provider, places in sorted(problems.items())
    )


def test_every_local_package_has_one_provider_and_exists() -> None:
    # The mapping above depends on it: each sluice.<pkg> named once, in a folder that holds it.
    owners: dict[str, list[str]] = defaultdict(list)
    for distribution in DISTRIBUTIONS.values():
        for package in distribution.packages:
            owners[package].append(distribution.name)
            assert (distribution.source_root / package.replace(".", "/")).is_dir(), package
    assert {p: o for p, o in owners.items() if len(o) > 1} == {}
    assert owners["sluice.engine"] == ["sluice-engine"] and owners["sluice.v1"] == ["sluice-rpc"]


def test_the_walk_sees_imports_and_maps_them(tmp_path) -> None:
    # The check would pass vacuously if the walk found nothing or mapped
    # nothing: a known undeclared import in a throwaway tree is reported, the
    # exemptions are not.
    source = tmp_path / "src" / "sluice" / "probe"
    source.mkdir(parents=True)
    (source / "__init__.py").write_text(
        "import json\n"
        "from typing import TYPE_CHECKING\n"
        "from sluice.engine.plan import StepPlan\n"
        "from opentelemetry import trace\n"
        "if TYPE_CHECKING:\n    import torch\n"
        "try:\n    import redis\nexcept ImportError:\n    redis = None\n"
        "def later():\n    import sqlalchemy\n"
    )
    # An absolute folder: REPO / folder is then the folder itself.
    probe = LocalDistribution("sluice-probe", str(tmp_path), ("sluice.probe",), frozenset({"sluice-engine"}), {})
    assert {s.module for s in imports_in(probe.source_root) if s.optional} == {"torch", "redis"}
    assert undeclared_imports(probe) == {
        "opentelemetry-api": ["src/sluice/probe/__init__.py:4"],
        "sqlalchemy": ["src/sluice/probe/__init__.py:12"],
    }
