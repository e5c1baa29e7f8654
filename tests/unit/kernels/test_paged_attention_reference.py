"""The torch paged-attention reference against plain dense causal attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sluice.kernels import paged_attention, write_kv

HEAD_DIM = 16

# (seq_len, q_len): decode of a 1-token context, decode mid-block, full prefill,
# a prefill chunk that starts mid-context and crosses blocks, decode at a block edge.
RAGGED_BATCH = [(1, 1), (37, 1), (50, 50), (70, 13), (32, 1), (33, 1)]


def dense_causal_attention(q, k, v, scale):
    """q [q_len, H, D] for the last q_len of seq_len positions; k, v [seq_len, KVH, D]."""
    q_len, num_heads, _ = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)  # [seq_len, H, D]
    v = v.repeat_interleave(group, dim=1)
    q_pos = torch.arange(seq_len - q_len, seq_len)[:, None]  # [q_len, 1]
    mask = torch.arange(seq_len)[None, :] <= q_pos  # [q_len, seq_len]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )  # [H, q_len, D]
    return out.transpose(0, 1)


def build_paged_batch(batch, block_size, num_heads, num_kv_heads, seed=0):
    """Random contexts scattered over shuffled cache blocks; returns inputs + per-seq data."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [(seq_len + block_size - 1) // block_size for seq_len, _ in batch]
    num_blocks = sum(blocks_per_seq) + 3  # a few unused blocks
    key_cache = torch.zeros(num_blocks, block_size, num_kv_heads, HEAD_DIM)
    value_cache = torch.zeros_like(key_cache)
    block_ids = torch.randperm(num_blocks, generator=g)  # non-contiguous, out of order
    max_blocks = max(blocks_per_seq) + 1  # padded rows
    block_tables = torch.zeros(len(batch), max_blocks, dtype=torch.int32)

    queries, contexts, next_block = [], [], 0
    for i, (seq_len, q_len) in enumerate(batch):
        table = block_ids[next_block : next_block + blocks_per_seq[i]]
        next_block += blocks_per_seq[i]
        block_tables[i, : len(table)] = table.int()
        k = torch.randn(seq_len, num_kv_heads, HEAD_DIM, generator=g)
        v = torch.randn(seq_len, num_kv_heads, HEAD_DIM, generator=g)
        pos = torch.arange(seq_len)
        slots = table[pos // block_size] * block_size + pos % block_size
        write_kv(k, v, key_cache, value_cache, slots)
        queries.append(torch.randn(q_len, num_heads, HEAD_DIM, generator=g))
        contexts.append((k, v))

    q_lens = torch.tensor([q for _, q in batch])
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).int()
    seq_lens = torch.tensor([s for s, _ in batch], dtype=torch.int32)
    return (torch.cat(queries), key_cache, value_cache, block_tables, seq_lens, query_start_loc,
            queries, contexts)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (8, 2), (4, 1)])
def test_matches_dense_causal_attention(block_size, num_heads, num_kv_heads):
    query, kc, vc, tables, seq_lens, qsl, queries, contexts = build_paged_batch(
        RAGGED_BATCH, block_size, num_heads, num_kv_heads
    )
    scale = HEAD_DIM**-0.5
    out = paged_attention(query, kc, vc, tables, seq_lens, qsl, scale)
    assert out.shape == query.shape
    starts = qsl.tolist()
    for i, (q, (k, v)) in enumerate(zip(queries, contexts)):
        expected = dense_causal_attention(q, k, v, scale)
        # fp32 on both sides, different summation order: agreement to ~1e-6.
        torch.testing.assert_close(out[starts[i] : starts[i + 1]], expected, atol=1e-5, rtol=1e-5)


def test_query_padding_rows_are_zero_and_dtype_kept():
    query, kc, vc, tables, seq_lens, qsl, *_ = build_paged_batch([(20, 3)], 16, 4, 2)
    padded = torch.cat([query, torch.randn(2, 4, HEAD_DIM)]).to(torch.bfloat16)
    out = paged_attention(padded, kc.bfloat16(), vc.bfloat16(), tables, seq_lens, qsl, 0.25)
    assert out.dtype == torch.bfloat16
    assert torch.all(out[3:] == 0)


def test_decode_sees_only_its_own_blocks():
    """Changing another sequence's cache blocks must not change this sequence's output."""
    query, kc, vc, tables, seq_lens, qsl, *_ = build_paged_batch([(40, 1), (25, 1)], 16, 4, 2)
    before = paged_attention(query, kc, vc, tables, seq_lens, qsl, 0.25)
    other_blocks = tables[1, :2].long()
    kc[other_blocks] += 5.0
    after = paged_attention(query, kc, vc, tables, seq_lens, qsl, 0.25)
    torch.testing.assert_close(after[0], before[0], atol=0, rtol=0)
    assert not torch.allclose(after[1], before[1])


def test_write_kv_places_tokens_in_slots_and_skips_padding():
    num_blocks, block_size, kv_heads = 4, 16, 2
    key_cache = torch.zeros(num_blocks, block_size, kv_heads, HEAD_DIM)
    value_cache = torch.zeros_like(key_cache)
    key = torch.randn(5, kv_heads, HEAD_DIM)
    value = torch.randn(5, kv_heads, HEAD_DIM)
    # block 2 offset 0, block 2 offset 15, padding, block 0 offset 3, block 3 offset 7
    slots = torch.tensor([32, 47, -1, 3, 55], dtype=torch.int64)
    write_kv(key, value, key_cache, value_cache, slots)

    expected_at = {(2, 0): 0, (2, 15): 1, (0, 3): 3, (3, 7): 4}
    for (block, offset), token in expected_at.items():
        torch.testing.assert_close(key_cache[block, offset], key[token], atol=0, rtol=0)
        torch.testing.assert_close(value_cache[block, offset], value[token], atol=0, rtol=0)
    written = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    for block, offset in expected_at:
        written[block, offset] = True
    # Nothing else was touched: the padding token wrote nowhere.
    assert torch.all(key_cache[~written] == 0) and torch.all(value_cache[~written] == 0)
