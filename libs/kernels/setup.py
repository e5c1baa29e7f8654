"""The native CPU paged-attention kernel (a plain C extension, no torch headers).

Optional: where no C compiler is at hand the build goes on without it and
the replica uses the torch path (``sluice.kernels.native.available()`` says which).
"""

import sys

from setuptools import Extension, setup

openmp = [] if sys.platform == "darwin" else ["-fopenmp"]  # Apple clang ships no OpenMP

setup(
    ext_modules=[
        Extension(
            "sluice.kernels._paged_attention_cpu",
            sources=["src/sluice/kernels/_paged_attention_cpu.c"],
            extra_compile_args=["-O3", "-std=c11", "-ffp-contract=fast", *openmp],
            extra_link_args=openmp,
            optional=True,
        )
    ]
)
