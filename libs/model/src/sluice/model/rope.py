"""Rotary position embeddings (RoPE), Hugging Face layout.

HF Llama checkpoints permute q_proj/k_proj rows so that the two halves of a
head form the rotation pairs: dimension j pairs with j + head_dim/2
("rotate_half"), not with its neighbour j+1 as in Meta's original code.
Applying the interleaved convention to HF weights gives wrong attention, so
this module uses rotate_half only.
"""

from __future__ import annotations

import math

import torch

from sluice.kernels.elementwise_cpu import rotate
from sluice.model.config import RopeScaling


def compute_inv_freq(
    head_dim: int, theta: float, scaling: RopeScaling | None = None
) -> torch.Tensor:
    """Inverse frequencies, float32 [head_dim // 2]."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)  # [head_dim // 2]
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    return _llama3_scale(inv_freq, scaling)


def _llama3_scale(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1 scaling: stretch long wavelengths, keep short ones, blend between.

    wavelength <  orig/high_freq_factor : unchanged (local detail)
    wavelength >  orig/low_freq_factor  : divided by factor (long range)
    in between                          : linear blend in orig/wavelength
    """
    orig = s.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq  # [head_dim // 2]
    long_edge = orig / s.low_freq_factor
    short_edge = orig / s.high_freq_factor
    # smooth = 0 at the long edge (fully scaled), 1 at the short edge (unscaled)
    smooth = (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    scaled = torch.where(wavelen > long_edge, inv_freq / s.factor, inv_freq)
    in_band = (wavelen >= short_edge) & (wavelen <= long_edge)
    return torch.where(in_band, blended, scaled)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for the given positions, each [num_tokens, head_dim].

    Computed in float32 (positions up to 128K need the mantissa), then cast.
    """
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [num_tokens, head_dim // 2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [num_tokens, head_dim]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, num_heads, head_dim] and k [T, num_kv_heads, head_dim]
    (``rotate``: x cos + rotate_half(x) sin, one native pass on CPU).

    cos, sin: [T, head_dim]; broadcast over heads.
    """
    return rotate(query, cos, sin), rotate(key, cos, sin)


class RotaryEmbedding(torch.nn.Module):
    """Holds inv_freq (a non-persistent buffer: it is derived from the config,
    never read from a checkpoint)."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.theta = theta
        self.scaling = scaling
        self.register_buffer("inv_freq", compute_inv_freq(head_dim, theta, scaling), persistent=False)

    def reset_buffers(self) -> None:
        """Recompute inv_freq in place (after ``to_empty`` from the meta device)."""
        fresh = compute_inv_freq(self.head_dim, self.theta, self.scaling)
        self.inv_freq = fresh.to(self.inv_freq.device)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # model.to(bfloat16) would also cast inv_freq and lose RoPE precision at
        # long positions; to_empty() would leave it uninitialised. Rebuild it.
        super()._apply(fn, recurse)
        self.reset_buffers()
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(positions, self.inv_freq, dtype)
