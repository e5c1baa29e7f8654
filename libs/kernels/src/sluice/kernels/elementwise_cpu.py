"""The decoder's elementwise steps, each one native pass on CPU (``_elementwise_cpu.c``):
RMSNorm, SwiGLU's ``silu(gate) * up`` and the rotary embedding.

Each function takes what the torch formula takes and returns what it
returns. The native kernel serves float32 CPU tensors whose rows it can
address (a row contiguous within itself) where this install has it; the
torch formula serves everything else (other dtypes, CUDA, an install
without a C compiler) and is the definition the tests hold the kernel to.
Results agree with the formula within float32 rounding (the kernel fuses
multiply-adds and sums in another order: ~1e-7 relative).
"""

from __future__ import annotations

import torch  # first: the kernel then shares the OpenMP runtime torch loaded
import torch.nn.functional as F

try:
    from sluice.kernels import _elementwise_cpu as _native
except ImportError:  # built without a C compiler: the torch formulas serve
    _native = None


def available() -> bool:
    return _native is not None


def _native_rows(*tensors: torch.Tensor) -> bool:
    """The kernel can serve these (and no gradient has to flow through them)."""
    return _native is not None and all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.stride(-1) == 1 for t in tensors
    ) and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [N, hidden] (or [..., hidden] through torch), weight [hidden] -> like x."""
    if x.dim() == 2 and weight.dim() == 1 and weight.shape[0] == x.shape[1] and _native_rows(x, weight):
        rows, cols = x.shape
        out = torch.empty(rows, cols, dtype=x.dtype)
        _native.rms_norm_f32(x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, cols, x.stride(0), float(eps),
                             torch.get_num_threads())
        return out
    # Normalise in float32 (bf16 variance underflows), scale in the input dtype,
    # the same order of operations as the Hugging Face reference.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[N, 2 * inter] (gate columns, then up) -> [N, inter] = silu(gate) * up."""
    if gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0 and _native_rows(gate_up):
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(rows, inter, dtype=gate_up.dtype)
        _native.silu_mul_f32(gate_up.data_ptr(), out.data_ptr(), rows, inter, gate_up.stride(0),
                             torch.get_num_threads())
        return out
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[..., head_dim] -> [..., head_dim]: (x1, x2) -> (-x2, x1) on the two halves."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [T, heads, head_dim] by cos, sin [T, head_dim] (broadcast over
    heads): ``x * cos + rotate_half(x) * sin``, a new contiguous tensor."""
    if (x.dim() == 3 and cos.shape == sin.shape == (x.shape[0], x.shape[2]) and x.shape[2] % 2 == 0
            and _native_rows(x, cos, sin) and x.stride(1) == x.shape[2] and cos.is_contiguous()
            and sin.is_contiguous()):
        tokens, heads, head_dim = x.shape
        out = torch.empty(tokens, heads, head_dim, dtype=x.dtype)
        _native.rotate_f32(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), tokens, heads, head_dim,
                           x.stride(0), torch.get_num_threads())
        return out
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]
