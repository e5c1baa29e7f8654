"""Greedy tokens without the full float32 LM head: a bfloat16 screen, then
the exact logits of the few tokens that could still be the largest.

On a CPU with bfloat16 matrix instructions (AMX, AVX512-BF16) the LM head
in bf16 runs several times faster than in float32 (on a Xeon with AMX, 64
rows over a 32k vocabulary: ~1 ms against ~6 ms), and on a small model the
head is most of a decode step. Rounding to bf16 must not change which token
a greedy request gets, so the screen carries a bound:

    s_v  = bf16(sum_i bf16(h_i) * bf16(W_vi))   accumulated in float32
    |s_v - t_v| <= c * ||h|| * ||W_v||          t_v = h . W_v, the exact logit
    c = (1 + u)^3 (1 + g) - 1                   u = 2^-8 (bf16), g = n 2^-24 / (1 - n 2^-24)

(two inputs and the output rounded to bf16, a float32 sum of n products in
any order, and Cauchy-Schwarz for sum |h_i W_vi|). With m = c ||h|| max_v
||W_v||, every token whose score is within 2m of the best score is a
candidate, and the exact argmax is always one of them. The native kernel
(sluice.kernels.argmax.screened_argmax) recomputes the candidates' logits
from the float32 weights in double and takes the largest; a row with too
many candidates gets its full float32 logits instead. So the token is the
argmax of the exact logits, where the full float32 head gives the argmax of
logits rounded in some summation order: the two differ only on a float32
near-tie, as two float32 GEMM libraries do.

Only rows that want nothing but the argmax take this path (every row
greedy, no early-stop mask, no logits returned: sluice.model.runner asks
the sampler). `ScreenedHead.forward` is still the full float32 head, so
sampling, logprobs and the logits tests see no change. Whether the screen
is faster is the machine's answer: sluice.model.cpu_fast_path times it
against the full head and swaps it in only where it wins.
"""

from __future__ import annotations

import torch
from torch import nn

from sluice.kernels.argmax import argmax_rows, screened_argmax, screened_argmax_available
from sluice.model.cpu_linear import PackedLinear

BF16_UNIT_ROUNDOFF = 2.0**-8
FP32_UNIT_ROUNDOFF = 2.0**-24
# Candidates past this many and the row computes its full logits: a flat
# distribution (or a bound far wider than the logits' spread) gains nothing
# from the screen.
MAX_CANDIDATES = 64
# Norms are themselves float32 sums; this covers their rounding many times over.
NORM_SLACK = 1e-4
# Subnormals flushed to zero by bf16 hardware (DAZ/FTZ): an absolute error
# far below any logit a model produces.
ABSOLUTE_SLACK = 1e-30


def screen_bound_factor(hidden_size: int) -> float:
    """c above: how far a bf16 score may be from its exact logit, per unit of ||h|| ||W_v||."""
    accumulated = hidden_size * FP32_UNIT_ROUNDOFF
    g = accumulated / (1.0 - accumulated)
    return (1.0 + BF16_UNIT_ROUNDOFF) ** 3 * (1.0 + g) - 1.0


def screen_available() -> bool:
    return (
        screened_argmax_available()
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported")
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


class ScreenedHead(PackedLinear):
    """Drop-in for the LM head's ``nn.Linear`` (no bias, float32, CPU).

    ``forward`` is the full float32 head (oneDNN-packed, as PackedLinear);
    ``greedy_token_ids`` is the screened argmax. Same ``weight`` Parameter,
    so state_dict names and tied embeddings do not change."""

    def __init__(self, linear: nn.Linear, *, max_candidates: int = MAX_CANDIDATES) -> None:
        if linear.bias is not None:
            raise ValueError("ScreenedHead takes an LM head without bias")
        super().__init__(linear)  # calls _repack, which builds the screen
        self.max_candidates = max_candidates

    def _repack(self) -> None:
        super()._repack()
        weight = self.weight.detach()
        usable = weight.device.type == "cpu" and weight.dtype == torch.float32 and screen_available()
        self._screen: torch.Tensor | None = None
        if usable:
            self._screen = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16).contiguous(), None)
        self._max_row_norm = float(weight.norm(dim=1).max()) if usable else float("nan")
        self._bound = screen_bound_factor(self.in_features) * (1.0 + NORM_SLACK)

    @property
    def screening(self) -> bool:
        return self._screen is not None

    def greedy_token_ids(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: float32 [N, in] -> int64 [N], the argmax of its logits."""
        if self._screen is None or hidden.dtype != torch.float32 or hidden.device.type != "cpu":
            return argmax_rows(self(hidden).float())
        hidden = hidden.contiguous()
        scores = torch.ops.mkldnn._linear_pointwise(hidden.to(torch.bfloat16), self._screen, None, "none", [], "")
        # scores: bf16 [N, vocab]
        margins = hidden.norm(dim=1) * (self._bound * self._max_row_norm) + ABSOLUTE_SLACK  # [N]
        tokens = screened_argmax(scores, margins, hidden, self.weight.detach(), self.max_candidates)
        unresolved = (tokens < 0).nonzero().flatten()
        if unresolved.numel():
            tokens[unresolved] = argmax_rows(self(hidden[unresolved]).float())
        return tokens

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, screened={self.screening}"
