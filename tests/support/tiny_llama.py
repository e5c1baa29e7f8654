"""A tiny Llama for tests: config.json-style dicts, our LlamaConfig, and a
seeded transformers checkpoint saved as safetensors."""

from __future__ import annotations

from pathlib import Path

import torch

from sluice.model import LlamaConfig

# Llama 3.1-style scaling with a tiny original context, so the scaled band
# actually covers some of head_dim's frequencies at these sizes.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def tiny_hf_dict(**overrides) -> dict:
    """A config.json-style dict for a tiny Llama (classic rope_theta/rope_scaling layout)."""
    d = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": dict(LLAMA3_ROPE),
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
    }
    d.update(overrides)
    return d


def tiny_config(**overrides) -> LlamaConfig:
    return LlamaConfig.from_hf_config(tiny_hf_dict(**overrides))


def save_tiny_hf_model(path: Path, *, seed: int = 0, tie: bool = False, max_shard_size=None, llama3_rope=True):
    """A seeded random transformers LlamaForCausalLM saved as safetensors; returns it (eval).
    llama3_rope=False: plain RoPE."""
    import transformers

    hf = tiny_hf_dict(tie_word_embeddings=tie)
    scaling = hf.pop("rope_scaling") if llama3_rope else {"rope_type": "default"}
    rope = dict(scaling, rope_theta=hf.pop("rope_theta"))
    for key in ("architectures", "model_type"):
        hf.pop(key)
    # initializer_range 0.2 (not 0.02) so logits spread out and argmax is stable.
    cfg = transformers.LlamaConfig(**hf, rope_parameters=rope, initializer_range=0.2)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(path, safe_serialization=True, **kwargs)
    return model
