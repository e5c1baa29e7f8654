"""Paged attention for the CPU path of a replica: torch only, vectorised.

The reference (`paged_attention_reference`) loops over sequences and
repeats K/V per query head: clear, and slow. Decode rows dominate a
serving step (one query token for each of many running sequences), so here
they are batched into one gather and two batched matmuls:

    block_tables [S, nb] --index--> K [S, nb*block_size, kv_heads, head_dim]
    q [S, kv_heads, group, head_dim] @ K^T -> scores [S, kv_heads, group, L]
    mask positions >= seq_len, softmax, @ V -> [S, heads, head_dim]

GQA needs no repeat: the query heads of one KV head form the `group` axis.
Prefill chunks (few per step, many tokens each) go one sequence at a time
through torch's fused scaled_dot_product_attention with a causal mask
offset by the tokens already cached.
"""

import torch
import torch.nn.functional as F


def _gather(cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """[num_seqs, num_blocks*block_size, kv_heads, head_dim] for the first
    `num_blocks` blocks of every row of `block_tables`."""
    num_seqs = block_tables.shape[0]
    _, block_size, kv_heads, head_dim = cache.shape
    blocks = cache[block_tables[:, :num_blocks].long()]  # [S, nb, block_size, kv_heads, head_dim]
    return blocks.view(num_seqs, num_blocks * block_size, kv_heads, head_dim)


def _decode(
    query: torch.Tensor,  # [S, heads, head_dim]
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [S, max_blocks]
    seq_lens: torch.Tensor,  # [S]
    max_seq_len: int,
    scale: float,
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = query.shape
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // kv_heads
    num_blocks = -(-max_seq_len // block_size)
    keys = _gather(key_cache, block_tables, num_blocks)  # [S, L, kv_heads, head_dim]
    values = _gather(value_cache, block_tables, num_blocks)  # [S, L, kv_heads, head_dim]
    q = query.view(num_seqs, kv_heads, group, head_dim).float()  # [S, kv_heads, group, head_dim]
    scores = torch.matmul(q, keys.permute(0, 2, 3, 1).float()) * scale  # [S, kv_heads, group, L]
    positions = torch.arange(keys.shape[1], device=query.device)  # [L]
    beyond = positions[None, :] >= seq_lens[:, None]  # [S, L]
    scores.masked_fill_(beyond[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # [S, kv_heads, group, L]
    out = torch.matmul(probs, values.permute(0, 2, 1, 3).float())  # [S, kv_heads, group, head_dim]
    return out.view(num_seqs, num_heads, head_dim).to(query.dtype)


def _prefill_one(
    query: torch.Tensor,  # [q_len, heads, head_dim]
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,  # [max_blocks]
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    q_len, num_heads, head_dim = query.shape
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    num_blocks = -(-seq_len // block_size)
    keys = _gather(key_cache, block_table[None], num_blocks)[0, :seq_len]  # [seq_len, kv_heads, head_dim]
    values = _gather(value_cache, block_table[None], num_blocks)[0, :seq_len]
    q = query.transpose(0, 1)[None]  # [1, heads, q_len, head_dim]
    k = keys.transpose(0, 1)[None]  # [1, kv_heads, seq_len, head_dim]
    v = values.transpose(0, 1)[None]
    cached = seq_len - q_len
    if cached == 0:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        # Query i sits at position cached + i and sees keys 0..cached + i.
        allowed = torch.ones(q_len, seq_len, dtype=torch.bool, device=query.device).tril(diagonal=cached)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)  # [q_len, heads, head_dim]


def paged_attention_cpu(
    query: torch.Tensor,  # [num_tokens, heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] context incl. this step
    query_start_loc: torch.Tensor,  # [num_seqs + 1]
    scale: float,
) -> torch.Tensor:
    """Same contract as `paged_attention_reference.paged_attention`."""
    assert query.dim() == 3 and key_cache.dim() == 4 and key_cache.shape == value_cache.shape
    assert query.shape[1] % key_cache.shape[2] == 0, "query heads must be a multiple of KV heads"
    starts = query_start_loc.tolist()  # on CPU these syncs are free
    lens = seq_lens.tolist()
    q_lens = [b - a for a, b in zip(starts, starts[1:])]
    out = torch.zeros_like(query)
    decode = [i for i, n in enumerate(q_lens) if n == 1]
    if decode:
        rows = torch.tensor([starts[i] for i in decode], device=query.device)
        index = torch.tensor(decode, device=query.device)
        out[rows] = _decode(
            query[rows], key_cache, value_cache, block_tables[index], seq_lens[index].long(),
            max(lens[i] for i in decode), scale,
        )
    for i, q_len in enumerate(q_lens):
        if q_len > 1:
            out[starts[i] : starts[i + 1]] = _prefill_one(
                query[starts[i] : starts[i + 1]], key_cache, value_cache, block_tables[i], lens[i], scale
            )
    return out
