"""Triton scatter of this step's keys/values into the paged cache.

Same contract as ``paged_attention_reference.write_kv``. The reference
uses boolean indexing (``slot_mapping[slot_mapping >= 0]``), which makes a
device-to-host sync and cannot be captured in a CUDA graph; this kernel reads
each token's slot on the device and skips ``-1`` itself.

One program per token: it copies the token's ``[num_kv_heads, head_dim]``
key and value rows (a contiguous ``KVH * D`` run in the cache) to its slot.

Triton is imported at module import; import this module lazily.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sluice.kernels._checks import check_paged_cache, next_power_of_2


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, HEAD_DIM]
    value_ptr,
    key_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    value_cache_ptr,
    slot_mapping_ptr,  # [num_tokens]
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_ct,
    stride_ch,
    NUM_KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    # slot < 0 (padding): every lane masked off, nothing is read or written.
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM) & (slot >= 0)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    cache_off = block * stride_cb + offset * stride_ct + heads[:, None] * stride_ch + dims[None, :]
    k = tl.load(key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    tl.store(key_cache_ptr + cache_off, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + cache_off, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter keys/values into the paged cache in place, no host sync.

    key, value: [num_tokens, num_kv_heads, head_dim], last dim contiguous
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: [num_tokens] int32/int64; -1 marks a padding token to skip.
    """
    _, block_size, num_kv_heads, head_dim = check_paged_cache(
        key_cache, value_cache, key_cache.dtype
    )
    assert key.shape == value.shape, (key.shape, value.shape)
    assert key.dim() == 3 and key.shape[1:] == (num_kv_heads, head_dim), (
        key.shape,
        key_cache.shape,
    )
    assert key.stride(-1) == 1 and value.stride(-1) == 1, "key/value head_dim must be contiguous"
    assert slot_mapping.shape == (key.shape[0],), (slot_mapping.shape, key.shape)
    assert slot_mapping.dtype in (torch.int32, torch.int64), slot_mapping.dtype
    assert key.device == key_cache.device == slot_mapping.device, (
        key.device,
        key_cache.device,
        slot_mapping.device,
    )
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEADS_PAD=next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        num_warps=4,
    )
