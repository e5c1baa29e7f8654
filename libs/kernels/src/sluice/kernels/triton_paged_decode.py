"""Triton paged decode attention: one query token per sequence.

Computes the same thing as ``paged_attention_reference.paged_attention`` for
a batch where every sequence has ``q_len == 1`` (the query row of sequence i
is ``query[i]``, at position ``seq_lens[i] - 1``, so no causal mask is needed:
it sees its whole context).

Work split: one program per (sequence, KV head[, KV split]). The program
loads the ``group = num_heads // num_kv_heads`` query heads that share that
KV head as the rows of one tile ``q: [GROUP_PAD, D]`` and streams the
sequence's keys/values through the block table in tiles of ``BLOCK_N``
tokens, so each K/V byte is read from HBM once per step, not once per query
head (decode is bandwidth-bound, and with GQA that is an ``group``-fold
saving over a per-query-head grid). ``GROUP_PAD`` is padded up to 16 so the
two products are ``tl.dot`` tensor-core ops; padded rows are zero queries
that are never stored.

Online softmax in float32 (base 2: ``scale * log2(e)`` is folded into the
scores): running max ``m``, running denominator ``l`` and an unnormalised
fp32 accumulator, rescaled by ``exp2(m_old - m_new)`` per tile.

When ``num_seqs * num_kv_heads`` is too small to fill the GPU (small batch,
long context) the context is cut into ``num_splits`` contiguous ranges
(flash-decoding): each program writes a normalised partial output plus its
``(m, l)`` and a second small kernel merges them. With one split the first
kernel writes ``out`` directly.

Triton is imported at module import; import this module lazily (the CPU
path must not need triton).
"""

from __future__ import annotations

import math

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

LOG2E = 1.4426950408889634


@triton.jit
def _dot(a, b, DOT_F32: tl.constexpr):
    """a @ b with fp32 accumulation.

    DOT_F32: multiply in exact fp32 ("ieee", not tf32) -- used for fp32
    inputs, and for bf16 under TRITON_INTERPRET, whose bf16 ``tl.dot`` is
    broken in triton 3.7 (the upcast is exact: bf16 products fit in fp32).
    """
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _paged_decode_kernel(
    q_ptr,  # [num_seqs, num_heads, HEAD_DIM]
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, num_kv_heads, HEAD_DIM]
    v_cache_ptr,  # same layout and strides as k_cache
    block_tables_ptr,  # [num_seqs, max_blocks_per_seq]
    seq_lens_ptr,  # [num_seqs]
    out_ptr,  # [num_seqs, num_heads, HEAD_DIM] (written when not USE_SPLITS)
    part_out_ptr,  # [num_seqs, num_heads, num_splits, HEAD_DIM] fp32 (USE_SPLITS)
    part_ml_ptr,  # [num_seqs, num_heads, num_splits, 2] fp32: (m, l) (USE_SPLITS)
    scale_log2,  # softmax scale * log2(e)
    tokens_per_split,  # context tokens per split, a multiple of BLOCK_N
    num_splits,
    stride_qs,
    stride_qh,
    stride_os,
    stride_oh,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_bt,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_SPLITS: tl.constexpr,
    DOT_F32: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    rows = tl.arange(0, GROUP_PAD)  # query head within the KV group
    row_ok = rows < GROUP
    heads = kv_head * GROUP + rows  # [GROUP_PAD]
    dims = tl.arange(0, HEAD_DIM)

    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )  # [GROUP_PAD, HEAD_DIM]

    start = split * tokens_per_split
    end = tl.minimum(seq_len, start + tokens_per_split)

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)

    block_row = block_tables_ptr + seq * stride_bt
    head_off = kv_head * stride_ch
    for tile_start in range(start, end, BLOCK_N):
        pos = tile_start + tl.arange(0, BLOCK_N)  # [BLOCK_N] context positions
        pos_ok = pos < end
        block_id = tl.load(block_row + pos // BLOCK_SIZE, mask=pos_ok, other=0).to(tl.int64)
        tok_off = block_id * stride_cb + (pos % BLOCK_SIZE) * stride_ct + head_off  # [BLOCK_N]
        kv_off = tok_off[:, None] + dims[None, :]  # [BLOCK_N, HEAD_DIM]

        k = tl.load(k_cache_ptr + kv_off, mask=pos_ok[:, None], other=0.0)
        s = _dot(q, tl.trans(k), DOT_F32) * scale_log2
        s = tl.where(pos_ok[None, :], s, float("-inf"))  # [GROUP_PAD, BLOCK_N]

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row with nothing seen yet keeps m = -inf; subtract 0 there so no
        # (-inf) - (-inf) = nan appears (every real tile has >= 1 valid key).
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_sub)
        p = tl.exp2(s - m_sub[:, None])  # [GROUP_PAD, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)

        v = tl.load(v_cache_ptr + kv_off, mask=pos_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_F32)
        m_i = m_new

    l_div = tl.where(l_i == 0.0, 1.0, l_i)  # empty context / empty split -> zeros
    o = acc / l_div[:, None]  # [GROUP_PAD, HEAD_DIM]
    if USE_SPLITS:
        part_row = (seq * (GROUP * tl.num_programs(1)) + heads) * num_splits + split
        tl.store(
            part_out_ptr + part_row[:, None] * HEAD_DIM + dims[None, :],
            o,
            mask=row_ok[:, None],
        )
        tl.store(part_ml_ptr + part_row * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + part_row * 2 + 1, l_i, mask=row_ok)
    else:
        tl.store(
            out_ptr + seq * stride_os + heads[:, None] * stride_oh + dims[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )


@triton.jit
def _merge_splits_kernel(
    part_out_ptr,  # [num_seqs, num_heads, num_splits, HEAD_DIM] fp32
    part_ml_ptr,  # [num_seqs, num_heads, num_splits, 2] fp32
    out_ptr,  # [num_seqs, num_heads, HEAD_DIM]
    num_splits,
    stride_os,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    split_ok = splits < num_splits
    dims = tl.arange(0, HEAD_DIM)
    base = (seq * tl.num_programs(1) + head) * num_splits

    m = tl.load(part_ml_ptr + (base + splits) * 2, mask=split_ok, other=float("-inf"))
    l = tl.load(part_ml_ptr + (base + splits) * 2 + 1, mask=split_ok, other=0.0)
    m_max = tl.max(m, axis=0)
    m_sub = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_sub) * l  # [SPLITS_PAD]; empty splits weigh 0
    o = tl.load(
        part_out_ptr + (base + splits)[:, None] * HEAD_DIM + dims[None, :],
        mask=split_ok[:, None],
        other=0.0,
    )  # [SPLITS_PAD, HEAD_DIM]
    w_sum = tl.sum(w, axis=0)
    w_sum = tl.where(w_sum == 0.0, 1.0, w_sum)
    merged = tl.sum(o * w[:, None], axis=0) / w_sum  # [HEAD_DIM]
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + dims,
        merged.to(out_ptr.dtype.element_ty),
    )


