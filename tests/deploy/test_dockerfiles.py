"""Static checks of the two Dockerfiles (no docker engine here to build them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCKER_DIR = Path(__file__).resolve().parents[2] / "docker"
TORCH_DISTRIBUTIONS = ("libs/kernels", "libs/model", "libs/engine", "libs/tinymodel", "services/replica")


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
    for path in ("libs/rpc", "libs/config", "libs/tokenization", "libs/placement",
                 "services/gateway", "services/router", "services/scheduler"):
        assert f"COPY {path} " in dockerfile, path
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
