"""Plain torch reference for attention over a paged KV cache.

Layout of one layer's cache (the same for keys and values)::

    key_cache: [num_blocks, block_size, num_kv_heads, head_dim]

    slot = block_id * block_size + offset_in_block
    token at context position p of sequence i lives in slot
        block_tables[i, p // block_size] * block_size + p % block_size

A step runs a flattened ragged batch: the query tokens of all sequences are
concatenated, and ``query_start_loc`` marks where each sequence's run starts::

    query:           [ s0 s0 s0 s0 | s1 | s2 s2 | s3 ]   (num_tokens = 8)
    query_start_loc: [ 0,            4,   5,      7,  8 ]
    seq_lens:        [ 4,            9,   130,    1 ]

Sequence i's queries are the LAST ``q_len_i`` positions of its context of
``seq_lens[i]`` tokens (their keys/values must already be in the cache:
call ``write_kv`` first). A decode step is ``q_len = 1``; a prefill chunk
that starts mid-context (chunked prefill, prefix-cache hit) has
``q_len < seq_len``. Masking is causal by position.

This module is written for clarity: it loops over sequences, and inside a
sequence everything is vectorised. It computes in float32 whatever the
input dtype, so it can serve as the reference for bf16/fp16 kernels.
"""

from __future__ import annotations

import torch


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter this step's keys/values into the paged cache, in place.

    key, value: [num_tokens, num_kv_heads, head_dim]
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: [num_tokens] int64; -1 marks a padding token to skip.
    """
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    assert value_cache.shape == key_cache.shape, (value_cache.shape, key_cache.shape)
    assert key.shape == value.shape, (key.shape, value.shape)
    assert key.shape[1:] == (num_kv_heads, head_dim), (key.shape, key_cache.shape)
    assert slot_mapping.shape == (key.shape[0],), (slot_mapping.shape, key.shape)

    valid = slot_mapping >= 0  # [num_tokens] bool
    slots = slot_mapping[valid]  # [num_valid]
    # A flat view shares storage with the cache, so index_copy_ writes through.
    flat_key_cache = key_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    flat_value_cache = value_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    flat_key_cache.index_copy_(0, slots, key[valid].to(key_cache.dtype))
    flat_value_cache.index_copy_(0, slots, value[valid].to(value_cache.dtype))


def gather_context(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> torch.Tensor:
    """The first ``seq_len`` cached tokens of one sequence, in position order.

    cache: [num_blocks, block_size, num_kv_heads, head_dim]
    block_table: [max_blocks_per_seq] (entries past the used blocks are ignored)
    returns: [seq_len, num_kv_heads, head_dim]
    """
    _, block_size, num_kv_heads, head_dim = cache.shape
    num_used_blocks = (seq_len + block_size - 1) // block_size
    block_ids = block_table[:num_used_blocks].long()  # [num_used_blocks]
    blocks = cache[block_ids]  # [num_used_blocks, block_size, num_kv_heads, head_dim]
    tokens = blocks.reshape(num_used_blocks * block_size, num_kv_heads, head_dim)
    return tokens[:seq_len]  # [seq_len, num_kv_heads, head_dim]


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a ragged query batch over a paged KV cache.

    query: [num_tokens, num_heads, head_dim]
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: [num_seqs, max_blocks_per_seq] int32
    seq_lens: [num_seqs] context length including this step's tokens
    query_start_loc: [num_seqs + 1] cumulative query counts, starting at 0
    returns: [num_tokens, num_heads, head_dim] in query.dtype

    Query heads map to KV heads in contiguous groups (HF/Llama GQA):
    query head h reads KV head ``h // (num_heads // num_kv_heads)``.
    Tokens past ``query_start_loc[-1]`` (padding) get zeros.
    """
    num_tokens, num_heads, head_dim = query.shape
    _, _, num_kv_heads, cache_head_dim = key_cache.shape
    assert cache_head_dim == head_dim, (key_cache.shape, query.shape)
    assert value_cache.shape == key_cache.shape, (value_cache.shape, key_cache.shape)
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    num_seqs = seq_lens.shape[0]
    assert query_start_loc.shape == (num_seqs + 1,), (query_start_loc.shape, num_seqs)
    assert block_tables.shape[0] == num_seqs, (block_tables.shape, num_seqs)
    group_size = num_heads // num_kv_heads

    out = torch.zeros_like(query)
    # One host sync for the lengths; the reference is not meant to be fast.
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i in range(num_seqs):
        q_start, q_end, seq_len = starts[i], starts[i + 1], lens[i]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        assert 0 < q_len <= seq_len, f"seq {i}: q_len={q_len} > seq_len={seq_len}"

        q = query[q_start:q_end].float()  # [q_len, num_heads, head_dim]
        k = gather_context(key_cache, block_tables[i], seq_len).float()
        v = gather_context(value_cache, block_tables[i], seq_len).float()
        # k, v: [seq_len, num_kv_heads, head_dim]
        k = k.repeat_interleave(group_size, dim=1)  # [seq_len, num_heads, head_dim]
        v = v.repeat_interleave(group_size, dim=1)  # [seq_len, num_heads, head_dim]

        # [num_heads, q_len, head_dim] @ [num_heads, head_dim, seq_len]
        scores = torch.matmul(q.transpose(0, 1), k.permute(1, 2, 0)) * scale
        # scores: [num_heads, q_len, seq_len]

        query_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)  # [q_len]
        key_pos = torch.arange(seq_len, device=query.device)  # [seq_len]
        allowed = key_pos[None, :] <= query_pos[:, None]  # [q_len, seq_len]
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)  # [num_heads, q_len, seq_len]

        # [num_heads, q_len, seq_len] @ [num_heads, seq_len, head_dim]
        attended = torch.matmul(probs, v.transpose(0, 1))  # [num_heads, q_len, head_dim]
        out[q_start:q_end] = attended.transpose(0, 1).to(query.dtype)
        # out rows: [q_len, num_heads, head_dim]
    return out
