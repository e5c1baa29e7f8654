"""Load a Hugging Face Llama checkpoint (safetensors) into ``LlamaModel``.

Accepted layouts in ``model_dir``:

    config.json + model.safetensors                       (single file)
    config.json + model.safetensors.index.json + shards   (weight_map: name -> file)

Checkpoint names are HF's (``model.layers.0.self_attn.q_proj.weight``,
``lm_head.weight``); ours are the same without the ``model.`` prefix.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open

from sluice.model.config import LlamaConfig
from sluice.model.cpu_linear import onednn_linear_available
from sluice.model.llama import AttentionBackend, LlamaModel

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Present in some older exports; derived from the config, never loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """The checkpoint does not match the model the config describes."""


def load_config(model_dir: Path) -> LlamaConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path} not found")
    return LlamaConfig.from_hf_config(json.loads(path.read_text()))


def load_llama(
    model_dir: Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attention_backend: AttentionBackend | None = None,
) -> LlamaModel:
    """Build the model from ``config.json`` and fill it from safetensors.

    The model is built on the meta device (no random init of billions of
    weights), materialised empty on ``device``, then every parameter is
    copied from the checkpoint, cast to ``dtype``. Every parameter must be
    filled exactly once, or ``CheckpointError`` names what is wrong.
    """
    model_dir = Path(model_dir)
    config = load_config(model_dir)
    with torch.device("meta"):
        model = LlamaModel(config, attention_backend)
    model = model.to(dtype=dtype).to_empty(device=device)  # rope buffers rebuilt in _apply
    model.tie_weights()
    model.requires_grad_(False)
    model.eval()

    params = dict(model.named_parameters())  # tied lm_head appears once, as embed_tokens
    filled: set[str] = set()
    unexpected: list[str] = []
    misshaped: list[str] = []
    for file, names in _tensor_files(model_dir).items():
        with safe_open(str(model_dir / file), framework="pt", device="cpu") as f:
            for hf_name in names:
                name = _to_model_name(hf_name)
                if name is None:
                    continue
                if name == "lm_head.weight" and config.tie_word_embeddings:
                    continue  # some exports store the tied copy too; the embedding wins
                param = params.get(name)
                if param is None:
                    unexpected.append(hf_name)
                    continue
                tensor = f.get_tensor(hf_name)
                if tuple(tensor.shape) != tuple(param.shape):
                    misshaped.append(
                        f"{hf_name}: checkpoint {tuple(tensor.shape)}, model {tuple(param.shape)}"
                    )
                    continue
                param.copy_(tensor.to(dtype))
                filled.add(name)
    missing = sorted(set(params) - filled)
    problems = _describe("missing", missing) + _describe("unexpected", unexpected)
    problems += _describe("misshaped", misshaped)
    if problems:
        raise CheckpointError(f"checkpoint {model_dir} does not fit the config: " + "; ".join(problems))
    model.fuse_projections()
    if torch.device(device).type == "cpu" and onednn_linear_available(dtype):
        model.pack_for_cpu()
    return model


def _tensor_files(model_dir: Path) -> dict[str, list[str]]:
    """safetensors file -> tensor names in it."""
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        weight_map = json.loads(index_path.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index_path} has no weight_map")
        by_file: dict[str, list[str]] = defaultdict(list)
        for name, file in weight_map.items():
            by_file[file].append(name)
        for file in by_file:
            if not (model_dir / file).is_file():
                raise CheckpointError(f"shard {file} named in {INDEX_FILE} is missing")
        return dict(by_file)
    single = model_dir / SINGLE_FILE
    if single.is_file():
        with safe_open(str(single), framework="pt", device="cpu") as f:
            return {SINGLE_FILE: list(f.keys())}
    raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}")


def _to_model_name(hf_name: str) -> str | None:
    """HF tensor name -> our parameter name; None for tensors we derive ourselves."""
    if hf_name.endswith(_IGNORED_SUFFIXES):
        return None
    if hf_name.startswith("model."):
        return hf_name[len("model.") :]
    return hf_name  # lm_head.weight, or something unexpected that the caller reports


def _describe(kind: str, names: list[str], limit: int = 8) -> list[str]:
    if not names:
        return []
    shown = ", ".join(names[:limit])
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return [f"{len(names)} {kind}: {shown}{more}"]
