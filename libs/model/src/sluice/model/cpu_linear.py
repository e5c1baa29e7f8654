"""A linear layer on CPU with a copy of its weight laid out once for speed.

torch's CPU ``F.linear`` goes to MKL with the weight as a transposed
operand ([out, in], multiplied as x @ W^T), which on AMD processors takes a
generic code path and packs the weight on every call. Two layouts avoid
that, each made once at load:

- "onednn": oneDNN's blocked layout (oneDNN is built into torch's CPU
  wheels and picks its kernels by instruction set);
- "transposed": the weight stored [in, out], so MKL multiplies x @ W with
  no transposed operand (on a 2-core Intel Xeon, one thread, 64 rows: the
  decoder's four projections 15-20% faster than ``F.linear``, 5-10% faster
  than oneDNN's).

Which is fastest depends on the CPU, the shape and the thread count (on a
2-core AVX2 EPYC, fp32, 64 rows: the 32k-vocabulary LM head 11 ms oneDNN-
packed against 27 ms, a 256x256 projection 0.14 ms against 0.11), so
sluice.model.cpu_fast_path measures and swaps this in per layer. Results
agree with ``F.linear`` within float32 summation-order differences (~1e-6
relative).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

WeightLayout = Literal["onednn", "transposed"]
WEIGHT_LAYOUTS: tuple[WeightLayout, ...] = ("onednn", "transposed")


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
    change) plus a copy of the weight in `layout` that ``forward`` uses.
    Moved off CPU or float32 (``.to()``), it runs ``F.linear``."""

    def __init__(self, linear: nn.Linear, layout: WeightLayout = "onednn") -> None:
        super().__init__()
        if layout not in WEIGHT_LAYOUTS:
            raise ValueError(f"unknown weight layout {layout!r}: expected one of {', '.join(WEIGHT_LAYOUTS)}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.layout = layout
        self.weight = linear.weight  # [out, in]
        self.bias = linear.bias  # [out] or None
        self._packed: torch.Tensor | None = None
        self._repack()

    def _repack(self) -> None:
        weight = self.weight.detach()
        self._packed = None
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return
        if self.layout == "transposed":
            self._packed = weight.t().contiguous()  # [in, out]
        elif onednn_linear_available(weight.dtype):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, in] -> [N, out]."""
        packed = self._packed
        if packed is None:
            return F.linear(x, self.weight, self.bias)
        if self.layout == "transposed":
            return torch.mm(x, packed) if self.bias is None else torch.addmm(self.bias, x, packed)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, self.bias, "none", [], "")

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        super()._apply(fn, recurse)
        self._repack()  # the packed copy follows the weight (or goes, off CPU)
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, layout={self.layout}, packed={self._packed is not None}")
