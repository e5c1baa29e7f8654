"""Row-wise argmax for greedy sampling: the native kernel (``_argmax_cpu.c``)
for float32 CPU rows where this install has it, torch's argmax otherwise.
Same result as ``x.argmax(dim=-1)`` for finite rows, ties to the lowest index.

``screened_argmax`` is the second half of sluice.model.greedy_head: the
exact argmax from a screen of the logits, bfloat16 (oneDNN) or float32
scores (sluice.kernels.int8_head), native only."""

from __future__ import annotations

import hashlib
from pathlib import Path

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


def native_build_digest() -> str:
    """A digest of the native screen kernels' build ("" where none is built):
    a probe's timings of the screens hold for this build only."""
    if _native is None:
        return ""
    try:
        return hashlib.sha256(Path(_native.__file__).read_bytes()).hexdigest()[:16]
    except (OSError, AttributeError, TypeError):
        return "unknown"


def screened_argmax_available() -> bool:
    return _native is not None and hasattr(_native, "screened_argmax_bf16")


def screen_blocks(vocab: int) -> int:
    """How many blocks the screen scans a row of `vocab` scores in (see block_max)."""
    return -(-vocab // _native.SCREEN_BLOCK)


def check_block_max(block_max: torch.Tensor | None, rows: int, vocab: int, caller: str) -> None:
    """A block_max buffer must be contiguous float32 [rows, screen_blocks(vocab)] (or absent)."""
    if block_max is not None and (block_max.dtype != torch.float32 or not block_max.is_contiguous()
                                  or block_max.shape != (rows, screen_blocks(vocab))):
        raise ValueError(f"{caller}: block_max {tuple(block_max.shape)} {block_max.dtype}, expected "
                         f"contiguous float32 {(rows, screen_blocks(vocab))}")


def screened_argmax(scores: torch.Tensor, margins: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                    max_candidates: int, block_max: torch.Tensor | None = None) -> torch.Tensor:
    """The exact argmax of ``hidden @ weight.T`` per row, from a screen.

    scores: bf16 or float32 [N, V] (rows may be strided, as a view of a
    wider buffer), each within ``margins`` [N] (float32) of its exact
    logit; hidden: float32 [N, H]; weight: float32 [V, H]. Returns int64 [N]:
    the token, or -1 where a row had more than ``max_candidates`` candidates
    or non-finite inputs (compute that row's full logits instead).
    ``block_max``: float32 [N, screen_blocks(V)], each block's largest score
    where the caller already has them (the int8 screen does), else found here."""
    if not screened_argmax_available():
        raise RuntimeError("the native screened argmax is not built in this install")
    rows, vocab = scores.shape
    if (scores.dtype not in (torch.bfloat16, torch.float32) or margins.dtype != torch.float32
            or hidden.dtype != torch.float32 or weight.dtype != torch.float32 or margins.shape != (rows,)
            or hidden.shape[0] != rows or weight.shape != (vocab, hidden.shape[1])):
        raise ValueError(f"screened_argmax: scores {tuple(scores.shape)} {scores.dtype}, margins "
                         f"{tuple(margins.shape)}, hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}")
    if scores.stride(1) != 1 or (rows > 1 and scores.stride(0) < vocab):
        scores = scores.contiguous()
    check_block_max(block_max, rows, vocab, "screened_argmax")
    margins, hidden, weight = (t.contiguous() for t in (margins, hidden, weight))
    out = torch.empty(rows, dtype=torch.int64)
    screen = _native.screened_argmax_bf16 if scores.dtype == torch.bfloat16 else _native.screened_argmax_f32
    screen(scores.data_ptr(), margins.data_ptr(), hidden.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, vocab,
           max(scores.stride(0), vocab), hidden.shape[1], max_candidates,
           block_max.data_ptr() if block_max is not None else 0, torch.get_num_threads())
    return out
