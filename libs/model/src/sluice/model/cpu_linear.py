"""A linear layer on CPU through oneDNN, with its weight packed once.

torch's CPU ``F.linear`` goes to MKL, which on AMD processors takes a
generic code path and packs the weight on every call; oneDNN (built into
torch's CPU wheels) picks its kernels by instruction set, and with the
weight reordered once into its blocked layout skips that packing. Which is
faster depends on the CPU and the shape (on a 2-core AVX2 EPYC, fp32, 64
rows: the 32k-vocabulary LM head 11 ms packed against 27 ms, a 256x256
projection 0.14 ms against 0.11), so sluice.model.cpu_fast_path measures
and swaps this in per layer. Results agree with ``F.linear`` within float32
summation-order differences (~1e-6 relative).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def onednn_linear_available(dtype: torch.dtype) -> bool:
    return (
        dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class PackedLinear(nn.Module):
    """Drop-in for an ``nn.Linear`` (float32, CPU): the same ``weight`` and
    ``bias`` Parameters (so ``state_dict`` names and tied weights do not
    change) plus an opaque oneDNN copy of the weight that ``forward`` uses.
    Moved off CPU or float32 (``.to()``), it runs ``F.linear``."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # [out, in]
        self.bias = linear.bias  # [out] or None
        self._packed: torch.Tensor | None = None
        self._repack()

    def _repack(self) -> None:
        weight = self.weight
        usable = weight.device.type == "cpu" and onednn_linear_available(weight.dtype)
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None) if usable else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, in] -> [N, out]."""
        if self._packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, self.bias, "none", [], "")

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        super()._apply(fn, recurse)
        self._repack()  # the packed copy follows the weight (or goes, off CPU)
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, packed={self._packed is not None}")
