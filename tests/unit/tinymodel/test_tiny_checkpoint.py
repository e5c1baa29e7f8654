"""The tiny checkpoint builder: layout, config, tensors, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from sluice.tinymodel import build_tiny_checkpoint
from sluice.tinymodel.__main__ import main
from sluice.tinymodel.tokenizer_build import SPECIAL_TOKENS
from sluice.tinymodel.weights import TinyLlamaDims, init_weights

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


def _load_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_checkpoint_has_exactly_the_hf_files(tiny_model_dir: Path) -> None:
    assert {p.name for p in tiny_model_dir.iterdir()} == EXPECTED_FILES


def test_config_matches_the_tiny_llama_spec(tiny_model_dir: Path) -> None:
    config = _load_json(tiny_model_dir / "config.json")
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (256, 688, 4)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (8, 4, 32)
    assert config["vocab_size"] == 32000
    assert config["max_position_embeddings"] == 4096
    assert config["rms_norm_eps"] == 1e-5
    assert config["rope_theta"] == 10000.0
    assert config["tie_word_embeddings"] is False
    assert config["torch_dtype"] == "float32"
    assert config["hidden_act"] == "silu"
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 3)


def test_special_token_ids_agree_across_files(tiny_model_dir: Path) -> None:
    tokenizer = _load_json(tiny_model_dir / "tokenizer.json")
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert added == {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    generation = _load_json(tiny_model_dir / "generation_config.json")
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    tokenizer_config = _load_json(tiny_model_dir / "tokenizer_config.json")
    assert tokenizer_config["bos_token"] == "<s>"
    assert tokenizer_config["eos_token"] == "</s>"
    assert tokenizer_config["unk_token"] == "<unk>"
    assert tokenizer_config["pad_token"] == "<pad>"
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tokenizer_config["model_max_length"] == 4096
    assert "chat_template" in tokenizer_config


def test_weights_use_hf_llama_names_shapes_and_float32(tiny_model_dir: Path) -> None:
    with safe_open(str(tiny_model_dir / "model.safetensors"), framework="pt") as weights:
        assert weights.metadata() == {"format": "pt"}
        shapes = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
        dtypes = {weights.get_slice(name).get_dtype() for name in weights.keys()}
        final_norm = weights.get_tensor("model.norm.weight")
    assert dtypes == {"F32"}
    expected = {
        "model.embed_tokens.weight": (32000, 256),
        "model.norm.weight": (256,),
        "lm_head.weight": (32000, 256),
    }
    for layer in range(4):
        p = f"model.layers.{layer}"
        expected |= {
            f"{p}.self_attn.q_proj.weight": (256, 256),
            f"{p}.self_attn.k_proj.weight": (128, 256),
            f"{p}.self_attn.v_proj.weight": (128, 256),
            f"{p}.self_attn.o_proj.weight": (256, 256),
            f"{p}.mlp.gate_proj.weight": (688, 256),
            f"{p}.mlp.up_proj.weight": (688, 256),
            f"{p}.mlp.down_proj.weight": (256, 688),
            f"{p}.input_layernorm.weight": (256,),
            f"{p}.post_attention_layernorm.weight": (256,),
        }
    assert shapes == expected
    assert bool((final_norm == 1.0).all())


def test_building_twice_gives_byte_identical_files(tmp_path: Path) -> None:
    first = build_tiny_checkpoint(tmp_path / "first")
    second = build_tiny_checkpoint(tmp_path / "second")
    assert {p.name for p in first.iterdir()} == EXPECTED_FILES
    for name in sorted(EXPECTED_FILES):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert not list(tmp_path.glob(".*")), "staging directory left behind"


def test_seed_changes_the_weights() -> None:
    dims = TinyLlamaDims(vocab_size=64, num_hidden_layers=1)
    seed0, seed0_again, seed1 = (init_weights(dims, seed=s) for s in (0, 0, 1))
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(seed0[name], seed0_again[name])
    assert not torch.equal(seed0[name], seed1[name])
    assert 0.015 < float(seed0["model.embed_tokens.weight"].std()) < 0.025


def test_cli_skips_an_existing_checkpoint_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "model"
    out_dir.mkdir()
    (out_dir / "config.json").write_text("{}")
    assert main([str(out_dir)]) == 0
    assert "already holds a checkpoint" in capsys.readouterr().err
    assert (out_dir / "config.json").read_text() == "{}"
