"""Resolves an image's install set with pip's own resolver, offline.

The third-party side is a folder of stub wheels, one per pin in
constraints.txt: each carries the METADATA of that distribution as the dev
venv has it installed (so its own requirements, extras and markers are the
real ones) and no code. Resolving against it with `--no-index` therefore
checks, without a network, that every third-party package an image would get
is pinned in constraints.txt, and that every local distribution it needs is
given as a path. Pins a Dockerfile states itself (torch, setuptools) get stubs
without requirements: the dev venv has the CPU build of torch, not the CUDA
one an image gets, whose nvidia-* and triton requirements torch pins itself.

Markers are evaluated for this interpreter (3.11 on Linux), which the
control-plane image shares; the replica image runs 3.12.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from support.image_distributions import REPO, canonical

_WHEEL = "Wheel-Version: 1.0\nGenerator: sluice-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def pins(constraints: Path) -> dict[str, str]:
    """canonical name -> version, from `name==version` lines."""
    found = {}
    for line in constraints.read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if requirement:
            name, equals, version = requirement.partition("==")
            if not equals:
                raise ValueError(f"{constraints.name}: not an exact pin: {line!r}")
            found[canonical(name)] = version.strip()
    return found


def _write_stub(folder: Path, name: str, version: str, metadata_text: str) -> None:
    stem = re.sub(r"[-_.]+", "_", name).lower()
    info = f"{stem}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{stem}-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{info}/METADATA", metadata_text)
        wheel.writestr(f"{info}/WHEEL", _WHEEL)
        wheel.writestr(f"{info}/RECORD", "")


def write_stub_wheels(folder: Path, constraints: Path, extra_pins: dict[str, str]) -> None:
    """Stubs for every pin in `constraints` (real metadata from the dev venv)
    and for `extra_pins` (name and version only)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, version in pins(constraints).items():
        try:
            installed = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise AssertionError(f"constraints.txt pins {name}=={version} but the dev venv lacks it: make install")
        if installed.version != version:
            raise AssertionError(f"constraints.txt pins {name}=={version}, the dev venv has {installed.version}")
        _write_stub(folder, name, version, installed.read_text("METADATA") or "")
    for name, version in extra_pins.items():
        _write_stub(folder, name, version, f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@dataclass(frozen=True, slots=True)
class Resolution:
    ok: bool
    installed: dict[str, str]  # canonical name -> version, when ok
    error: str  # pip's stderr, when not ok


def resolve(requirements: list[str], constraints: Path, stubs: Path) -> Resolution:
    """`pip install --dry-run` of `requirements` (local paths relative to the
    repository root, like the Dockerfiles' ./libs/x, or requirement strings).

    --isolated: no pip config or PIP_* variables; --ignore-installed: the dev
    venv's editable sluice-* cannot stand in for one that is not listed;
    --no-index with the stubs only: nothing leaves this machine;
    --no-build-isolation: the local paths' metadata is prepared with the
    venv's setuptools (offline, as the images build them)."""
    command = [
        sys.executable, "-m", "pip", "install", "--isolated", "--disable-pip-version-check",
        "--dry-run", "--ignore-installed", "--no-index", "--find-links", str(stubs),
        "--no-build-isolation", "--quiet", "--report", "-", "-c", str(constraints), *requirements,
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return Resolution(False, {}, done.stderr)
    report = json.loads(done.stdout)
    installed = {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}
    return Resolution(True, installed, "")
