"""The native CPU kernels: paged attention, row argmax and the decoder's
elementwise steps (plain C extensions,
no torch headers, OpenMP shared with torch at run time).

Optional: where no C compiler is at hand the build goes on without it and
the replica uses the torch path
(``sluice.kernels.paged_attention_native.available()`` says which).
"""

import sys

from setuptools import Extension, setup

openmp = [] if sys.platform == "darwin" else ["-fopenmp"]  # Apple clang ships no OpenMP


def native(name: str) -> Extension:
    return Extension(
        f"sluice.kernels.{name}",
        sources=[f"src/sluice/kernels/{name}.c"],
        # included by the sources: a change rebuilds them
        depends=["src/sluice/kernels/_cpu_vector.h", "src/sluice/kernels/_paged_attention_vec.h"],
        extra_compile_args=["-O3", "-std=c11", "-ffp-contract=fast", *openmp],
        extra_link_args=openmp,
        optional=True,
    )


setup(ext_modules=[native("_paged_attention_cpu"), native("_argmax_cpu"), native("_elementwise_cpu")])
