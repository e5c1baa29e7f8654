"""Triton chunked-prefill attention over a paged KV cache (ragged, mixed batches).

Computes exactly ``paged_attention_reference.paged_attention``: the queries of
sequence i are the last ``q_len_i = query_start_loc[i+1] - query_start_loc[i]``
positions of its ``seq_lens[i]``-token context, whose keys/values (including
this chunk's, written by ``write_kv`` first) are all in the paged cache. The
earlier part of the context may come from previous chunks or a prefix-cache
hit. Masking is causal by position. A decode row is simply ``q_len = 1``, so
one launch serves a mixed prefill + decode batch.

Work split: one program per (sequence, KV head, query tile). A query tile is
``BLOCK_Q`` consecutive query tokens times the ``group`` query heads that
share the KV head, flattened into ``BLOCK_Q * GROUP_PAD`` rows
(row r = token ``r // GROUP_PAD``, head ``r % GROUP_PAD``), so every K/V tile
loaded from the cache serves all heads of the group (GQA) with one
``tl.dot``. The KV loop walks context positions ``0 .. last query pos of the
tile`` in tiles of ``BLOCK_N`` tokens, looking up each token's physical block
in the block table (``BLOCK_N`` is independent of the page size, so pages of
16 or 32 tokens are gathered the same way). Online softmax in fp32, base 2.

Programs whose query tile is past the sequence's ``q_len`` (the grid is sized
by ``max_query_len``) run an empty loop and store nothing.

Triton is imported at module import; import this module lazily.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sluice.kernels._checks import (
    check_block_tables,
    check_int_vector,
    check_paged_cache,
    check_query,
    next_power_of_2,
    use_fp32_dot,
)
from sluice.kernels.triton_paged_decode import LOG2E, _dot


@triton.jit
def _paged_prefill_kernel(
    q_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # same layout and strides as k_cache
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    seq_lens_ptr,  # [num_seqs]
    query_start_loc_ptr,  # [num_seqs + 1]
    out_ptr,  # [num_tokens, num_heads, HEAD_DIM]
    scale_log2,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_bt,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,  # BLOCK_Q * GROUP_PAD rows
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    q_tile = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + seq).to(tl.int32)
    q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_start
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    context_len = seq_len - q_len  # tokens cached before this chunk

    rows = tl.arange(0, BLOCK_M)
    tok = q_tile * BLOCK_Q + rows // GROUP_PAD  # query index within the chunk
    head_in_group = rows % GROUP_PAD
    row_ok = (head_in_group < GROUP) & (tok < q_len)  # [BLOCK_M]
    heads = kv_head * GROUP + head_in_group
    q_pos = context_len + tok  # context position of each row's query
    dims = tl.arange(0, HEAD_DIM)

    q_row_off = (q_start + tok).to(tl.int64) * stride_qt + heads * stride_qh  # [BLOCK_M]
    q = tl.load(q_ptr + q_row_off[:, None] + dims[None, :], mask=row_ok[:, None], other=0.0)

    # Keys needed by this tile: up to its last real query position (causal).
    last_tok = tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_len)  # exclusive
    kv_end = tl.where(q_tile * BLOCK_Q < q_len, context_len + last_tok, 0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    block_row = block_tables_ptr + seq * stride_bt
    head_off = kv_head * stride_ch
    for tile_start in range(0, kv_end, BLOCK_N):
        pos = tile_start + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
        pos_ok = pos < kv_end
        block_id = tl.load(block_row + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
        tok_off = block_id * stride_cb + (pos % BLOCK_SIZE) * stride_ct + head_off
        kv_off = tok_off[:, None] + dims[None, :]  # [BLOCK_N, HEAD_DIM]

        k = tl.load(k_cache_ptr + kv_off, mask=pos_ok[:, None], other=0.0)
        s = _dot(q, tl.trans(k), DOT_F32) * scale_log2  # [BLOCK_M, BLOCK_N]
        allowed = pos_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        s = tl.where(allowed, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # no (-inf)-(-inf)
        alpha = tl.exp2(m_i - m_sub)
        p = tl.exp2(s - m_sub[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v = tl.load(v_cache_ptr + kv_off, mask=pos_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_F32)
        m_i = m_new

    l_div = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_div[:, None]
    o_row_off = (q_start + tok).to(tl.int64) * stride_ot + heads * stride_oh
    tl.store(
        out_ptr + o_row_off[:, None] + dims[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    block_m: int | None = None,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Causal attention of a ragged (chunked-prefill / mixed) batch over a paged cache.

    query: [num_tokens, num_heads, head_dim]
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: [num_seqs, max_blocks_per_seq] int32
    seq_lens: [num_seqs] int32, context length including this step's tokens
    query_start_loc: [num_seqs + 1] int32, cumulative query counts from 0
    max_query_len: host int >= every q_len (sizes the grid; no device sync)
    out: optional [num_tokens, num_heads, head_dim] in query.dtype. Rows of
        padding tokens (past query_start_loc[-1]) are not written: they are
        zero when ``out`` is allocated here, untouched otherwise.
    block_m: rows (query tokens x heads of a KV group) per program
    block_n: context tokens per KV tile
    num_warps, num_stages: the launch's
    block_m and num_stages default to 128 and 3, the winner of
    bench_prefill_kernel_gpu.py's sweep on an H200 (Llama-3-8B heads, bf16:
    1.20x the earlier 64 rows and 2 stages on an 8K chunk after 8K cached,
    334 against 278 TFLOP/s; 1.16x on four 2K prompts); before Ampere (a
    T4's 64 KiB of shared memory holds 64 rows and 2 stages, not 96 KiB) to
    64 and 2.
    returns out
    """
    check_query(query)
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = check_paged_cache(
        key_cache, value_cache, query.dtype
    )
    assert cache_head_dim == head_dim, (key_cache.shape, query.shape)
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    device = query.device
    assert key_cache.device == device, (key_cache.device, device)
    num_seqs = seq_lens.shape[0]
    check_int_vector(seq_lens, num_seqs, "seq_lens", device)
    check_int_vector(query_start_loc, num_seqs + 1, "query_start_loc", device)
    check_block_tables(block_tables, num_seqs, device)
    assert isinstance(max_query_len, int) and max_query_len >= 0, max_query_len
    if block_m is None or num_stages is None:
        small = device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0)
        block_m = (64 if small else 128) if block_m is None else block_m
        num_stages = (2 if small else 3) if num_stages is None else num_stages
    assert block_m >= 16 and block_m & (block_m - 1) == 0, block_m
    assert block_n >= 16 and block_n & (block_n - 1) == 0, block_n
    if out is None:
        out = torch.zeros_like(query)
    else:
        check_query(out, "out")
        assert out.shape == query.shape and out.dtype == query.dtype, (out.shape, out.dtype)
        assert out.device == device
    if num_seqs == 0 or max_query_len == 0 or num_tokens == 0:
        return out

    group = num_heads // num_kv_heads
    group_pad = next_power_of_2(group)
    block_q = max(1, block_m // group_pad)
    # Short queries (decode-heavy batches): do not pad the token tile far past them.
    block_q = min(block_q, max(next_power_of_2(max_query_len), 16 // group_pad, 1))
    assert block_q * group_pad >= 16, (block_q, group_pad)  # tl.dot needs M >= 16

    grid = (num_seqs, num_kv_heads, triton.cdiv(max_query_len, block_q))
    _paged_prefill_kernel[grid](
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        query_start_loc,
        out,
        scale * LOG2E,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        block_tables.stride(0),
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_Q=block_q,
        BLOCK_M=block_q * group_pad,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        DOT_F32=use_fp32_dot(query.dtype, device),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
