from __future__ import annotations

import pytest

from sluice.model import LlamaConfig, RopeScaling


def test_parses_classic_layout(make_hf_dict):
    cfg = LlamaConfig.from_hf_config(make_hf_dict())
    assert cfg.head_dim == 64 // 4
    assert cfg.num_query_groups == 2
    assert cfg.rope_theta == 10000.0
    assert cfg.rope_scaling == RopeScaling(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=32,
    )
    assert cfg.eos_token_ids == (2,) and cfg.bos_token_id == 1
    assert cfg.tie_word_embeddings is False


def test_parses_transformers5_rope_parameters_and_old_type_key(make_hf_dict, llama3_rope):
    new = make_hf_dict(rope_scaling=None, rope_theta=None)
    del new["rope_scaling"], new["rope_theta"]
    new["rope_parameters"] = dict(llama3_rope, rope_theta=500000.0)
    cfg = LlamaConfig.from_hf_config(new)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling.rope_type == "llama3"

    old = dict(llama3_rope)
    old["type"] = old.pop("rope_type")
    assert LlamaConfig.from_hf_config(make_hf_dict(rope_scaling=old)).rope_scaling.factor == 8.0
    default = LlamaConfig.from_hf_config(make_hf_dict(rope_scaling={"rope_type": "default"}))
    assert default.rope_scaling is None


def test_explicit_head_dim_eos_list_and_kv_head_default(make_hf_dict):
    hf = make_hf_dict(head_dim=32, eos_token_id=[2, 7, 9])
    del hf["num_key_value_heads"]
    cfg = LlamaConfig.from_hf_config(hf)
    assert cfg.head_dim == 32
    assert cfg.num_key_value_heads == cfg.num_attention_heads
    assert cfg.eos_token_ids == (2, 7, 9)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"architectures": ["MixtralForCausalLM"]}, "unsupported architecture"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope scaling"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "multiple"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "lacks"),
    ],
)
def test_rejects_unsupported(make_hf_dict, overrides, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_hf_config(make_hf_dict(**overrides))


def test_missing_required_field(make_hf_dict):
    hf = make_hf_dict()
    del hf["vocab_size"]
    with pytest.raises(ValueError, match="vocab_size"):
        LlamaConfig.from_hf_config(hf)
