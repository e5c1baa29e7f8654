"""Deterministic random weights for the tiny Llama, under HF tensor names."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Standard Llama init (initializer_range in HF configs).
LINEAR_INIT_STD = 0.02
# lm_head uses the same std: after the final RMSNorm the hidden state has unit
# scale per element, so logits have std ~ 0.02 * sqrt(256) ~ 0.3 and the
# top-1/top-2 gap over 32000 entries is typically a few 1e-2, far above float
# noise, which keeps greedy decoding meaningful in tests (checked in
# tests/unit/tinymodel/test_tiny_checkpoint.py).
LM_HEAD_INIT_STD = 0.02


@dataclass(slots=True, frozen=True)
class TinyLlamaDims:
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int = 32
    vocab_size: int = 32000


def init_weights(dims: TinyLlamaDims, *, seed: int) -> dict[str, torch.Tensor]:
    """Return float32 tensors keyed by LlamaForCausalLM state-dict names.

    Tensors are drawn in a fixed order from one seeded generator, so the same
    seed gives bit-identical weights.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def normal(rows: int, cols: int, std: float = LINEAR_INIT_STD) -> torch.Tensor:
        # [out_features, in_features], the nn.Linear weight layout.
        return torch.empty(rows, cols, dtype=torch.float32).normal_(0.0, std, generator=generator)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=torch.float32)

    hidden, inter = dims.hidden_size, dims.intermediate_size
    q_out = dims.num_attention_heads * dims.head_dim
    kv_out = dims.num_key_value_heads * dims.head_dim

    tensors: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(dims.vocab_size, hidden)}
    for layer in range(dims.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        tensors[f"{prefix}.self_attn.q_proj.weight"] = normal(q_out, hidden)
        tensors[f"{prefix}.self_attn.k_proj.weight"] = normal(kv_out, hidden)
        tensors[f"{prefix}.self_attn.v_proj.weight"] = normal(kv_out, hidden)
        tensors[f"{prefix}.self_attn.o_proj.weight"] = normal(hidden, q_out)
        tensors[f"{prefix}.mlp.gate_proj.weight"] = normal(inter, hidden)
        tensors[f"{prefix}.mlp.up_proj.weight"] = normal(inter, hidden)
        tensors[f"{prefix}.mlp.down_proj.weight"] = normal(hidden, inter)
        tensors[f"{prefix}.input_layernorm.weight"] = ones(hidden)
        tensors[f"{prefix}.post_attention_layernorm.weight"] = ones(hidden)
    tensors["model.norm.weight"] = ones(hidden)
    tensors["lm_head.weight"] = normal(dims.vocab_size, hidden, LM_HEAD_INIT_STD)
    return tensors
