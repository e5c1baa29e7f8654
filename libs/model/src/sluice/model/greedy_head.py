"""Greedy tokens without the full float32 LM head: a cheap screen, then the
exact logits of the few tokens that could still be the largest.

On a small model the LM head is most of a decode step, and it can run
several times faster in lower precision: in bfloat16 on a CPU with bf16
matrix instructions (on a Xeon with AMX, 64 rows over a 32k vocabulary:
~1 ms against ~6 ms), or in int8 on one without (AVX2, AVX-512 VNNI:
sluice.kernels.int8_head). Rounding must not change which token a greedy
request gets, so each screen carries a bound. For bf16:

    s_v  = bf16(sum_i bf16(h_i) * bf16(W_vi))   accumulated in float32
    |s_v - t_v| <= c * ||h|| * ||W_v||          t_v = h . W_v, the exact logit
    c = (1 + u)^3 (1 + g) - 1                   u = 2^-8 (bf16), g = n 2^-24 / (1 - n 2^-24)

(two inputs and the output rounded to bf16, a float32 sum of n products in
any order, and Cauchy-Schwarz for sum |h_i W_vi|), so m = c ||h|| max_v
||W_v||. The int8 kernel computes its own per-row margin from the two
quantization errors (``_argmax_cpu.c``). Every token whose score is within
2m of the best score is a candidate, and the exact argmax is always one of
them. The native kernel (sluice.kernels.argmax.screened_argmax) recomputes
the candidates' logits from the float32 weights in double and takes the
largest; a row with too many candidates gets its full float32 logits
instead. So the token is the argmax of the exact logits, where the full
float32 head gives the argmax of logits rounded in some summation order:
the two differ only on a float32 near-tie, as two float32 GEMM libraries do.

Only rows that want nothing but the argmax take this path (every row
greedy, no early-stop mask, no logits returned: sluice.model.runner asks
the sampler). `ScreenedHead.forward` is still the full float32 head, so
sampling, logprobs and the logits tests see no change. Whether a screen
is faster, and which, is the machine's answer: sluice.model.cpu_fast_path
times each against the full head and swaps in the fastest.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from sluice.kernels.argmax import argmax_rows, screened_argmax, screened_argmax_available
from sluice.kernels.cpu_isa import isa_cap
from sluice.kernels.int8_head import Int8Head, int8_head_available, int8_screened_argmax, pack_int8_head
from sluice.model.cpu_linear import PackedLinear

ScreenKind = Literal["bf16", "int8"]
SCREEN_KINDS: tuple[ScreenKind, ...] = ("bf16", "int8")

BF16_UNIT_ROUNDOFF = 2.0**-8
FP32_UNIT_ROUNDOFF = 2.0**-24
# Candidates past this many and the row computes its full logits: a flat
# distribution (or a bound far wider than the logits' spread) gains nothing
# from the screen. A candidate costs one hidden-size dot product; the
# fallback reads the whole head for a few rows (memory-bound, ~3 ms for
# 32k x 256), so the cap sits well above a screen's usual count (the int8
# screen leaves ~10-30 a row on a random 32k x 256 head, at most ~200).
MAX_CANDIDATES = 256
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


def screen_available(kind: ScreenKind = "bf16") -> bool:
    """Whether this install and CPU can run the `kind` screen."""
    if kind == "int8":
        return screened_argmax_available() and int8_head_available()
    if kind != "bf16":
        raise ValueError(f"unknown LM head screen {kind!r}: expected one of {', '.join(SCREEN_KINDS)}")
    return (
        screened_argmax_available()
        and isa_cap() in ("auto", "avx512")  # bf16 matmul needs AVX512-BF16 or AMX
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported")
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


def available_screens() -> tuple[ScreenKind, ...]:
    return tuple(kind for kind in SCREEN_KINDS if screen_available(kind))


class ScreenedHead(PackedLinear):
    """Drop-in for the LM head's ``nn.Linear`` (no bias, float32, CPU).

    ``forward`` is the full float32 head (oneDNN-packed, as PackedLinear);
    ``greedy_token_ids`` is the screened argmax, from the `screen` kind of
    scores. Same ``weight`` Parameter, so state_dict names and tied
    embeddings do not change."""

    def __init__(self, linear: nn.Linear, *, screen: ScreenKind = "bf16",
                 max_candidates: int = MAX_CANDIDATES) -> None:
        if linear.bias is not None:
            raise ValueError("ScreenedHead takes an LM head without bias")
        if screen not in SCREEN_KINDS:
            raise ValueError(f"unknown LM head screen {screen!r}: expected one of {', '.join(SCREEN_KINDS)}")
        self.screen_kind = screen
        super().__init__(linear)  # calls _repack, which builds the screen
        self.max_candidates = max_candidates

    def _repack(self) -> None:
        super()._repack()
        weight = self.weight.detach()
        usable = (weight.device.type == "cpu" and weight.dtype == torch.float32
                  and screen_available(self.screen_kind))
        self._screen: torch.Tensor | None = None
        self._int8: Int8Head | None = None
        if usable and self.screen_kind == "bf16":
            self._screen = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16).contiguous(), None)
        elif usable:
            self._int8 = pack_int8_head(weight)
        # The bf16 screen's bound (the int8 kernel derives its own margin).
        self._max_row_norm = float(weight.norm(dim=1).max()) if self._screen is not None else float("nan")
        self._bound = screen_bound_factor(self.in_features) * (1.0 + NORM_SLACK)

    @property
    def screening(self) -> bool:
        return self._screen is not None or self._int8 is not None

    def greedy_token_ids(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: float32 [N, in] -> int64 [N], the argmax of its logits."""
        if not self.screening or hidden.dtype != torch.float32 or hidden.device.type != "cpu":
            return argmax_rows(self(hidden).float())
        hidden = hidden.contiguous()
        if self._int8 is not None:
            tokens = int8_screened_argmax(hidden, self._int8, self.weight.detach(), self.max_candidates)
        else:
            scores = torch.ops.mkldnn._linear_pointwise(hidden.to(torch.bfloat16), self._screen, None, "none",
                                                        [], "")  # bf16 [N, vocab]
            margins = hidden.norm(dim=1) * (self._bound * self._max_row_norm) + ABSOLUTE_SLACK  # [N]
            tokens = screened_argmax(scores, margins, hidden, self.weight.detach(), self.max_candidates)
        unresolved = (tokens < 0).nonzero().flatten()
        if unresolved.numel():
            tokens[unresolved] = argmax_rows(self(hidden[unresolved]).float())
        return tokens

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, screened={self.screen_kind if self.screening else False}"
