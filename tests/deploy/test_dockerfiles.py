"""Static checks of the two Dockerfiles (no Docker daemon here to build
them): pinned bases, multi-stage, non-root, locked third-party versions,
torch only where it belongs. What each image installs is resolved in
test_image_install_sets.py."""

from __future__ import annotations

import re

import pytest

from support.image_distributions import REPO
from support.image_dockerfile import Dockerfile, PipCommand, parse

IMAGES = ("control-plane", "replica")
# sluice-engine is not here: it is the pure core, and the router depends on it.
TORCH_DISTRIBUTIONS = ("libs/kernels", "libs/model", "libs/tinymodel", "services/replica")


def read(image: str) -> str:
    return (REPO / "docker" / f"{image}.Dockerfile").read_text()


def dockerfile(image: str) -> Dockerfile:
    return parse(REPO / "docker" / f"{image}.Dockerfile")


def external_bases(parsed: Dockerfile) -> list[str]:
    """FROM references that are images, not earlier stages."""
    stage_names = {stage.name for stage in parsed.stages if stage.name}
    return [stage.base for stage in parsed.stages if stage.base not in stage_names]


@pytest.mark.parametrize("image", IMAGES)
def test_base_images_are_pinned_by_tag(image: str) -> None:
    bases = external_bases(dockerfile(image))
    assert bases
    for base in bases:
        repository, _, tag = base.rpartition(":")
        assert repository and tag and tag != "latest" and "/" not in tag, base


@pytest.mark.parametrize("image", IMAGES)
def test_images_are_multi_stage_with_a_build_stage(image: str) -> None:
    parsed = dockerfile(image)
    build = parsed.stage("build")
    assert parsed.runtime is not build and parsed.runtime.name is None
    assert build.copies and not parsed.runtime.copies  # sources stay in the build stage


@pytest.mark.parametrize("image", IMAGES)
def test_images_run_as_a_non_root_user(image: str) -> None:
    users = re.findall(r"^USER (\S+)", read(image), re.MULTILINE)
    # The last USER wins; 10001 is the chart's runAsUser.
    assert users and users[-1] == "10001:10001"


def _locked(command: PipCommand) -> bool:
    """Whether every version this pip command can pick is fixed: constrained
    by constraints.txt, or offline from a wheelhouse, or exact pins only,
    or local folders built without dependencies."""
    if command.has("--constraint") or command.has("--no-index"):
        return True
    if command.has("--no-deps") and all(r.startswith("./") for r in command.requirements):
        return True
    return all(re.fullmatch(r"[A-Za-z0-9._-]+==[\w.+-]+", r) for r in command.requirements)


@pytest.mark.parametrize("image", IMAGES)
def test_every_pip_command_is_locked_and_uses_no_extra_index(image: str) -> None:
    commands = [command for stage in dockerfile(image).stages for command in stage.pip]
    assert len(commands) >= 3
    for command in commands:
        assert _locked(command), f"{image}: versions float in pip {command.subcommand} {command.requirements}"
        # An extra index merges with PyPI: a sluice-* name could come from either.
        assert not command.has("--extra-index-url"), command


def test_control_plane_image_installs_no_torch_distribution() -> None:
    text = read("control-plane")
    for path in TORCH_DISTRIBUTIONS:
        assert path not in text, path
    commands = [command for stage in dockerfile("control-plane").stages for command in stage.pip]
    assert not [r for c in commands for r in c.requirements if re.match(r"(torch|triton)\b", r)]


def test_replica_image_installs_pinned_cuda_torch_and_keeps_a_compiler_for_triton() -> None:
    parsed = dockerfile("replica")
    assert re.fullmatch(r"\d+\.\d+\.\d+", parsed.args["TORCH_VERSION"])
    assert any(base.startswith("nvidia/cuda:") for base in external_bases(parsed))
    runtime_torch = [r for c in parsed.runtime.pip for r in c.requirements if r.startswith("torch")]
    assert runtime_torch == [f"torch=={parsed.args['TORCH_VERSION']}"]
    # Triton builds its launcher with a C compiler at run time: the runtime
    # stage derives from the stage that installs gcc.
    python_stage = parsed.stage("python")
    assert parsed.runtime.base == "python" and python_stage.base.startswith("nvidia/cuda:")
    assert re.search(r"apt-get install[^\n]*\bgcc\b", read("replica").replace("\\\n", " "))
