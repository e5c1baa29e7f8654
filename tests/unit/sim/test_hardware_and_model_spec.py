"""Hardware and model presets, checked against their datasheets and configs
by hand-computed numbers."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sluice.sim.hardware import HARDWARE, MIB_BYTES, Hardware, hardware_by_name
from sluice.sim.model_spec import DTYPE_BYTES, MODELS, ModelSpec, model_by_name_or_path

LLAMA_3_70B = MODELS["llama-3-70b"]
LLAMA_3_8B = MODELS["llama-3-8b"]

# The published meta-llama/Meta-Llama-3-8B config.json, less keys the spec ignores.
META_LLAMA_3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,  # Llama 3.1: the presets carry its context
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
}


def test_hopper_presets_are_the_datasheet_and_driver_numbers():
    h100, h200 = HARDWARE["h100"], HARDWARE["h200"]
    # What nvidia-smi reports as total, the base a serving engine's memory fraction is taken of.
    assert h100.memory_bytes == 81_559 * MIB_BYTES
    assert h200.memory_bytes == 143_771 * MIB_BYTES
    assert (h100.hbm_bandwidth_bytes_per_s, h200.hbm_bandwidth_bytes_per_s) == (3.35e12, 4.8e12)
    # Same die, same NVLink: only the memory differs.
    assert h100.peak_flops_per_s == h200.peak_flops_per_s == 989e12
    assert h100.link_bandwidth_bytes_per_s == h200.link_bandwidth_bytes_per_s == 450e9
    assert 0 < h100.link_latency_s < 10e-6


def test_the_cpu_preset_is_modest_and_does_not_read_the_host():
    cpu = HARDWARE["cpu"]
    assert cpu.memory_bytes == 24 * 1024**3
    assert cpu.hbm_bandwidth_bytes_per_s < HARDWARE["h100"].hbm_bandwidth_bytes_per_s / 100


def test_hardware_by_name_is_case_insensitive_and_lists_presets_when_unknown():
    assert hardware_by_name(" H200 ") is HARDWARE["h200"]
    with pytest.raises(ValueError, match="unknown hardware 'b200'; presets: cpu, h100, h200"):
        hardware_by_name("b200")


def test_hardware_rejects_a_zero_rate():
    with pytest.raises(ValueError, match="hbm_bandwidth_bytes_per_s"):
        replace(HARDWARE["h100"], hbm_bandwidth_bytes_per_s=0.0)
    with pytest.raises(ValueError, match="memory_bytes"):
        Hardware("x", 0, 1.0, 1.0, 1.0, 0.0)


def test_llama_3_70b_kv_bytes_per_token():
    # 2 (K, V) x 80 layers x 8 KV heads x 128 head dim x 2 bytes
    assert LLAMA_3_70B.kv_bytes_per_token("bf16") == 327_680
    assert LLAMA_3_70B.kv_bytes_per_token("fp8") == 163_840


def test_llama_3_70b_parameter_count():
    # embedding 128256 x 8192 = 1,050,673,152 (and the lm head again);
    # a layer: q, o 2 x 8192^2 + k, v 2 x 8192 x 1024 + MLP 3 x 8192 x 28672 + norms 2 x 8192 = 855,654,400
    expected = 2 * 1_050_673_152 + 80 * 855_654_400 + 8192
    assert LLAMA_3_70B.num_parameters() == expected == 70_553_706_496
    assert LLAMA_3_70B.num_parameters() == pytest.approx(70.5e9, rel=0.01)


def test_llama_3_8b_parameter_count():
    # embedding 128256 x 4096 = 525,336,576; a layer 2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336 + 2 x 4096
    expected = 2 * 525_336_576 + 32 * 218_112_000 + 4096
    assert LLAMA_3_8B.num_parameters() == expected == 8_030_261_248
    assert LLAMA_3_8B.num_parameters() == pytest.approx(8.03e9, rel=0.001)


def test_tied_embeddings_count_the_matrix_once():
    tied = replace(LLAMA_3_8B, tie_word_embeddings=True)
    assert LLAMA_3_8B.num_parameters() - tied.num_parameters() == 128256 * 4096


def test_weight_bytes_scale_with_dtype():
    bf16 = LLAMA_3_70B.weight_bytes("bf16")
    assert bf16 == 2 * 70_553_706_496
    assert LLAMA_3_70B.weight_bytes("fp8") * 2 == bf16
    assert LLAMA_3_70B.weight_bytes("fp32") == 2 * bf16
    assert LLAMA_3_70B.weight_bytes("bfloat16") == bf16  # the replica's spelling
    assert DTYPE_BYTES["fp16"] == 2


def test_an_unknown_dtype_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown dtype 'int4'; one of .*bf16.*fp8"):
        LLAMA_3_70B.weight_bytes("int4")


def test_meta_llama_3_8b_config_gives_the_preset():
    assert ModelSpec.from_hf_config(META_LLAMA_3_8B_CONFIG, name="llama-3-8b") == LLAMA_3_8B


def test_a_config_without_gqa_or_head_dim_takes_the_llama_defaults():
    config = {**META_LLAMA_3_8B_CONFIG, "num_key_value_heads": None}
    spec = ModelSpec.from_hf_config(config, name="mha")
    assert (spec.num_kv_heads, spec.head_dim) == (32, 4096 // 32)


def test_a_config_missing_a_dimension_says_which():
    config = {key: value for key, value in META_LLAMA_3_8B_CONFIG.items() if key != "intermediate_size"}
    with pytest.raises(ValueError, match="no 'intermediate_size'"):
        ModelSpec.from_hf_config(config, name="broken")


def test_heads_must_group_over_kv_heads():
    with pytest.raises(ValueError, match="do not group evenly"):
        replace(LLAMA_3_8B, num_kv_heads=5)


def test_the_tiny_checkpoint_config_matches_the_tiny_llama_preset(tiny_model_dir: Path):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert ModelSpec.from_hf_config(config, name="tiny-llama") == MODELS["tiny-llama"]
    from_directory = model_by_name_or_path(str(tiny_model_dir))
    assert replace(from_directory, name="tiny-llama") == MODELS["tiny-llama"]
    assert from_directory.name == tiny_model_dir.resolve().name
    assert model_by_name_or_path(str(tiny_model_dir / "config.json")) == from_directory


def test_model_by_name_or_path_takes_a_preset_name():
    assert model_by_name_or_path("Llama-3-70B") is LLAMA_3_70B


def test_an_unknown_model_lists_the_presets(tmp_path: Path):
    presets = r"\(llama-3-70b, llama-3-8b, tiny-llama\)"
    with pytest.raises(ValueError, match=rf"'mixtral' is neither a model preset {presets}"):
        model_by_name_or_path("mixtral")
    with pytest.raises(ValueError, match="nor a config.json"):
        model_by_name_or_path(str(tmp_path))  # a directory without a config.json
