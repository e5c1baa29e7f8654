"""The native kernels' AVX2 clones do their arithmetic in vector lanes.

GCC builds these kernels once per instruction set (`target_clones`) and
vectorises a clone only where its loop is branch-free in that ISA's terms.
A float select left SwiGLU's AVX2 clone scalar (10x slower, ~8% of a
replica's CPU on an AVX2-only Zen 3), and no other check could see it:
machines with AVX-512 run another clone, and `SLUICE_CPU_ISA=avx2` caps
only the kernels that choose their own path. So this reads the built code:
every machine that builds the kernels checks the AVX2 clones, whatever
clone it runs itself.
"""

import platform
import re
import shutil
import subprocess

import pytest

from sluice.kernels import _argmax_cpu, _elementwise_cpu

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None,
    reason="the clones are x86-64's; reading them takes binutils' objdump",
)

# Packed (vector) float arithmetic; a scalar loop has only the `ss`/`sd` forms.
PACKED_ARITHMETIC = re.compile(r"\tv(?:fn?m(?:add|sub)\d{3}|mul|add|sub|div|max|min)p[sd]\s")
# The AVX2 level's clone suffix: GCC 12+ names levels, older GCC the ISA.
AVX2_CLONE = re.compile(r"\.(?:arch_x86_64_v3|avx2)$")


def functions(library_path: str) -> dict[str, str]:
    """Each function's disassembly, by symbol name."""
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", library_path], capture_output=True,
                             text=True, check=True, timeout=60).stdout
    bodies: dict[str, str] = {}
    for chunk in re.split(r"\n(?=[0-9a-f]+ <)", listing):
        header = re.match(r"[0-9a-f]+ <([^>]+)>:", chunk)
        if header:
            bodies[header.group(1)] = chunk
    return bodies


def avx2_clones(library_path: str, kernel: str) -> dict[str, str]:
    """The AVX2 clones of `kernel` and of the loop bodies OpenMP outlined from it."""
    return {name: body for name, body in functions(library_path).items()
            if name.startswith(kernel + ".") and AVX2_CLONE.search(name)}


@pytest.mark.parametrize(("library", "kernel"), [
    (_elementwise_cpu, "rms_norm_rows"),
    (_elementwise_cpu, "silu_mul_rows"),
    (_elementwise_cpu, "rotate_rows"),
    (_argmax_cpu, "max_f32"),
    (_argmax_cpu, "argmax_row"),
])
def test_the_avx2_clone_computes_in_vectors(library, kernel):
    clones = avx2_clones(library.__file__, kernel)
    if not clones:
        pytest.skip(f"{kernel}: no AVX2 clone in this build (a compiler without target_clones)")
    packed = sum(len(PACKED_ARITHMETIC.findall(body)) for body in clones.values())
    assert packed > 0, f"{kernel}'s AVX2 clones ({', '.join(clones)}) are scalar: a loop GCC did not vectorise"
