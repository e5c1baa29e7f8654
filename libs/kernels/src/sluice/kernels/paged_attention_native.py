"""Python side of the native CPU paged-attention kernel (``_paged_attention_cpu.c``).

The C kernel reads K/V blocks in place through the block table, so a decode
step skips the gather the torch path needs (see paged_attention_cpu.py).
It is an optional build: ``available()`` says whether this install has it,
and callers fall back to the torch path when it does not.

Same contract as `paged_attention_reference.paged_attention`, float32 only,
for any cache layout where values have head_dim innermost and keys have
head_dim or the block's slots innermost (block-major, head-major,
head-major with transposed keys, and keys and values interleaved per block
all qualify; the last is the fast one: see sluice.model.kv_cache.KVLayout).
"""

from __future__ import annotations

import torch  # first: the kernel then shares the OpenMP runtime torch loaded

try:
    from sluice.kernels import _paged_attention_cpu as _native
except ImportError:  # built without a C compiler: the torch path serves
    _native = None


def available() -> bool:
    return _native is not None


def variant() -> str:
    """The instruction-set variant the kernel runs ("avx512", "avx2" or "baseline")."""
    return _native.variant()


def supported_variants() -> tuple[str, ...]:
    """The variants this CPU runs, widest first."""
    return tuple(_native.supported_variants())


def set_variant(name: str) -> None:
    """Run `name` from now on (ValueError if this CPU cannot); see cpu_isa.cap_isa."""
    _native.set_variant(name)


def supports_layout(key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Float32 CPU caches the kernel can address (see the module docstring)."""
    return (
        key_cache.device.type == value_cache.device.type == "cpu"
        and key_cache.dtype == value_cache.dtype == torch.float32
        and value_cache.stride(3) == 1
        and (key_cache.stride(3) == 1 or key_cache.stride(1) == 1)
    )


def tiles_chunks(key_cache: torch.Tensor) -> bool:
    """Whether the kernel runs a cache's prefills and chunks in tiles of
    query rows (``attend_tiled_d`` in the C source, which checks the same):
    transposed keys in 16-slot blocks, head_dim a multiple of 16 up to 128.
    Tiled, it beats a gather and SDPA at any context; the row-at-a-time loop
    other caches get only at short ones."""
    head_dim = key_cache.shape[3]
    return (key_cache.stride(1) == 1 and key_cache.shape[1] == 16 and head_dim % 16 == 0
            and head_dim <= 128)


def token_rows(rows: torch.Tensor) -> torch.Tensor:
    """`rows` [num_tokens, heads, head_dim] as the kernels read it: heads and
    head_dim dense within a token, any stride between tokens. A step's q, k
    and v are such column slices of its fused projection; taking them as they
    lie saves three copies a layer (a clone each for 64 decodes, ~1 MiB each
    for a 2,048-token prefill)."""
    heads, head_dim = rows.shape[1], rows.shape[2]
    dense = rows.stride(2) == 1 and rows.stride(1) == head_dim and rows.stride(0) >= heads * head_dim
    return rows if dense or rows.shape[0] == 0 else rows.contiguous()


def paged_attention_native(
    query: torch.Tensor,  # [num_tokens, heads, head_dim] float32
    key_cache: torch.Tensor,  # logical [num_blocks, block_size, kv_heads, head_dim] float32
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context incl. this step
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
    *,
    seq_ids: torch.Tensor | None = None,  # [n] int32: compute only these sequences' rows
    out: torch.Tensor | None = None,  # [num_tokens, heads, head_dim]; rows of other sequences kept
) -> torch.Tensor:
    if _native is None:
        raise RuntimeError("the native CPU attention kernel is not built in this install")
    num_tokens, num_heads, head_dim = query.shape
    num_blocks, block_size, kv_heads, cache_head_dim = key_cache.shape
    if not (query.dtype == key_cache.dtype == value_cache.dtype == torch.float32):
        raise ValueError("the native kernel takes float32 query and caches")
    if cache_head_dim != head_dim or num_heads % kv_heads or value_cache.shape != key_cache.shape:
        raise ValueError(f"query {tuple(query.shape)} does not fit cache {tuple(key_cache.shape)}")
    if not supports_layout(key_cache, value_cache) or query.device.type != "cpu":
        raise ValueError("the native kernel needs CPU caches with values' head_dim contiguous and keys' "
                         "head_dim or slots contiguous")
    query = token_rows(query)
    block_tables = block_tables.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    query_start_loc = query_start_loc.to(torch.int32).contiguous()
    num_seqs = seq_lens.shape[0]
    if seq_ids is None:
        seq_ids = torch.arange(num_seqs, dtype=torch.int32)
    seq_ids = seq_ids.to(torch.int32).contiguous()
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or query_start_loc.shape != (num_seqs + 1,):
        raise ValueError("block tables, seq_lens and query_start_loc disagree with the cache or query")
    if out is None:
        out = torch.zeros_like(query)
    if not out.is_contiguous() or out.shape != query.shape or out.dtype != torch.float32:
        raise ValueError("out must be a contiguous float32 tensor shaped like query")
    _native.paged_attention_f32(
        query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), block_tables.data_ptr(),
        seq_lens.data_ptr(), query_start_loc.data_ptr(), seq_ids.data_ptr(), out.data_ptr(),
        seq_ids.shape[0], num_heads, kv_heads, head_dim, block_size, block_tables.shape[1], query.stride(0),
        key_cache.stride(), value_cache.stride()[:3], float(scale), torch.get_num_threads(),
        num_seqs, num_tokens, num_blocks,  # the C side refuses indices outside these (a ValueError)
    )
    return out


def write_kv_native(
    key: torch.Tensor,  # [num_tokens, kv_heads, head_dim] float32
    value: torch.Tensor,
    key_cache: torch.Tensor,  # logical [num_blocks, block_size, kv_heads, head_dim]
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = padding
) -> None:
    """`write_kv` for any layout ``supports_layout`` accepts (same contract)."""
    if _native is None:
        raise RuntimeError("the native CPU attention kernel is not built in this install")
    num_blocks, block_size, kv_heads, head_dim = key_cache.shape
    if not supports_layout(key_cache, value_cache) or key.shape != value.shape or key.shape[1:] != (kv_heads, head_dim):
        raise ValueError(f"K/V {tuple(key.shape)} do not fit cache {tuple(key_cache.shape)}")
    if key.dtype != torch.float32 or value.dtype != torch.float32 or key.shape[0] != slot_mapping.shape[0]:
        raise ValueError("write_kv_native takes float32 K/V with one slot each")
    slot_mapping = slot_mapping.to(torch.int64).contiguous()
    key, value = token_rows(key), token_rows(value)
    _native.write_kv_f32(  # refuses a slot past the cache (a ValueError) before writing any
        key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), slot_mapping.data_ptr(),
        key.shape[0], kv_heads, head_dim, block_size, key.stride(0), value.stride(0), key_cache.stride(),
        value_cache.stride()[:3], num_blocks,
    )
