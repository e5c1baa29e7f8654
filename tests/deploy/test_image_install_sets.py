"""Each image's install set resolves, offline, exactly as its Dockerfile
lists it; a local distribution it needs but does not list is a failure.

No Docker daemon runs here, so the images are never built; instead the
Dockerfile is read (support.image_dockerfile) and its build stage's two pip
steps are replayed through pip's resolver in dry-run:

  1. `pip wheel --no-deps ... ./libs/a ./services/b`: the local folders.
  2. `pip wheel -c constraints.txt [pins] /wheels/local/*.whl`: those wheels
     plus the step's own requirements, under the locked constraints.

The replay hands pip the folders of step 1 (relative to the repository
root, which the COPY lines mirror one to one) and the requirements of step 2,
with `--no-index` and stub wheels for the third-party pins
(support.image_resolve). A local distribution missing from step 1 then has
nowhere to come from, so the resolver fails and names it, where the real
build would have asked the public index for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from support.image_distributions import REPO, canonical, local_closure, local_distributions, requirement_name
from support.image_dockerfile import Dockerfile, PipCommand, parse
from support.image_resolve import Resolution, pins, resolve, write_stub_wheels

IMAGES = ("control-plane", "replica")
DISTRIBUTIONS = local_distributions()
# Names and prefixes that must never be in the control-plane image.
HEAVY = ("torch", "triton", "sluice-model", "sluice-kernels", "sluice-tinymodel", "transformers", "nvidia-")


@dataclass(frozen=True, slots=True)
class InstallSet:
    local_paths: tuple[str, ...]  # step 1's folders as written, e.g. "./libs/rpc"
    requirements: tuple[str, ...]  # step 2's requirements other than the local wheels
    constraints: Path  # in the repository
    local_step: PipCommand
    resolve_step: PipCommand

    def replay(self, stubs: Path, without: str | None = None) -> Resolution:
        paths = [p for p in self.local_paths if p != without]
        return resolve([*paths, *self.requirements], self.constraints, stubs)


def dockerfile(image: str) -> Dockerfile:
    return parse(REPO / "docker" / f"{image}.Dockerfile")


def install_set(image: str) -> InstallSet:
    build = dockerfile(image).stage("build")
    local_steps = [c for c in build.pip if c.subcommand == "wheel" and c.has("--no-deps")]
    assert len(local_steps) == 1, f"{image}: expected one `pip wheel --no-deps` step of the local folders"
    local_step = local_steps[0]
    local_glob = f"{local_step.value('--wheel-dir')}/*.whl"
    resolve_steps = [c for c in build.pip if c.subcommand == "wheel" and local_glob in c.requirements]
    assert len(resolve_steps) == 1, f"{image}: expected one `pip wheel` step over {local_glob}"
    resolve_step = resolve_steps[0]
    copied = dict((destination.rstrip("/"), source) for source, destination in build.copies)
    constraints = resolve_step.value("--constraint")
    assert copied.get(constraints) == constraints, f"{image}: {constraints} is not copied into the build stage"
    return InstallSet(
        local_paths=local_step.requirements,
        requirements=tuple(r for r in resolve_step.requirements if r != local_glob),
        constraints=REPO / constraints,
        local_step=local_step,
        resolve_step=resolve_step,
    )


def dockerfile_pins(image: str) -> dict[str, str]:
    """`name==version` requirements the Dockerfile states itself (torch, setuptools)."""
    found = {}
    for requirement in install_set(image).requirements:
        name, equals, version = requirement.partition("==")
        if equals:
            found[canonical(name)] = version
    return found


def folder_of(path: str) -> str:
    return path.removeprefix("./").split("[", 1)[0].rstrip("/")


def local_names(paths: tuple[str, ...]) -> set[str]:
    by_folder = {d.folder: d.name for d in DISTRIBUTIONS.values()}
    return {by_folder[folder_of(p)] for p in paths}


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("stub-wheels")
    extra = {}
    for image in IMAGES:
        extra.update(dockerfile_pins(image))
    constraint_pins = pins(REPO / "constraints.txt")
    write_stub_wheels(folder, REPO / "constraints.txt", {n: v for n, v in extra.items() if n not in constraint_pins})
    return folder


@pytest.fixture(scope="module")
def resolved(stubs: Path) -> dict[str, Resolution]:
    return {image: install_set(image).replay(stubs) for image in IMAGES}


@pytest.mark.parametrize("image", IMAGES)
def test_every_local_folder_is_copied_where_it_is_built(image: str) -> None:
    # The replay runs at the repository root, faithful only if each folder
    # lands at the same relative path in the build stage.
    build = dockerfile(image).stage("build")
    copies = {source.rstrip("/"): destination.rstrip("/") for source, destination in build.copies}
    listed = install_set(image).local_paths
    assert listed and all(p.startswith("./") for p in listed), listed
    for path in listed:
        folder = folder_of(path)
        assert copies.get(folder) == folder, f"{image}: {folder} is built but not copied to {folder}"
        assert (REPO / folder / "pyproject.toml").is_file(), folder
    stray = {s for s in copies if s.startswith(("libs/", "services/"))} - {folder_of(p) for p in listed}
    assert not stray, f"{image}: copied but never built: {sorted(stray)}"


@pytest.mark.parametrize("image", IMAGES)
def test_install_set_resolves_offline_with_the_locked_constraints(image: str, resolved: dict[str, Resolution]) -> None:
    resolution = resolved[image]
    assert resolution.ok, f"{image}: {resolution.error}"
    listed = local_names(install_set(image).local_paths)
    assert {n for n in resolution.installed if n.startswith("sluice-")} == listed
    locked = pins(REPO / "constraints.txt") | dockerfile_pins(image)
    for name, version in resolution.installed.items():
        if not name.startswith("sluice-"):
            assert locked.get(name) == version, f"{image}: {name} {version} is not the locked version"


def test_control_plane_install_set_has_the_services_and_no_torch(resolved: dict[str, Resolution]) -> None:
    installed = resolved["control-plane"].installed
    assert {"sluice-gateway", "sluice-router", "sluice-scheduler", "kubernetes", "redis", "psycopg-binary"} <= set(installed)
    assert not [n for n in installed if n.startswith(HEAVY)]
    if "sluice-rollout" in DISTRIBUTIONS:  # `sluice rollout` runs from this image, without its torch extra
        assert "sluice-rollout" in installed


def test_replica_install_set_has_cuda_torch_triton_and_the_kernels(resolved: dict[str, Resolution]) -> None:
    installed = resolved["replica"].installed
    assert installed["torch"] == dockerfile("replica").args["TORCH_VERSION"]
    assert installed["triton"] == pins(REPO / "constraints.txt")["triton"]
    assert {"sluice-replica", "sluice-model", "sluice-kernels", "sluice-engine"} <= set(installed)


def test_replica_install_set_has_the_rollout_with_its_quality_extra(resolved: dict[str, Resolution]) -> None:
    # The chart's rollout Job runs in the replica image: the quality check
    # loads both versions with torch and the model code.
    installed = resolved["replica"].installed
    assert "sluice-rollout[quality]" in install_set("replica").requirements
    rollout = DISTRIBUTIONS["sluice-rollout"]
    assert {"sluice-rollout", *rollout.requires, *rollout.extras["quality"]} <= set(installed)


@pytest.mark.parametrize(("image", "dropped", "needed_by"), [
    ("control-plane", "./libs/limits", "sluice-gateway"),
    ("replica", "./libs/engine", "sluice-replica"),
])
def test_a_local_distribution_left_out_fails_naming_it(image: str, dropped: str, needed_by: str, stubs: Path) -> None:
    install = install_set(image)
    assert dropped in install.local_paths  # the case drops something that is listed today
    missing = local_names((dropped,)).pop()
    assert missing in DISTRIBUTIONS[needed_by].requires
    resolution = install.replay(stubs, without=dropped)
    assert not resolution.ok
    assert f"No matching distribution found for {missing}" in resolution.error, resolution.error


@pytest.mark.parametrize("image", IMAGES)
def test_every_local_distribution_the_image_needs_is_listed(image: str) -> None:
    # The same rule from the pyprojects alone, naming what is missing in
    # one line: the closure of what the image installs, over required
    # dependencies and the extras the Dockerfile asks for.
    install = install_set(image)
    listed = local_names(install.local_paths)
    roots = set(listed)
    for requirement in install.requirements:
        if "[" in requirement and requirement_name(requirement) in DISTRIBUTIONS:
            extras = requirement.split("[", 1)[1].split("]", 1)[0].split(",")
            roots |= {d for e in extras for d in DISTRIBUTIONS[requirement_name(requirement)].extras[e.strip()]
                      if d in DISTRIBUTIONS}
    assert local_closure(sorted(roots), DISTRIBUTIONS) - listed == set()


@pytest.mark.parametrize("image", IMAGES)
def test_runtime_installs_only_from_the_build_wheelhouse(image: str) -> None:
    parsed = dockerfile(image)
    runtime = parsed.runtime
    assert runtime.copies == [], f"{image}: the runtime stage copies sources from the context"
    assert runtime.pip, f"{image}: the runtime stage installs nothing"
    mounts = {m.split("target=")[1].split(",")[0]: m for m in runtime.mounts}
    installed: set[str] = set()
    for command in runtime.pip:
        assert command.subcommand == "install" and command.has("--no-index"), f"{image}: {command}"
        source = command.value("--find-links")
        assert "from=build" in mounts.get(source, ""), f"{image}: {source} is not a wheelhouse of the build stage"
        installed |= {requirement_name(r) for r in command.requirements}
    listed = local_names(install_set(image).local_paths)
    assert {n for n in installed if n.startswith("sluice-")} == listed
