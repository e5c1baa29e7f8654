"""`sluice top` runs where the control plane runs: no torch behind it."""

import subprocess
import sys

BLOCK_TORCH_AND_IMPORT = """
import importlib, pkgutil, sys

class BlockHeavy:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers', 'triton'):
            raise ImportError('sluice top must not import ' + name)
        return None

sys.meta_path.insert(0, BlockHeavy())
import sluice.top
names = [info.name for info in pkgutil.walk_packages(sluice.top.__path__, 'sluice.top.')
         if info.name != 'sluice.top.__main__']  # it runs the CLI
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_every_module_imports_without_torch():
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH_AND_IMPORT], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 8
