"""Load a Hugging Face Llama checkpoint (safetensors) into ``LlamaModel``.

Accepted layouts in ``model_dir``:

    config.json + model.safetensors                       (single file)
    config.json + model.safetensors.index.json + shards   (weight_map: name -> file)

Checkpoint names are HF's (``model.layers.0.self_attn.q_proj.weight``,
``lm_head.weight``); ours are the same without the ``model.`` prefix, except
that q/k/v and gate/up are row shards of one fused Linear each
(``llama.STACKED_SHARDS``): ``q_proj.weight`` fills the first rows of
``qkv_proj.weight``. On CPU in float32 the loader then applies the machine's
fast path (sluice.model.cpu_fast_path).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import safe_open

from sluice.model.config import LlamaConfig
from sluice.model.cpu_fast_path import apply_cpu_fast_path, choose_linears
from sluice.model.cpu_kernel_probe import choose_and_apply_kernels
from sluice.model.llama import STACKED_SHARDS, AttentionBackend, LlamaModel

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
    cpu_linears: str = "auto",
    probe_cache_dir: Path | None = None,
) -> LlamaModel:
    """Build the model from ``config.json`` and fill it from safetensors.

    The model is built on the meta device (no random init of billions of
    weights), materialised empty on ``device``, then every parameter is
    copied from the checkpoint, cast to ``dtype``. Every parameter must be
    filled exactly once, or ``CheckpointError`` names what is wrong.

    ``cpu_linears`` ("auto", "onednn", "torch") and ``probe_cache_dir``:
    which linear implementation a float32 model on CPU runs (see
    cpu_fast_path; "auto" measures this machine, caching in the dir).
    """
    model_dir = Path(model_dir)
    config = load_config(model_dir)
    model = empty_llama(config, dtype=dtype, device=device, attention_backend=attention_backend)

    params = dict(model.named_parameters())  # tied lm_head appears once, as embed_tokens
    slots = _checkpoint_slots(model, params)
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
                slot = slots.get(name)
                if slot is None:
                    unexpected.append(hf_name)
                    continue
                tensor = f.get_tensor(hf_name)
                if tuple(tensor.shape) != tuple(slot.shape):
                    misshaped.append(f"{hf_name}: checkpoint {tuple(tensor.shape)}, model {tuple(slot.shape)}")
                    continue
                slot.copy_(tensor.to(dtype))
                filled.add(name)
    missing = sorted(set(slots) - filled)
    problems = _describe("missing", missing) + _describe("unexpected", unexpected)
    problems += _describe("misshaped", misshaped)
    if problems:
        raise CheckpointError(f"checkpoint {model_dir} does not fit the config: " + "; ".join(problems))
    return finish_for_device(model, dtype=dtype, device=device, cpu_linears=cpu_linears,
                             probe_cache_dir=probe_cache_dir)


def empty_llama(
    config: LlamaConfig,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    attention_backend: AttentionBackend | None = None,
) -> LlamaModel:
    """The model of ``config`` materialised empty on ``device`` in ``dtype``,
    its weights tied, frozen and in eval mode: built on the meta device, so
    billions of weights are never randomly initialised only to be
    overwritten. Every parameter is left for the caller to fill."""
    with torch.device("meta"):
        model = LlamaModel(config, attention_backend)
    model = model.to(dtype=dtype).to_empty(device=device)  # rope buffers rebuilt in _apply
    model.tie_weights()
    model.requires_grad_(False)
    model.eval()
    return model


def finish_for_device(
    model: LlamaModel,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    cpu_linears: str = "auto",
    probe_cache_dir: Path | None = None,
) -> LlamaModel:
    """A filled model's fast path for its device: on CPU in float32, the
    machine's fastest build of each native kernel (cpu_kernel_probe; first,
    so the linear probe times the LM head's screen on it) and linear
    implementation per shape (cpu_fast_path), both measured under "auto"."""
    if torch.device(device).type == "cpu" and dtype == torch.float32:
        if cpu_linears == "auto":
            choose_and_apply_kernels(model.config, probe_cache_dir)
        apply_cpu_fast_path(model, choose_linears(model, cpu_linears, cache_dir=probe_cache_dir))
    return model


def _checkpoint_slots(model: LlamaModel, params: dict[str, torch.nn.Parameter]) -> dict[str, torch.Tensor]:
    """Checkpoint name (without ``model.``) -> the tensor it fills: a
    parameter, or for a stacked projection its rows of the fused one
    (``layers.0.self_attn.k_proj.weight`` -> ``qkv_proj.weight[q_rows:q_rows + kv_rows]``)."""
    slots: dict[str, torch.Tensor] = {}
    for name, param in params.items():
        module_name, _, leaf = name.rpartition(".")  # "layers.0.self_attn.qkv_proj", "weight"
        parent_name, _, fused = module_name.rpartition(".")
        shards = sorted((index, shard) for shard, (target, index) in STACKED_SHARDS.items() if target == fused)
        if not shards:
            slots[name] = param
            continue
        rows = model.get_submodule(parent_name).shard_rows()
        start = 0
        for (_, shard), count in zip(shards, rows):  # shards in their row order
            slots[f"{parent_name}.{shard}.{leaf}"] = param.detach()[start:start + count]
            start += count
    return slots


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
