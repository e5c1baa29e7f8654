"""AttentionBackend built on the Triton kernels (the CUDA path of a replica).

``triton_attention`` has the ``AttentionBackend`` signature of
``sluice.model.attention``: it writes this step's K/V into the layer's paged
cache (Triton scatter, no host sync), then attends with the decode kernel
when every sequence has one query token (``max_query_len == 1``) and with
the chunked-prefill kernel otherwise (prefill chunks, or mixed batches where
decode rows are ``q_len = 1``).

This module imports triton only inside the function, so importing it is
free; the model package need not import it at all on CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # avoid a runtime dependency of sluice.kernels on sluice.model
    from sluice.model.attention import AttentionMetadata
    from sluice.model.kv_cache import KVCache


def triton_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: KVCache,
    attn: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Write K/V, then Triton paged attention over the cache."""
    from sluice.kernels.triton_paged_decode import paged_decode_attention
    from sluice.kernels.triton_paged_prefill import paged_prefill_attention
    from sluice.kernels.triton_write_kv import write_kv_triton

    write_kv_triton(key, value, kv_cache.key_cache, kv_cache.value_cache, attn.slot_mapping)
    num_seqs = attn.seq_lens.shape[0]
    num_tokens = query.shape[0]
    if attn.max_query_len == 1 and num_tokens >= num_seqs:
        # Pure decode: query row i is sequence i's token (query_start_loc is
        # 0..num_seqs); rows past num_seqs are padding and stay zero.
        out = torch.empty_like(query) if num_tokens == num_seqs else torch.zeros_like(query)
        paged_decode_attention(
            query[:num_seqs],
            kv_cache.key_cache,
            kv_cache.value_cache,
            attn.block_tables,
            attn.seq_lens,
            scale,
            out=out[:num_seqs],
            max_seq_len=attn.max_seq_len,
        )
        return out
    return paged_prefill_attention(
        query,
        kv_cache.key_cache,
        kv_cache.value_cache,
        attn.block_tables,
        attn.seq_lens,
        attn.query_start_loc,
        attn.max_query_len,
        scale,
    )
