"""Llama-family torch model over a paged KV cache, HF loader, sampler, runner."""

from sluice.model.attention import AttentionBackend, AttentionMetadata, reference_attention
from sluice.model.config import LlamaConfig, RopeScaling
from sluice.model.kv_cache import KVCache, KVLayout, allocate_kv_caches, kv_bytes_per_token
from sluice.model.llama import LlamaModel
from sluice.model.loader import CheckpointError, load_config, load_llama
from sluice.model.runner import ModelInput, ModelOutput, ModelRunner, SequenceInput
from sluice.model.sampler import SampleRequest, Sampler, SamplingParams

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "CheckpointError",
    "KVCache",
    "KVLayout",
    "LlamaConfig",
    "LlamaModel",
    "ModelInput",
    "ModelOutput",
    "ModelRunner",
    "RopeScaling",
    "SampleRequest",
    "Sampler",
    "SamplingParams",
    "SequenceInput",
    "allocate_kv_caches",
    "kv_bytes_per_token",
    "load_config",
    "load_llama",
    "reference_attention",
]
