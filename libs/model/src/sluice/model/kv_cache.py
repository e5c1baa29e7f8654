"""Per-layer paged KV cache tensors and the KV capacity arithmetic."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sluice.model.config import LlamaConfig


@dataclass(slots=True, frozen=True)
class KVCache:
    """One layer's cache. Both tensors: [num_blocks, block_size, num_kv_heads, head_dim].

    The tensors are written in place by the attention backend during
    forward; the block manager (engine) decides which slots a step may write.
    """

    key_cache: torch.Tensor
    value_cache: torch.Tensor

    @property
    def num_blocks(self) -> int:
        return self.key_cache.shape[0]

    @property
    def block_size(self) -> int:
        return self.key_cache.shape[1]


def kv_bytes_per_token(config: LlamaConfig, dtype: torch.dtype) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x dtype bytes."""
    dtype_bytes = torch.empty((), dtype=dtype).element_size()
    return (
        2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * dtype_bytes
    )


def allocate_kv_caches(
    config: LlamaConfig,
    num_blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[KVCache]:
    """Zero-filled caches, one per layer.

    Zeros rather than torch.empty: a kernel bug that reads an unwritten slot
    then produces finite garbage that tests catch, not NaNs from stale memory
    that poison a whole softmax row. The cost is paid once at start-up.
    """
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(f"num_blocks and block_size must be > 0, got {num_blocks}, {block_size}")
    shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    return [
        KVCache(
            key_cache=torch.zeros(shape, dtype=dtype, device=device),
            value_cache=torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(config.num_hidden_layers)
    ]
