"""Ragged paged-attention batches for the kernel tests (Triton, native CPU)."""

import torch

from sluice.kernels import write_kv


def paged_batch(batch, block_size, num_heads, num_kv_heads, head_dim, dtype=torch.float32, seed=0,
                device=torch.device("cpu")):
    """A ragged step over a paged cache whose contexts are already written.

    Contexts live in shuffled, non-contiguous blocks; every slot not holding a
    context token is NaN, so a kernel that reads outside the context fails.
    Block-table rows are padded with 0 as the runner does.
    """
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [(seq_len + block_size - 1) // block_size for seq_len, _ in batch]
    num_blocks = sum(blocks_per_seq) + 3
    max_blocks = max(blocks_per_seq) + 1
    key_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    value_cache = key_cache.clone()
    perm = torch.randperm(num_blocks, generator=g)
    block_tables = torch.zeros(len(batch), max_blocks, dtype=torch.int32)
    slots, next_block = [], 0
    for i, (seq_len, _) in enumerate(batch):
        ids = perm[next_block : next_block + blocks_per_seq[i]]
        next_block += blocks_per_seq[i]
        block_tables[i, : len(ids)] = ids.to(torch.int32)
        slots.append(torch.stack([ids[p // block_size] * block_size + p % block_size
                                  for p in range(seq_len)]))
    total_ctx = sum(seq_len for seq_len, _ in batch)
    key = torch.randn(total_ctx, num_kv_heads, head_dim, generator=g)
    value = torch.randn(total_ctx, num_kv_heads, head_dim, generator=g)
    write_kv(key, value, key_cache, value_cache, torch.cat(slots))

    q_lens = [q_len for _, q_len in batch]
    query = torch.randn(sum(q_lens), num_heads, head_dim, generator=g)
    query_start_loc = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor([seq_len for seq_len, _ in batch], dtype=torch.int32)
    to = dict(device=device)
    return dict(
        query=query.to(dtype=dtype, **to),
        key_cache=key_cache.to(dtype=dtype, **to),
        value_cache=value_cache.to(dtype=dtype, **to),
        block_tables=block_tables.to(**to),
        seq_lens=seq_lens.to(**to),
        query_start_loc=query_start_loc.to(**to),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_len for seq_len, _ in batch),
    )
