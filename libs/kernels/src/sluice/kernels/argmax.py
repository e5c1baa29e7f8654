"""Row-wise argmax for greedy sampling: the native kernel (``_argmax_cpu.c``)
for float32 CPU rows where this install has it, torch's argmax otherwise.
Same result as ``x.argmax(dim=-1)`` for finite rows, ties to the lowest index."""

from __future__ import annotations

import torch  # first: the kernel then shares the OpenMP runtime torch loaded

try:
    from sluice.kernels import _argmax_cpu as _native
except ImportError:  # built without a C compiler
    _native = None


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x: [N, V] -> int64 [N]."""
    if x.dim() != 2:
        raise ValueError(f"argmax_rows takes [N, V], got {tuple(x.shape)}")
    if _native is None or x.device.type != "cpu" or x.dtype != torch.float32 or x.shape[1] == 0 or x.stride(1) != 1:
        return x.argmax(dim=-1)
    out = torch.empty(x.shape[0], dtype=torch.int64)
    _native.argmax_rows_f32(x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], x.stride(0),
                            torch.get_num_threads())
    return out
