from __future__ import annotations

import math

import pytest
import torch

from sluice.model import RopeScaling
from sluice.model.rope import apply_rotary, compute_inv_freq, rope_cos_sin

LLAMA31 = RopeScaling(
    rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)


def test_llama3_inv_freq_matches_transformers():
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_cfg = transformers.LlamaConfig(
        hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    ours = compute_inv_freq(128, 500000.0, LLAMA31)
    torch.testing.assert_close(ours, expected.float(), atol=0, rtol=1e-6)


def test_llama3_scaling_bands_by_hand():
    base = compute_inv_freq(128, 500000.0)
    scaled = compute_inv_freq(128, 500000.0, LLAMA31)
    wavelen = 2 * math.pi / base
    short = wavelen < 8192 / 4  # high frequencies: untouched
    long = wavelen > 8192 / 1  # low frequencies: divided by factor
    assert short.any() and long.any() and (~short & ~long).any()
    torch.testing.assert_close(scaled[short], base[short])
    torch.testing.assert_close(scaled[long], base[long] / 8.0)
    mid = ~short & ~long
    assert torch.all(scaled[mid] < base[mid]) and torch.all(scaled[mid] > base[mid] / 8.0)


def test_linear_scaling_and_plain_frequencies():
    base = compute_inv_freq(8, 10000.0)
    torch.testing.assert_close(base, torch.tensor([1.0, 0.1, 0.01, 0.001]))
    linear = compute_inv_freq(8, 10000.0, RopeScaling(rope_type="linear", factor=2.0))
    torch.testing.assert_close(linear, base / 2)


def test_rotation_is_relative():
    """q.k after RoPE depends only on the position difference (rotate_half pairs)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 16, generator=g)
    k = torch.randn(1, 1, 16, generator=g)
    inv_freq = compute_inv_freq(16, 10000.0)

    def score(pq, pk):
        cq, sq = rope_cos_sin(torch.tensor([pq]), inv_freq, torch.float32)
        ck, sk = rope_cos_sin(torch.tensor([pk]), inv_freq, torch.float32)
        rq, _ = apply_rotary(q, k, cq, sq)
        _, rk = apply_rotary(q, k, ck, sk)
        return (rq * rk).sum()

    torch.testing.assert_close(score(5, 2), score(105, 102), atol=1e-4, rtol=1e-4)
    # Position 0 is the identity rotation.
    c0, s0 = rope_cos_sin(torch.tensor([0]), inv_freq, torch.float32)
    rq, rk = apply_rotary(q, k, c0, s0)
    torch.testing.assert_close(rq, q) and torch.testing.assert_close(rk, k)
