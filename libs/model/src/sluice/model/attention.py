"""Attention metadata for a flattened step, and the pluggable attention backend.

The runner fills one ``AttentionMetadata`` per step; every layer reads it.
A backend writes this step's K/V into the layer's paged cache and attends
over it; the default is the torch reference from ``sluice.kernels``, and a
Triton backend can be passed to ``LlamaModel`` on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from sluice.kernels import paged_attention, write_kv
from sluice.kernels import paged_attention_native
from sluice.kernels.paged_attention_cpu import StepRows, native_prefill_max_context, paged_attention_cpu, write_kv_cpu
from sluice.model.kv_cache import KVCache, KVLayout


@dataclass(slots=True, frozen=True)
class AttentionMetadata:
    """Where this step's tokens live in the paged cache.

    slot_mapping:    [num_tokens] int64, cache slot of each token (-1 = padding)
    block_tables:    [num_seqs, max_blocks_per_seq] int32 (rows padded with 0)
    seq_lens:        [num_seqs] int32, context length including this step
    query_start_loc: [num_seqs + 1] int32, cumulative query counts from 0
    max_query_len, max_seq_len: host ints, so kernels can size their launch
    grid without a device-to-host sync.
    derived:         what a backend derives from the above, kept by the
                     first layer for the others (every layer reads the same
                     metadata); the backend names its own keys.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]


class AttentionBackend(Protocol):
    def __call__(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: KVCache,
        attn: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...


def reference_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: KVCache,
    attn: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Torch reference backend: write K/V, then paged attention over the cache.
    Block-major caches only (its write_kv views the raw storage)."""
    if kv_cache.layout is not KVLayout.BLOCK_MAJOR:
        raise ValueError(f"reference_attention needs a block-major KV cache, got {kv_cache.layout}")
    write_kv(key, value, kv_cache.key_cache, kv_cache.value_cache, attn.slot_mapping)
    return paged_attention(
        query,
        kv_cache.key_cache,
        kv_cache.value_cache,
        attn.block_tables,
        attn.seq_lens,
        attn.query_start_loc,
        scale,
    )


def cpu_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: KVCache,
    attn: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """The CPU serving backend: write K/V, then vectorised paged attention.
    Any KV layout; ``preferred_kv_layout`` names the fast one."""
    write_kv_cpu(key, value, kv_cache.key_cache, kv_cache.value_cache, attn.slot_mapping)
    rows = attn.derived.get("cpu_step_rows")
    if rows is None:  # the step's first layer
        rows = attn.derived["cpu_step_rows"] = StepRows.of(
            attn.seq_lens, attn.query_start_loc, native_prefill_max_context(kv_cache.key_cache))
    return paged_attention_cpu(
        query,
        kv_cache.key_cache,
        kv_cache.value_cache,
        attn.block_tables,
        attn.seq_lens,
        attn.query_start_loc,
        scale,
        rows,
    )


def default_backend(device: torch.device) -> AttentionBackend:
    """Triton kernels on CUDA, the vectorised torch path elsewhere."""
    if device.type == "cuda":
        from sluice.kernels import triton_attention

        return triton_attention
    return cpu_attention


def preferred_kv_layout(device: torch.device, dtype: torch.dtype = torch.float32) -> KVLayout:
    """The KV cache layout ``default_backend(device)`` runs fastest on: the
    Triton kernels index block-major caches; on CPU the native kernel (float32,
    where built) reads a block's keys (transposed) and values in place, both
    in one contiguous run per block (BLOCK_INTERLEAVED), and the torch path
    gathers head-major caches with one index_select into an SDPA-friendly
    layout."""
    if device.type == "cuda":
        return KVLayout.BLOCK_MAJOR
    if dtype == torch.float32 and paged_attention_native.available():
        return KVLayout.BLOCK_INTERLEAVED
    return KVLayout.HEAD_MAJOR
