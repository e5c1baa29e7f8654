"""The vectorised CPU path computes what the reference computes."""

import pytest
import torch

from sluice.kernels.paged_attention_cpu import paged_attention_cpu
from sluice.kernels.paged_attention_reference import paged_attention, write_kv

# fp32 throughout; the two differ only in summation order (batched matmul
# and fused SDPA vs per-head matmuls), which moves results by ~1e-6.
ATOL = 1e-5


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads,kv_heads", [(8, 4), (4, 4), (8, 1)])
def test_ragged_mixed_batch_matches_reference(block_size, heads, kv_heads):
    torch.manual_seed(block_size + heads + kv_heads)
    head_dim, num_blocks = 32, 64
    # (tokens already cached, tokens this step): decodes, a fresh prefill, a mid-context chunk.
    shapes = [(40, 1), (0, 23), (17, 1), (33, 9), (block_size - 1, 1), (0, 1)]
    key_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim)
    value_cache = torch.zeros_like(key_cache)
    free = list(torch.randperm(num_blocks).tolist())
    tables, slots, seq_lens, q_lens = [], [], [], []
    for cached, new in shapes:
        total = cached + new
        table = [free.pop() for _ in range(-(-total // block_size))]
        tables.append(table)
        # Fill the cached part directly; this step's tokens go through write_kv.
        for pos in range(cached):
            key_cache[table[pos // block_size], pos % block_size] = torch.randn(kv_heads, head_dim)
            value_cache[table[pos // block_size], pos % block_size] = torch.randn(kv_heads, head_dim)
        slots += [table[p // block_size] * block_size + p % block_size for p in range(cached, total)]
        seq_lens.append(total)
        q_lens.append(new)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    num_tokens = sum(q_lens)
    query = torch.randn(num_tokens, heads, head_dim)
    key, value = torch.randn(num_tokens, kv_heads, head_dim), torch.randn(num_tokens, kv_heads, head_dim)
    write_kv(key, value, key_cache, value_cache, torch.tensor(slots))
    query_start_loc = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    args = (query, key_cache, value_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32),
            query_start_loc, head_dim**-0.5)
    torch.testing.assert_close(paged_attention_cpu(*args), paged_attention(*args), atol=ATOL, rtol=0)
