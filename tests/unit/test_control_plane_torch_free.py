"""The control plane (gateway, router, scheduler, and the `sluice top` and
`sluice rollout` tools that run beside it) never imports torch: it ships in
a small image without it. Checked three ways: declared
dependencies, imports under a torch blocker, and the running processes."""

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTROL_PLANE = ("gateway", "router", "scheduler")
HEAVY = {"torch", "sluice-model", "sluice-kernels", "sluice-tinymodel", "transformers", "triton"}


def _local_distributions() -> dict[str, list[str]]:
    found = {}
    for pyproject in [*REPO.glob("libs/*/pyproject.toml"), *REPO.glob("services/*/pyproject.toml")]:
        project = tomllib.loads(pyproject.read_text())["project"]
        names = [dep.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip()
                 for dep in project.get("dependencies", [])]
        found[project["name"]] = names
    return found


def test_control_plane_dependencies_exclude_torch_transitively():
    local = _local_distributions()
    assert "torch" in local["sluice-model"]  # the walk below can see torch where it is
    for service in CONTROL_PLANE:
        pending, closure = [f"sluice-{service}"], set()
        while pending:
            name = pending.pop()
            if name in closure:
                continue
            closure.add(name)
            pending.extend(local.get(name, []))
        assert not closure & HEAVY, f"sluice-{service} depends on {closure & HEAVY}"


# What runs where the control plane runs, and so ships in its image without
# torch: the three services, `sluice top` and `sluice rollout` (its quality
# runner aside: the `quality` extra brings torch for it). __main__ modules
# run their CLI when imported.
TORCH_FREE_PACKAGES = ("sluice.gateway", "sluice.router", "sluice.scheduler", "sluice.top", "sluice.rollout")
MAY_IMPORT_TORCH = ("sluice.rollout.quality.runner",)

BLOCK_TORCH_AND_IMPORT = """
import importlib, pkgutil, sys

class BlockHeavy:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'triton'):
            raise ImportError('control plane must not import ' + name)
        return None

sys.meta_path.insert(0, BlockHeavy())
packages, skipped = sys.argv[1].split(','), sys.argv[2].split(',')
for package in packages:
    root = importlib.import_module(package)
    names = [info.name for info in pkgutil.walk_packages(root.__path__, package + '.')
             if info.name not in skipped and not info.name.endswith('.__main__')]
    for name in names:
        importlib.import_module(name)
    print(package, len(names))
assert 'torch' not in sys.modules
"""


def test_every_control_plane_module_imports_without_torch():
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH_AND_IMPORT, ",".join(TORCH_FREE_PACKAGES), ",".join(MAY_IMPORT_TORCH)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    imported = dict(line.split() for line in result.stdout.splitlines())
    # The walk really imported each package's modules.
    assert {package: int(count) >= 5 for package, count in imported.items()} == dict.fromkeys(TORCH_FREE_PACKAGES, True)
