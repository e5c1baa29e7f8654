"""Per-layer paged KV cache tensors and the KV capacity arithmetic."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from sluice.model.config import LlamaConfig


class KVLayout(Enum):
    """Physical layout behind the logical [num_blocks, block_size, kv_heads, head_dim] shape.

    BLOCK_MAJOR: contiguous in the logical order (the Triton kernels' layout).
    HEAD_MAJOR:  storage [kv_heads, num_blocks, block_size, head_dim], exposed as
                 storage.permute(1, 2, 0, 3); the CPU backend gathers a head's
                 blocks with one index_select into a contiguous [L, head_dim]
                 layout that SDPA reads fast (see sluice.kernels.paged_attention_cpu).

    HEAD_MAJOR_TRANSPOSED_KEYS: values head-major; keys stored
                 [kv_heads, num_blocks, head_dim, block_size] (key view =
                 storage.permute(1, 3, 0, 2)), so the native CPU kernel
                 computes a block's scores as block_size-wide vector FMAs.
    BLOCK_INTERLEAVED: keys and values of a block side by side in one
                 storage [num_blocks, 2, kv_heads, head_dim * block_size]:
                 index 0 holds each head's keys transposed, [head_dim,
                 block_size] as above, index 1 each head's values
                 [block_size, head_dim]. One block of one layer is one
                 contiguous run (16 KiB for the tiny model), so the native
                 kernel reads a sequence in as many runs as it has blocks
                 however the pool scattered them. Head-major runs are a
                 quarter of that per KV head, and a replica that has cycled
                 through its pool (LRU eviction hands out blocks from
                 anywhere) paid ~1.9x for its decode attention in them.
    """

    BLOCK_MAJOR = "block_major"
    HEAD_MAJOR = "head_major"
    HEAD_MAJOR_TRANSPOSED_KEYS = "head_major_transposed_keys"
    BLOCK_INTERLEAVED = "block_interleaved"


@dataclass(slots=True, frozen=True)
class KVCache:
    """One layer's cache. Both tensors have the logical shape
    [num_blocks, block_size, num_kv_heads, head_dim], whatever ``layout`` they
    are stored in; code that reads them through that shape (indexing, the torch
    reference) works on either layout, code that views raw storage must ask
    ``layout`` first.

    The tensors are written in place by the attention backend during
    forward; the block manager (engine) decides which slots a step may write.
    """

    key_cache: torch.Tensor
    value_cache: torch.Tensor

    @property
    def layout(self) -> KVLayout:
        # Checked in this order where layouts coincide (one KV head, one slot per block).
        key, value = self.key_cache, self.value_cache
        if key.is_contiguous() and value.is_contiguous():
            return KVLayout.BLOCK_MAJOR
        if value.permute(2, 0, 1, 3).is_contiguous():
            if key.permute(2, 0, 1, 3).is_contiguous():
                return KVLayout.HEAD_MAJOR
            if key.permute(2, 0, 3, 1).is_contiguous():
                return KVLayout.HEAD_MAJOR_TRANSPOSED_KEYS
        if _interleaved(key, value):
            return KVLayout.BLOCK_INTERLEAVED
        raise ValueError(f"KV cache with strides {key.stride()}, {value.stride()} has no known layout")

    @property
    def num_blocks(self) -> int:
        return self.key_cache.shape[0]

    @property
    def block_size(self) -> int:
        return self.key_cache.shape[1]


def _interleaved(key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether the two logical views are the halves of one BLOCK_INTERLEAVED storage."""
    _, block_size, kv_heads, head_dim = key.shape
    run = kv_heads * head_dim * block_size  # one block's keys, or its values
    return (
        key.stride() == (2 * run, 1, head_dim * block_size, block_size)
        and value.stride() == (2 * run, head_dim, head_dim * block_size, 1)
        and value.data_ptr() - key.data_ptr() == run * key.element_size()
    )


def interleaved_kv(num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                   device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed key and value caches in the BLOCK_INTERLEAVED layout, as their
    logical [num_blocks, block_size, kv_heads, head_dim] views of one storage."""
    storage = torch.zeros(num_blocks, 2, kv_heads, head_dim * block_size, dtype=dtype, device=device)
    keys = storage[:, 0].view(num_blocks, kv_heads, head_dim, block_size).permute(0, 3, 1, 2)
    values = storage[:, 1].view(num_blocks, kv_heads, block_size, head_dim).permute(0, 2, 1, 3)
    return keys, values


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
    layout: KVLayout = KVLayout.BLOCK_MAJOR,
) -> list[KVCache]:
    """Zero-filled caches, one per layer, in the given physical layout
    (``sluice.model.attention.preferred_kv_layout`` names the backend's choice).

    Zeros rather than torch.empty: a kernel bug that reads an unwritten slot
    then produces finite garbage that tests catch, not NaNs from stale memory
    that poison a whole softmax row. The cost is paid once at start-up.
    """
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(f"num_blocks and block_size must be > 0, got {num_blocks}, {block_size}")
    kv_heads, head_dim = config.num_key_value_heads, config.head_dim
    if layout is KVLayout.BLOCK_INTERLEAVED:
        return [KVCache(*interleaved_kv(num_blocks, block_size, kv_heads, head_dim, dtype, device))
                for _ in range(config.num_hidden_layers)]

    def zeros(transposed: bool = False) -> torch.Tensor:
        if transposed:
            storage = torch.zeros(kv_heads, num_blocks, head_dim, block_size, dtype=dtype, device=device)
            return storage.permute(1, 3, 0, 2)  # [num_blocks, block_size, kv_heads, head_dim]
        if layout is KVLayout.BLOCK_MAJOR:
            return torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=device)
        storage = torch.zeros(kv_heads, num_blocks, block_size, head_dim, dtype=dtype, device=device)
        return storage.permute(1, 2, 0, 3)  # [num_blocks, block_size, kv_heads, head_dim]

    transposed_keys = layout is KVLayout.HEAD_MAJOR_TRANSPOSED_KEYS
    return [KVCache(key_cache=zeros(transposed_keys), value_cache=zeros()) for _ in range(config.num_hidden_layers)]
