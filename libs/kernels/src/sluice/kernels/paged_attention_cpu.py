"""Paged attention for the CPU path of a replica.

The reference (`paged_attention_reference`) loops over sequences and
repeats K/V per query head: clear, and slow. Decode rows dominate a
serving step (one query token for each of many running sequences). Where
this install has the native kernel (`paged_attention_native`, C, float32)
they go there in one call that reads every block in place; otherwise, and
for other dtypes, they are batched here into one gather and one fused
attention call.

Every function takes the cache in its logical shape
``[num_blocks, block_size, kv_heads, head_dim]`` (the contract of the
reference and the Triton kernels) and accepts three physical layouts behind
that shape:

    block-major (contiguous):  storage [num_blocks, block_size, kv_heads, head_dim]
    head-major:                storage [kv_heads, num_blocks, block_size, head_dim]
                               logical view = storage.permute(1, 2, 0, 3)
    transposed keys (keys only, with head-major values):
                               storage [kv_heads, num_blocks, head_dim, block_size]
                               logical view = storage.permute(1, 3, 0, 2)
    block-interleaved (the CPU default where the native kernel is built;
    sluice.model.kv_cache.KVLayout.BLOCK_INTERLEAVED): one storage
    [num_blocks, 2, kv_heads, head_dim * block_size], a block's transposed
    keys then its values; the torch path reads it as it reads any strides
    (a gather through the logical view, writes by (block, slot) index).

The native kernel reads any of these in place (transposed keys make a
block's scores block_size-wide vector FMAs; block-interleaved puts a
block's heads in one run). Head-major is what the torch path wants: one
flat `index_select` over ``head * num_blocks + block`` ids gathers every
sequence's context as ``[kv_heads, S, L, head_dim]`` with a contiguous
``[L, head_dim]`` inner layout, which SDPA reads ~2x faster than the strided
view a block-major gather gives. The torch decode then runs as one SDPA call
with the KV heads as batch and each KV head's query group as the query axis,
so GQA needs no repeat:

    ids [kv_heads * S * nb] --index_select--> K, V [kv_heads, S, L, head_dim]
    q [kv_heads, S, group, head_dim], mask [1, S, 1, L]: position < seq_len
    SDPA -> [kv_heads, S, group, head_dim] -> [S, heads, head_dim]

`index_select` with a flat id list is ~20x faster on CPU than advanced
indexing with a 2-D index. Prefill chunks go to the native kernel too: it reads
their blocks in place as it does a decode's, where a gather and an SDPA
call per sequence cost more than the attention (a 2,048-token step of 16
prompts of 128: 1.9 against 5.0 ms a layer on two threads of a Zen 4).
Where the kernel tiles them (`paged_attention_native.tiles_chunks`: the
CPU default cache) at any context: one thread of a Zen 5, one prompt of
2,048 tokens 15.6 against SDPA's 36.3 ms a layer, 512 on a cached 1,536
6.7 against 17.7, 256 on 3,840 8.4 against 17.4. Elsewhere only up to
NATIVE_PREFILL_MAX_CONTEXT tokens of context; longer ones go one sequence
at a time through SDPA with a causal mask offset by the tokens already
cached, which over thousands of keys beats the kernel's per-query loop
(one prompt of 2,048: 23 against 26 ms on a Zen 4).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sluice.kernels import paged_attention_native as native
from sluice.kernels.paged_attention_native import paged_attention_native

# Decode sequences up to this many blocks always share one gather (see _length_groups).
MIN_GROUP_BLOCKS = 8
# Where the native kernel does not tile chunks (native.tiles_chunks), prefill
# chunks whose context (cached tokens and the chunk) is at most this long go
# to it; longer ones to SDPA (see the module docstring: 512 tokens the
# kernel's row-at-a-time loop wins, 2,048 SDPA, either with a cached prefix).
NATIVE_PREFILL_MAX_CONTEXT = 1024


def head_major_storage(cache: torch.Tensor) -> torch.Tensor | None:
    """The contiguous ``[kv_heads, num_blocks, block_size, head_dim]`` storage
    behind a logical cache view, or None when the cache is not head-major."""
    storage = cache.permute(2, 0, 1, 3)  # [kv_heads, num_blocks, block_size, head_dim]
    return storage if storage.is_contiguous() else None


def transposed_storage(cache: torch.Tensor) -> torch.Tensor | None:
    """The contiguous ``[kv_heads, num_blocks, head_dim, block_size]`` storage
    behind a logical cache view, or None when the cache is not stored so.
    (With one slot per block or a head_dim of 1 the layouts coincide; the
    head-major reading is tried first.)"""
    storage = cache.permute(2, 0, 3, 1)  # [kv_heads, num_blocks, head_dim, block_size]
    return storage if storage.is_contiguous() else None


def write_kv_cpu(
    key: torch.Tensor,  # [num_tokens, kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, kv_heads, head_dim]
    key_cache: torch.Tensor,  # logical [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = padding
) -> None:
    """`write_kv` for any of the physical layouts (same contract as the reference)."""
    num_blocks, block_size, kv_heads, head_dim = key_cache.shape
    assert value_cache.shape == key_cache.shape and key.shape == value.shape
    assert key.shape[1:] == (kv_heads, head_dim), (key.shape, key_cache.shape)
    if _use_native(key, key_cache, value_cache):
        native.write_kv_native(key, value, key_cache, value_cache, slot_mapping)
        return
    if bool((slot_mapping < 0).any()):  # padding rows: rare, and a free check on CPU
        valid = slot_mapping >= 0
        key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    for cache, new in ((key_cache, key), (value_cache, value)):
        storage = head_major_storage(cache)
        transposed = transposed_storage(cache) if storage is None else None
        if storage is not None:
            flat = storage.view(kv_heads, num_blocks * block_size, head_dim)  # [kv_heads, slots, head_dim]
            flat.index_copy_(1, slot_mapping, new.transpose(0, 1).to(cache.dtype))
        elif transposed is not None:
            # [kv_heads, blocks, head_dim, slot]: indexed by (block, slot) pairs -> [T, kv_heads, head_dim]
            transposed[:, slot_mapping // block_size, :, slot_mapping % block_size] = new.to(cache.dtype)
        elif cache.is_contiguous():
            flat = cache.view(num_blocks * block_size, kv_heads, head_dim)  # [slots, kv_heads, head_dim]
            flat.index_copy_(0, slot_mapping, new.to(cache.dtype))
        else:  # any other strides (keys and values interleaved per block): through the logical view
            cache[slot_mapping // block_size, slot_mapping % block_size] = new.to(cache.dtype)


def _gather(cache: torch.Tensor, block_tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """[kv_heads, S, num_blocks*block_size, head_dim]: the first `num_blocks`
    blocks of every row of `block_tables` (contiguous inner [L, head_dim]
    for a head-major cache, a strided view of one gather for block-major)."""
    _, block_size, kv_heads, head_dim = cache.shape
    num_seqs = block_tables.shape[0]
    blocks = block_tables[:, :num_blocks].reshape(-1).long()  # [S * nb]
    storage = head_major_storage(cache)
    transposed = storage is None
    if transposed:
        storage = transposed_storage(cache)
    if storage is None:  # block-major, or any other strides (the gather copies into block-major rows)
        rows = cache.index_select(0, blocks)  # [S * nb, block_size, kv_heads, head_dim]
        return rows.view(num_seqs, num_blocks * block_size, kv_heads, head_dim).permute(2, 0, 1, 3)
    # storage: [kv_heads, total_blocks, block_size, head_dim], or [..., head_dim, block_size] transposed
    total_blocks = storage.shape[1]
    head_base = torch.arange(kv_heads, dtype=torch.long)[:, None] * total_blocks  # [kv_heads, 1]
    flat_ids = (head_base + blocks[None, :]).reshape(-1)  # [kv_heads * S * nb]
    rows = storage.view(kv_heads * total_blocks, *storage.shape[2:]).index_select(0, flat_ids)
    if transposed:
        rows = rows.transpose(1, 2)  # -> [kv_heads * S * nb, block_size, head_dim]; the reshape copies
    return rows.reshape(kv_heads, num_seqs, num_blocks * block_size, head_dim)


def _decode(
    query: torch.Tensor,  # [S, heads, head_dim]
    key_cache: torch.Tensor,  # logical [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [S, max_blocks]
    seq_lens: torch.Tensor,  # [S]
    max_seq_len: int,
    scale: float,
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, kv_heads, _ = key_cache.shape
    group = num_heads // kv_heads
    num_blocks = -(-max_seq_len // block_size)
    keys = _gather(key_cache, block_tables, num_blocks)  # [kv_heads, S, L, head_dim]
    values = _gather(value_cache, block_tables, num_blocks)  # [kv_heads, S, L, head_dim]
    q = query.reshape(num_seqs, kv_heads, group, head_dim).transpose(0, 1)  # [kv_heads, S, group, head_dim]
    positions = torch.arange(keys.shape[2])  # [L]
    visible = (positions[None, :] < seq_lens[:, None])[None, :, None, :]  # [1, S, 1, L]
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=scale)
    # out: [kv_heads, S, group, head_dim]
    return out.transpose(0, 1).reshape(num_seqs, num_heads, head_dim)


def _prefill_one(
    query: torch.Tensor,  # [q_len, heads, head_dim]
    key_cache: torch.Tensor,  # logical [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_table: torch.Tensor,  # [max_blocks]
    seq_len: int,
    scale: float,
) -> torch.Tensor:
    q_len = query.shape[0]
    block_size = key_cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    k = _gather(key_cache, block_table[None], num_blocks)[:, :, :seq_len].transpose(0, 1)
    v = _gather(value_cache, block_table[None], num_blocks)[:, :, :seq_len].transpose(0, 1)
    # k, v: [1, kv_heads, seq_len, head_dim]
    q = query.transpose(0, 1)[None]  # [1, heads, q_len, head_dim]
    cached = seq_len - q_len
    if cached == 0:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        # Query i sits at position cached + i and sees keys 0..cached + i.
        allowed = torch.ones(q_len, seq_len, dtype=torch.bool).tril(diagonal=cached)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)  # [q_len, heads, head_dim]


def _use_native(rows: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """The C kernels serve float32 rows (queries, or K/V to write) when this install has them."""
    return native.available() and rows.dtype == torch.float32 and native.supports_layout(key_cache, value_cache)


def _length_groups(decode: list[int], lens: list[int], block_size: int) -> list[list[int]]:
    """Split decode sequences into groups gathered together.

    A batched decode pads every sequence to the longest one, so one 4,000-token
    sequence among short ones would make the gather and SDPA read ~4,000
    positions for each of them. Sorted by length, a group closes when the next
    sequence needs more than twice the blocks of the group's shortest (with a
    floor of MIN_GROUP_BLOCKS, so short sequences stay in one call): padding
    at most doubles the work, and similar lengths (the common case) stay one call.
    """
    if not decode:
        return []
    blocks = {i: -(-lens[i] // block_size) for i in decode}
    ordered = sorted(decode, key=blocks.__getitem__)
    groups, first = [[ordered[0]]], blocks[ordered[0]]
    for i in ordered[1:]:
        if blocks[i] > 2 * max(first, MIN_GROUP_BLOCKS):
            groups.append([])
            first = blocks[i]
        groups[-1].append(i)
    return groups


@dataclass(frozen=True, slots=True)
class StepRows:
    """How a step's sequences split between the kernels: the same for every
    layer of the step, so a caller that keeps it (the model's CPU backend,
    on the step's AttentionMetadata) derives it once a step instead of once
    a layer (~40 us of Python a layer for 64 decodes)."""

    starts: list[int]  # query_start_loc
    lens: list[int]  # seq_lens
    decode: list[int]  # sequences with one query token
    prefill: list[int]  # sequences with more
    native_ids: torch.Tensor  # int32: the rows the native kernel computes (decodes, prefills it takes)
    sdpa_prefill: list[int]  # prefills past the native kernel's context limit: SDPA's, where it runs

    @classmethod
    def of(cls, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
           native_max_context: int | None = NATIVE_PREFILL_MAX_CONTEXT) -> "StepRows":
        """`native_max_context`: the longest context of a prefill the native
        kernel takes (`native_prefill_max_context` of the cache; None: any)."""
        starts = query_start_loc.tolist()  # on CPU these syncs are free
        lens = seq_lens.tolist()
        q_lens = [b - a for a, b in zip(starts, starts[1:])]
        decode = [i for i, n in enumerate(q_lens) if n == 1]
        prefill = [i for i, n in enumerate(q_lens) if n > 1]
        limit = native_max_context
        sdpa_prefill = [] if limit is None else [i for i in prefill if lens[i] > limit]
        native_ids = decode + [i for i in prefill if limit is None or lens[i] <= limit]
        return cls(starts, lens, decode, prefill, torch.tensor(native_ids, dtype=torch.int32), sdpa_prefill)


def native_prefill_max_context(key_cache: torch.Tensor) -> int | None:
    """The longest context of a prefill chunk the native kernel takes from
    this cache: any where it tiles chunks, else NATIVE_PREFILL_MAX_CONTEXT."""
    return None if native.tiles_chunks(key_cache) else NATIVE_PREFILL_MAX_CONTEXT


def paged_attention_cpu(
    query: torch.Tensor,  # [num_tokens, heads, head_dim]
    key_cache: torch.Tensor,  # logical [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] context incl. this step
    query_start_loc: torch.Tensor,  # [num_seqs + 1]
    scale: float,
    rows: StepRows | None = None,  # StepRows.of(...) for this cache, when the caller keeps it
) -> torch.Tensor:
    """Same contract as `paged_attention_reference.paged_attention`."""
    assert query.dim() == 3 and key_cache.dim() == 4 and key_cache.shape == value_cache.shape
    assert query.shape[1] % key_cache.shape[2] == 0, "query heads must be a multiple of KV heads"
    assert query.device.type == "cpu", "the CPU kernel runs on CPU tensors"
    rows = rows or StepRows.of(seq_lens, query_start_loc, native_prefill_max_context(key_cache))
    starts, lens, decode, prefill = rows.starts, rows.lens, rows.decode, rows.prefill
    if _use_native(query, key_cache, value_cache):
        # Decode rows and the prefills it takes read their blocks in place (no gather, no padding).
        native_ids = rows.native_ids
        # Every row the kernel computes is written whole: zeros only where others are left.
        whole = len(native_ids) == len(lens) and starts[-1] == query.shape[0]
        out = torch.empty_like(query) if whole else torch.zeros_like(query)
        if len(native_ids):
            paged_attention_native(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
                                   scale, seq_ids=native_ids, out=out)
        prefill = rows.sdpa_prefill
        if not prefill:
            return out
        decode = []
    else:
        out = torch.zeros_like(query)
    block_size = key_cache.shape[1]
    groups = _length_groups(decode, lens, block_size)
    if len(groups) == 1 and len(decode) == len(lens) and starts[-1] == query.shape[0]:
        # Pure decode step of similar lengths: query row i is sequence i; no scatter needed.
        return _decode(query, key_cache, value_cache, block_tables, seq_lens.long(), max(lens), scale)
    for group in groups:
        positions = torch.tensor([starts[i] for i in group])
        index = torch.tensor(group)
        out[positions] = _decode(
            query[positions], key_cache, value_cache, block_tables[index], seq_lens[index].long(),
            max(lens[i] for i in group), scale,
        )
    for i in prefill:
        out[starts[i] : starts[i + 1]] = _prefill_one(
            query[starts[i] : starts[i + 1]], key_cache, value_cache, block_tables[i], lens[i], scale
        )
    return out
