"""Build the tiny Llama checkpoint in Hugging Face format, offline.

Output layout (all deterministic for a given seed and Python stdlib):

    OUT_DIR/
      config.json               LlamaForCausalLM config
      generation_config.json
      model.safetensors         float32, ~20M params (~80 MB)
      tokenizer.json            byte-level BPE, 32000 tokens
      tokenizer_config.json     special tokens + chat template
      special_tokens_map.json

The directory appears atomically: files are written into a temporary sibling
that is renamed into place, so a concurrent reader (another pytest worker)
never sees a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import save_file

from sluice.tinymodel.tokenizer_build import (
    BOS_TOKEN,
    EOS_TOKEN,
    MODEL_MAX_LENGTH_TOKENS,
    PAD_TOKEN,
    stdlib_corpus,
    tokenizer_files,
    train_tokenizer,
)
from sluice.tinymodel.weights import TinyLlamaDims, init_weights

# Fixed metadata: safetensors would otherwise carry nothing variable, but
# transformers requires {"format": "pt"} to load the file.
_SAFETENSORS_METADATA = {"format": "pt"}


def build_tiny_checkpoint(out_dir: Path, *, seed: int = 0, num_layers: int | None = None) -> Path:
    """Build the checkpoint into out_dir (replacing it if present); return out_dir.

    `num_layers` below the default builds a smaller model with the same
    tokenizer and chat template: the fallback version of the overload tests
    and the routing rules (a version that takes another's traffic must
    read the same token ids)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        _write_checkpoint(staging, seed=seed, num_layers=num_layers)
        # mkdtemp makes the directory private (0700) and safetensors writes
        # 0600; a checkpoint is meant to be read by other users (containers).
        staging.chmod(0o755)
        for path in staging.iterdir():
            path.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        try:
            os.rename(staging, out_dir)
        except OSError:
            # Another process finished the same build first; keep theirs.
            if not (out_dir / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _write_checkpoint(directory: Path, *, seed: int, num_layers: int | None) -> None:
    dims = TinyLlamaDims() if num_layers is None else TinyLlamaDims(num_hidden_layers=num_layers)
    tokenizer = train_tokenizer(dims.vocab_size, stdlib_corpus())
    files = tokenizer_files(tokenizer)
    special_ids = {
        "bos_token_id": tokenizer.token_to_id(BOS_TOKEN),
        "eos_token_id": tokenizer.token_to_id(EOS_TOKEN),
        "pad_token_id": tokenizer.token_to_id(PAD_TOKEN),
    }

    (directory / "tokenizer.json").write_text(files.tokenizer_json + "\n", encoding="utf-8")
    _write_json(directory / "tokenizer_config.json", files.tokenizer_config)
    _write_json(directory / "special_tokens_map.json", files.special_tokens_map)
    _write_json(directory / "generation_config.json", special_ids)
    save_file(init_weights(dims, seed=seed), str(directory / "model.safetensors"), metadata=_SAFETENSORS_METADATA)
    # config.json last: its presence marks a complete checkpoint.
    _write_json(directory / "config.json", _hf_config(dims, special_ids))


def _hf_config(dims: TinyLlamaDims, special_ids: dict[str, int]) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dims.hidden_size,
        "intermediate_size": dims.intermediate_size,
        "num_hidden_layers": dims.num_hidden_layers,
        "num_attention_heads": dims.num_attention_heads,
        "num_key_value_heads": dims.num_key_value_heads,
        "head_dim": dims.head_dim,
        "vocab_size": dims.vocab_size,
        "max_position_embeddings": MODEL_MAX_LENGTH_TOKENS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "use_cache": True,
        **special_ids,
    }


def _write_json(path: Path, document: dict[str, object]) -> None:
    # sort_keys + fixed indent: byte-identical output on every build.
    text = json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False)
    path.write_text(text + "\n", encoding="utf-8")
