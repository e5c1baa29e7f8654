"""The vectorised CPU path computes what the reference computes, for both
physical KV layouts behind the logical [num_blocks, block_size, kv_heads, head_dim] shape."""

import pytest
import torch

from sluice.kernels import paged_attention_native as native
from sluice.kernels.paged_attention_cpu import (
    NATIVE_PREFILL_MAX_CONTEXT,
    StepRows,
    _length_groups,
    native_prefill_max_context,
    head_major_storage,
    transposed_storage,
    paged_attention_cpu,
    write_kv_cpu,
)
from sluice.kernels.paged_attention_reference import paged_attention, write_kv
from sluice.model.kv_cache import KVCache, KVLayout, interleaved_kv

# fp32 throughout; the two differ only in summation order (batched matmul
# and fused SDPA vs per-head matmuls), which moves results by ~1e-6.
ATOL = 1e-5
LAYOUTS = ["block_major", "head_major", "transposed", "interleaved"]


def as_layout(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """The same logical cache, stored block-major (contiguous), head-major, or
    head-major with each block transposed (the CPU layout for keys)."""
    if layout == "block_major":
        return cache.clone()
    if layout == "transposed":
        storage = cache.permute(2, 0, 3, 1).contiguous()  # [kv_heads, num_blocks, head_dim, block_size]
        return storage.permute(1, 3, 0, 2)
    storage = cache.permute(2, 0, 1, 3).contiguous()  # [kv_heads, num_blocks, block_size, head_dim]
    return storage.permute(1, 2, 0, 3)


def as_layouts(key_cache: torch.Tensor, value_cache: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values in `layout` (interleaved: one storage holds both)."""
    if layout == "interleaved":
        num_blocks, block_size, kv_heads, head_dim = key_cache.shape
        keys, values = interleaved_kv(num_blocks, block_size, kv_heads, head_dim, key_cache.dtype, "cpu")
        keys.copy_(key_cache)
        values.copy_(value_cache)
        return keys, values
    return as_layout(key_cache, layout), as_layout(value_cache, value_layout(layout))


def value_layout(layout: str) -> str:
    """Values are never transposed: transposed keys go with head-major values."""
    return "head_major" if layout == "transposed" else layout


def test_head_major_storage_is_recognised():
    cache = torch.zeros(6, 16, 4, 8)
    assert head_major_storage(cache) is None
    storage = head_major_storage(as_layout(cache, "head_major"))
    assert storage is not None and storage.shape == (4, 6, 16, 8) and storage.is_contiguous()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_write_kv_cpu_matches_reference(layout, cpu_path):
    torch.manual_seed(0)
    key_cache = torch.randn(8, 4, 2, 16)
    value_cache = torch.randn_like(key_cache)
    key, value = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    slots = torch.tensor([3, 17, -1, 30, 0])  # -1: a padding row, skipped
    ours_k, ours_v = as_layouts(key_cache, value_cache, layout)
    write_kv(key, value, key_cache, value_cache, slots)
    write_kv_cpu(key, value, ours_k, ours_v, slots)
    assert torch.equal(ours_k, key_cache) and torch.equal(ours_v, value_cache)
    if layout == "head_major":  # written in place, layout kept
        assert head_major_storage(ours_k) is not None
    if layout == "transposed":
        assert transposed_storage(ours_k) is not None and head_major_storage(ours_v) is not None
    if layout == "interleaved":
        assert KVCache(ours_k, ours_v).layout is KVLayout.BLOCK_INTERLEAVED


@pytest.fixture(params=["native", "torch"])
def cpu_path(request, monkeypatch):
    """K/V writes and decode rows through the native kernels (when built), and through torch."""
    if request.param == "native" and not native.available():
        pytest.skip("native kernel not built")
    if request.param == "torch":
        monkeypatch.setattr(native, "available", lambda: False)
    return request.param


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("heads,kv_heads", [(8, 4), (4, 4), (8, 1)])
@pytest.mark.parametrize("decode_only", [False, True])
def test_ragged_batch_matches_reference(block_size, heads, kv_heads, layout, decode_only, cpu_path):
    torch.manual_seed(block_size + heads + kv_heads)
    head_dim, num_blocks = 32, 160
    # (tokens already cached, tokens this step): decodes, a fresh prefill, a mid-context
    # chunk, and a chunk whose context is past NATIVE_PREFILL_MAX_CONTEXT (SDPA's, not the kernel's).
    shapes = [(40, 1), (0, 23), (17, 1), (33, 9), (block_size - 1, 1), (0, 1),
              (NATIVE_PREFILL_MAX_CONTEXT - 5, 12)]
    if decode_only:
        # One long context among short ones: gathered in its own length group.
        shapes = [s for s in shapes if s[1] == 1] + [(70, 1), (600, 1)]
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
    ours_k, ours_v = as_layouts(key_cache, value_cache, layout)
    write_kv(key, value, key_cache, value_cache, torch.tensor(slots))
    write_kv_cpu(key, value, ours_k, ours_v, torch.tensor(slots))
    query_start_loc = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    expected = paged_attention(query, key_cache, value_cache, block_tables, lens, query_start_loc, head_dim**-0.5)
    got = paged_attention_cpu(query, ours_k, ours_v, block_tables, lens, query_start_loc, head_dim**-0.5)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    # The split derived once and kept for every layer of the step, as the model's CPU backend keeps it.
    rows = StepRows.of(lens, query_start_loc)
    for _ in range(2):
        kept = paged_attention_cpu(query, ours_k, ours_v, block_tables, lens, query_start_loc, head_dim**-0.5, rows)
        torch.testing.assert_close(kept, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_query_rows_past_the_last_sequence_come_back_zero(layout, cpu_path):
    # A padded batch: two decodes, then rows no sequence owns.
    torch.manual_seed(3)
    block_size, heads, kv_heads, head_dim = 16, 8, 4, 32
    key_cache, value_cache = torch.randn(8, block_size, kv_heads, head_dim), torch.randn(8, block_size, kv_heads, head_dim)
    ours_k, ours_v = as_layouts(key_cache, value_cache, layout)
    block_tables = torch.tensor([[1, 2], [5, 0]], dtype=torch.int32)
    lens, query_start_loc = torch.tensor([20, 7], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32)
    query = torch.randn(5, heads, head_dim)
    expected = paged_attention(query, key_cache, value_cache, block_tables, lens, query_start_loc, 0.2)
    got = paged_attention_cpu(query, ours_k, ours_v, block_tables, lens, query_start_loc, 0.2)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    assert not got[2:].any()


def test_decode_length_groups_bound_padding():
    lens = {0: 40, 1: 4000, 2: 17, 3: 130, 4: 300, 5: 3900}
    groups = _length_groups(list(lens), [lens[i] for i in range(6)], block_size=16)
    assert groups == [[2, 0, 3], [4], [5, 1]]
    assert sorted(i for g in groups for i in g) == list(range(6))


@pytest.mark.parametrize(("layout", "block_size", "head_dim", "tiled"), [
    ("interleaved", 16, 32, True),   # the CPU default
    ("transposed", 16, 128, True),
    ("interleaved", 32, 32, False),  # 32-slot blocks: the row-at-a-time loop
    ("interleaved", 16, 24, False),  # a head size the tiles are not written for
    ("block_major", 16, 32, False),  # keys in rows
    ("head_major", 16, 64, False),
])
def test_long_prefills_go_to_the_native_kernel_where_it_tiles_them(layout, block_size, head_dim, tiled):
    keys, values = as_layouts(torch.zeros(4, block_size, 2, head_dim), torch.zeros(4, block_size, 2, head_dim), layout)
    assert native.tiles_chunks(keys) == tiled
    # A decode, a short prefill and one past the row loop's context limit.
    seq_lens = torch.tensor([40, 23, NATIVE_PREFILL_MAX_CONTEXT + 7], dtype=torch.int32)
    query_start_loc = torch.tensor([0, 1, 24, 36], dtype=torch.int32)
    rows = StepRows.of(seq_lens, query_start_loc, native_prefill_max_context(keys))
    assert rows.native_ids.tolist() == ([0, 1, 2] if tiled else [0, 1])
    assert rows.sdpa_prefill == ([] if tiled else [2])
