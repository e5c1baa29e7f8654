"""Import triton in interpreter mode for the kernel tests on a CPU-only machine.

Triton reads TRITON_INTERPRET when a ``@triton.jit`` decorator runs, and
parts of ``triton.language`` are themselves jit functions decorated when
triton is first imported. So on a machine without CUDA, triton must be first
imported with TRITON_INTERPRET=1. This conftest does that at collection, then
puts the environment back as it was, so tests elsewhere in the process (and
the subprocesses they start) do not see the variable; the kernel tests set
it again only while they run (see the ``kernels`` fixture). With CUDA nothing
is changed and the tests run the compiled kernels.
"""

from __future__ import annotations

import os
import sys

import torch


def _import_triton_for_interpreter() -> None:
    if torch.cuda.is_available() or "triton" in sys.modules:
        return
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except ImportError:
        pass  # the kernel tests importorskip triton
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


_import_triton_for_interpreter()
