"""Static checks of the two Dockerfiles (no docker engine here to build them)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"
# sluice-engine is not here: it is the pure core, and the router depends on it.
TORCH_DISTRIBUTIONS = ("libs/kernels", "libs/model", "libs/tinymodel", "services/replica")


def local_distributions() -> dict[str, tuple[str, list[str]]]:
    """Distribution name -> (its folder, the local distributions it depends on)."""
    found = {}
    for pyproject in [*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("services/*/pyproject.toml")]:
        project = tomllib.loads(pyproject.read_text())["project"]
        names = [re.split(r"[\s;\[<>=!~]", dep, maxsplit=1)[0] for dep in project.get("dependencies", [])]
        found[project["name"]] = (str(pyproject.parent.relative_to(REPO)), [n for n in names if n.startswith("sluice-")])
    return found


def folders_needed(*roots: str) -> set[str]:
    """The folders of `roots` and of every local distribution they need."""
    local = local_distributions()
    pending, seen = list(roots), set()
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending.extend(local[name][1])
    return {local[name][0] for name in seen}


def assert_copied_and_installed(dockerfile: str, folders: set[str]) -> None:
    for path in sorted(folders):
        assert f"COPY {path} {path}" in dockerfile, f"{path} is not copied"
        assert re.search(rf"pip (?:wheel|install)\b[^\n]*(?:\\\n[^\n]*)*\./{re.escape(path)}\b", dockerfile), (
            f"{path} is not built or installed"
        )


def read(name: str) -> str:
    return (DOCKER_DIR / name).read_text()


def base_images(dockerfile: str) -> list[str]:
    """Image references of FROM lines, with ARG defaults substituted."""
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile, re.MULTILINE))
    images = []
    for reference in re.findall(r"^FROM (\S+)", dockerfile, re.MULTILINE):
        images.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], reference))
    return images


@pytest.mark.parametrize("name", ["control-plane.Dockerfile", "replica.Dockerfile"])
def test_base_images_are_pinned_by_tag(name: str) -> None:
    images = base_images(read(name))
    assert images
    for image in images:
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest", image


@pytest.mark.parametrize("name", ["control-plane.Dockerfile", "replica.Dockerfile"])
def test_images_run_as_a_non_root_user(name: str) -> None:
    users = re.findall(r"^USER (\S+)", read(name), re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_control_plane_image_installs_no_torch_distribution() -> None:
    dockerfile = read("control-plane.Dockerfile")
    for path in TORCH_DISTRIBUTIONS:
        assert path not in dockerfile, path
    assert not re.search(r"pip install[^\n]*\btorch\b", dockerfile)


def test_replica_image_installs_pinned_torch_and_the_gpu_libraries() -> None:
    dockerfile = read("replica.Dockerfile")
    assert re.search(r"^ARG TORCH_VERSION=\d+\.\d+\.\d+$", dockerfile, re.MULTILINE)
    assert 'torch==${TORCH_VERSION}' in dockerfile
    assert any(image.startswith("nvidia/cuda:") for image in base_images(dockerfile))
    for path in ("libs/kernels", "libs/model", "libs/engine", "libs/rpc", "libs/config", "services/replica"):
        assert f"COPY {path} " in dockerfile, path


def test_control_plane_image_copies_builds_and_installs_every_local_dependency() -> None:
    dockerfile = read("control-plane.Dockerfile")
    needed = folders_needed("sluice-gateway", "sluice-router", "sluice-scheduler")
    assert {"libs/outcomes", "libs/engine", "libs/admission", "libs/placement"} <= needed  # the walk sees them
    assert_copied_and_installed(dockerfile, needed)
    names = {name for name, (folder, _) in local_distributions().items() if folder in needed}
    runtime = dockerfile.split("# ---- runtime", 1)[1]
    for name in sorted(names):  # installed into the runtime stage from the wheels
        assert re.search(rf"\b{name}\b", runtime), name


def test_replica_image_copies_and_installs_every_local_dependency() -> None:
    # The replica service imports sluice.engine without declaring it; the
    # image installs the engine explicitly (checked above).
    assert_copied_and_installed(read("replica.Dockerfile"), folders_needed("sluice-replica"))
