"""The LM head's int8 screen: scores within a known margin of the exact
logits, from int8 weights and 7- or 8-bit activations (``_argmax_cpu.c``
derives the margin and says why AVX2 takes 7 bits).

For CPUs whose torch has no fast bf16 matmul (AVX2 on Zen 2/3 and older
Xeons, AVX-VNNI on Alder Lake and later client cores, AVX-512 VNNI without
bf16 on Cascade Lake): there the full float32
head is most of a small model's decode step, and an int8 multiply-add does
two to four times the work of a float32 FMA per instruction. The scores
feed ``sluice.kernels.argmax.screened_argmax``, which recomputes the few
candidates exactly, so the token never depends on the quantization.

    head = pack_int8_head(weight)                    # once: [V, H] float32
    tokens = int8_screened_argmax(hidden, head, weight, max_candidates)  # per step: int64 [N], -1: full head

``int8_screened_argmax`` keeps each row's candidates as it scores and never
stores a score; ``int8_head_scores`` stores them all (scores [N, >=
padded_vocab] and margins), for tests and benchmarks to inspect, and
``screened_argmax`` then gives the same tokens from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch  # first: the kernel then shares the OpenMP runtime torch loaded

from sluice.kernels.argmax import check_block_max

try:
    from sluice.kernels import _argmax_cpu as _native
except ImportError:  # built without a C compiler
    _native = None

# Vocab rows per packed block (one 512-bit register of int32 lanes) and
# activation bytes per lane: the layout the kernels read.
VOCAB_BLOCK = 16
LANE_BYTES = 4
WEIGHT_MAX = 127
PACK_CHUNK_ROWS = 4096

# Instruction sets of the kernel, as the C code numbers them, fastest last.
ISA_SCALAR, ISA_AVX2, ISA_AVX_VNNI, ISA_AVX512_VNNI = 1, 2, 3, 4
ISA_NAMES = {ISA_SCALAR: "scalar", ISA_AVX2: "avx2", ISA_AVX_VNNI: "avx-vnni", ISA_AVX512_VNNI: "avx512-vnni"}


def isa_label(pair: tuple[int, int]) -> str:
    """(instruction set, bits) as logs and probes name it: "avx2-7bit"."""
    return f"{ISA_NAMES[pair[0]]}-{pair[1]}bit"


def int8_head_available() -> bool:
    return _native is not None and hasattr(_native, "int8_head_scores")


# The instruction sets `best_isa` may pick from (None: any); cpu_isa.cap_isa
# sets it. And the pair a probe measured fastest here, if it is allowed.
_allowed_isas: tuple[int, ...] | None = None
_preferred: tuple[int, int] | None = None


def limit_isas(allowed: tuple[int, ...] | None) -> None:
    """Restrict `best_isa` (and so every call that passes no isa) to `allowed`; None lifts it."""
    global _allowed_isas
    _allowed_isas = allowed


def prefer_isa(pair: tuple[int, int] | None) -> None:
    """Make `pair` (instruction set, bits) `best_isa`'s answer while the limit
    allows it (sluice.model.cpu_kernel_probe); None: the widest again."""
    global _preferred
    if pair is not None and tuple(pair) not in supported_isas():
        raise ValueError(f"int8 head: this CPU does not run {pair}")
    _preferred = None if pair is None else (pair[0], pair[1])


def allowed_isas() -> list[tuple[int, int]]:
    """The (instruction set, bits) pairs this CPU runs within `limit_isas`, widest last."""
    return [pair for pair in supported_isas() if _allowed_isas is None or pair[0] in _allowed_isas]


def supported_isas() -> list[tuple[int, int]]:
    """(instruction set, activation bits) pairs this CPU runs: scalar at
    both widths always (where built), AVX2 at 7 bits, either VNNI at both."""
    return [tuple(pair) for pair in _native.int8_head_isas()] if int8_head_available() else []


def best_isa() -> tuple[int, int]:
    """The pair `prefer_isa` named, if allowed; else the widest instruction set
    here (within `limit_isas`), at the most bits it takes."""
    pairs = allowed_isas()
    if _preferred in pairs:
        return _preferred
    return max(pairs, key=lambda pair: (pair[0], pair[1]))


@dataclass(frozen=True, slots=True)
class Int8Head:
    """A float32 [vocab, hidden] head quantized per row and packed.

    packed: int8 [padded_vocab / 16, padded_hidden / 4, 16, 4];
    scales: float32 [padded_vocab], w_v ~ scales[v] * q_v;
    row_sums: int32 [padded_vocab], sum(q_v) (for the VNNI path's unsigned shift);
    error_norm_max: max_v ||w_v - scales[v] q_v||; norm_max: max_v ||scales[v] q_v||."""

    packed: torch.Tensor
    scales: torch.Tensor
    row_sums: torch.Tensor
    vocab: int
    hidden: int
    error_norm_max: float
    norm_max: float

    @property
    def padded_vocab(self) -> int:
        return self.scales.shape[0]

    @property
    def padded_hidden(self) -> int:
        return self.packed.shape[1] * LANE_BYTES


def pack_int8_head(weight: torch.Tensor) -> Int8Head:
    """weight: float32 [vocab, hidden] (CPU) -> its int8 screen."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise ValueError(f"pack_int8_head takes a float32 CPU [vocab, hidden] weight, got "
                         f"{tuple(weight.shape)} {weight.dtype} on {weight.device}")
    vocab, hidden = weight.shape
    padded_vocab = -(-max(vocab, 1) // VOCAB_BLOCK) * VOCAB_BLOCK
    padded_hidden = -(-hidden // LANE_BYTES) * LANE_BYTES
    q = torch.zeros(padded_vocab, padded_hidden, dtype=torch.int8)
    padded_scales = torch.ones(padded_vocab, dtype=torch.float32)
    error_norms, norms = [torch.zeros(1, dtype=torch.float64)], [torch.zeros(1, dtype=torch.float64)]
    # In row chunks: the double temporaries of a whole large head (128k x 8k) would be gigabytes.
    for start in range(0, vocab, PACK_CHUNK_ROWS):
        w = weight[start:start + PACK_CHUNK_ROWS].detach().double()
        amax = w.abs().amax(dim=1)  # [rows]
        # A float32 scale per row; a zero row keeps scale 1 and codes 0.
        scales = torch.where(amax > 0, amax / WEIGHT_MAX, torch.ones_like(amax)).float()
        codes = torch.round(w / scales.double()[:, None]).clamp_(-WEIGHT_MAX, WEIGHT_MAX)  # integral
        dequantized = codes * scales.double()[:, None]
        error_norms.append((w - dequantized).norm(dim=1))
        norms.append(dequantized.norm(dim=1))
        q[start:start + w.shape[0], :hidden] = codes.to(torch.int8)
        padded_scales[start:start + w.shape[0]] = scales

    packed = (q.view(padded_vocab // VOCAB_BLOCK, VOCAB_BLOCK, padded_hidden // LANE_BYTES, LANE_BYTES)
              .permute(0, 2, 1, 3).contiguous())
    row_sums = q.sum(dim=1, dtype=torch.int32)  # [padded_vocab]
    # torch's max keeps a NaN (a NaN weight then gives every row a NaN margin: the full head decides).
    return Int8Head(packed, padded_scales, row_sums, vocab, hidden, float(torch.cat(error_norms).max()),
                    float(torch.cat(norms).max()))


def int8_head_scores(hidden: torch.Tensor, head: Int8Head, out: torch.Tensor, *,
                     isa: tuple[int, int] | None = None, block_max: torch.Tensor | None = None) -> torch.Tensor:
    """Scores of ``hidden`` (float32 [N, H]) into ``out`` (float32, rows at
    least ``head.padded_vocab`` wide, contiguous in each row); returns the
    rows' margins, float32 [N]: each score of ``out[:, :head.vocab]`` is
    within its row's margin of the exact logit. A row with a NaN or inf gets
    a NaN margin (the screen then leaves it to the full logits). ``isa``:
    (instruction set, activation bits), this CPU's `best_isa` by default.
    ``block_max`` (float32 [N, screen_blocks(vocab)], optional) receives
    each screen block's largest score, for screened_argmax."""
    if not int8_head_available():
        raise RuntimeError("the native int8 head is not built in this install")
    rows = hidden.shape[0]
    if (hidden.dim() != 2 or hidden.dtype != torch.float32 or hidden.shape[1] != head.hidden
            or out.dtype != torch.float32 or out.dim() != 2 or out.shape[0] < rows
            or out.shape[1] < head.padded_vocab or out.stride(1) != 1):
        raise ValueError(f"int8_head_scores: hidden {tuple(hidden.shape)} {hidden.dtype}, out "
                         f"{tuple(out.shape)} {out.dtype}, head {head.vocab}x{head.hidden}")
    check_block_max(block_max, rows, head.vocab, "int8_head_scores")
    hidden = hidden.contiguous()
    margins = torch.empty(rows, dtype=torch.float32)
    _native.int8_head_scores(_native_head(hidden, head, isa), out.data_ptr(), margins.data_ptr(),
                             block_max.data_ptr() if block_max is not None else 0,
                             out.stride(0) if rows > 1 else head.padded_vocab)
    return margins


def _native_head(hidden: torch.Tensor, head: Int8Head, isa: tuple[int, int] | None) -> tuple:
    """The kernel's description of one call's rows and head (``int8_call`` in the C)."""
    instruction_set, bits = isa if isa is not None else best_isa()
    return (hidden.data_ptr(), head.packed.data_ptr(), head.scales.data_ptr(), head.row_sums.data_ptr(),
            hidden.shape[0], head.hidden, head.padded_hidden, head.vocab, head.padded_vocab,
            head.error_norm_max, head.norm_max, instruction_set, bits, torch.get_num_threads())


def int8_screened_argmax(hidden: torch.Tensor, head: Int8Head, weight: torch.Tensor, max_candidates: int, *,
                         isa: tuple[int, int] | None = None) -> torch.Tensor:
    """The exact argmax of ``hidden @ weight.T`` per row (float32 [N, H] and
    [V, H], ``head`` packed from ``weight``), int64 [N]: the tokens that
    ``int8_head_scores`` then ``screened_argmax`` give, in one pass that
    stores no score; -1 where a row had more than ``max_candidates``
    candidates or non-finite inputs (compute that row's full logits instead)."""
    if not int8_head_available():
        raise RuntimeError("the native int8 head is not built in this install")
    if (hidden.dim() != 2 or hidden.dtype != torch.float32 or hidden.shape[1] != head.hidden
            or weight.dtype != torch.float32 or weight.shape != (head.vocab, head.hidden)):
        raise ValueError(f"int8_screened_argmax: hidden {tuple(hidden.shape)} {hidden.dtype}, weight "
                         f"{tuple(weight.shape)} {weight.dtype}, head {head.vocab}x{head.hidden}")
    hidden, weight = hidden.contiguous(), weight.contiguous()
    out = torch.empty(hidden.shape[0], dtype=torch.int64)
    _native.int8_screened_argmax(_native_head(hidden, head, isa), weight.data_ptr(), out.data_ptr(), max_candidates)
    return out