def _auto_num_splits(
    device: torch.device, num_programs: int, max_seq_len: int | None, seq_lens: torch.Tensor
) -> int:
    """Split the context only when (seq, kv_head) programs cannot fill the GPU."""
    if device.type != "cuda":
        return 1
    sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    if num_programs >= sm_count:
        return 1
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())  # host sync; pass max_seq_len to avoid it
    # Aim for ~2 waves, but keep >= 256 context tokens per split.
    want = math.ceil(2 * sm_count / max(num_programs, 1))
    return max(1, min(want, math.ceil(max_seq_len / 256), 64))


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Decode attention over a paged KV cache, one query token per sequence.

    query: [num_seqs, num_heads, head_dim] (row i is sequence i's newest token)
    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: [num_seqs, max_blocks_per_seq] int32
    seq_lens: [num_seqs] int32, context length including this token (0 -> zeros)
    out: optional [num_seqs, num_heads, head_dim] in query.dtype
    max_seq_len: host-side max of seq_lens; only used to size KV splits
    num_splits: KV splits per sequence (None: 1 unless the grid is too small)
    block_n, num_warps, num_stages: tuning (context tokens per KV tile, launch config)
    returns out
    """
    check_query(query)
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, cache_head_dim = check_paged_cache(
        key_cache, value_cache, query.dtype
    )
    assert cache_head_dim == head_dim, (key_cache.shape, query.shape)
    assert num_heads % num_kv_heads == 0, (num_heads, num_kv_heads)
    device = query.device
    assert key_cache.device == device, (key_cache.device, device)
    check_int_vector(seq_lens, num_seqs, "seq_lens", device)
    check_block_tables(block_tables, num_seqs, device)
    assert block_n >= 16 and block_n & (block_n - 1) == 0, block_n
    if out is None:
        out = torch.empty_like(query)
    else:
        check_query(out, "out")
        assert out.shape == query.shape and out.dtype == query.dtype, (out.shape, out.dtype)
        assert out.device == device
    if num_seqs == 0:
        return out

    group = num_heads // num_kv_heads
    group_pad = max(16, next_power_of_2(group))  # tl.dot needs M >= 16
    if num_splits is None:
        num_splits = _auto_num_splits(device, num_seqs * num_kv_heads, max_seq_len, seq_lens)
    assert num_splits >= 1, num_splits
    if num_splits > 1:
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max().item())
        per_split = math.ceil(max(max_seq_len, 1) / num_splits)
        tokens_per_split = math.ceil(per_split / block_n) * block_n
        num_splits = math.ceil(max(max_seq_len, 1) / tokens_per_split)
    if num_splits == 1:
        tokens_per_split = 1 << 30  # whole context in one program
    use_splits = num_splits > 1

    if use_splits:
        part_out = torch.empty(
            (num_seqs, num_heads, num_splits, head_dim), dtype=torch.float32, device=device
        )
        part_ml = torch.empty(
            (num_seqs, num_heads, num_splits, 2), dtype=torch.float32, device=device
        )
    else:
        part_out = part_ml = out  # unused placeholders

    dot_f32 = use_fp32_dot(query.dtype, device)
    grid = (num_seqs, num_kv_heads, num_splits)
    _paged_decode_kernel[grid](
        query,
        key_cache,
        value_cache,
        block_tables,
        seq_lens,
        out,
        part_out,
        part_ml,
        scale * LOG2E,
        tokens_per_split,
        num_splits,
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
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        USE_SPLITS=use_splits,
        DOT_F32=dot_f32,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if use_splits:
        _merge_splits_kernel[(num_seqs, num_heads)](
            part_out,
            part_ml,
            out,
            num_splits,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            SPLITS_PAD=max(2, next_power_of_2(num_splits)),
            num_warps=4,
        )
    return out
