"""The native CPU kernel (C, reads blocks in place) computes what the torch
reference computes, on ragged batches in both KV layouts, and refuses inputs
that would make it read outside the cache."""

import shutil

import pytest
import torch

from sluice.kernels import paged_attention
from sluice.kernels import paged_attention_native as native
from sluice.kernels.paged_attention_native import paged_attention_native
from sluice.model.kv_cache import interleaved_kv
from support.paged_batches import paged_batch

# fp32; the kernel sums in another order than the reference (and its exp is a
# polynomial within ~2 ulp of libm's), which moves results by ~1e-6.
ATOL = 1e-5

# (seq_len, q_len): decode of a 1-token context, decode on a block edge and past
# it, a whole prefill, a chunk starting mid-context, a long context.
RAGGED = [(1, 1), (16, 1), (17, 1), (50, 50), (70, 13), (33, 1), (600, 1)]

pytestmark = pytest.mark.skipif(
    not native.available() and shutil.which("cc") is None,
    reason="no C compiler: the native kernel was not built, the torch path serves",
)


VARIANTS = native._native.supported_variants() if native.available() else []


@pytest.fixture(autouse=True, params=VARIANTS or ["none"])
def kernel_variant(request):
    """Every test runs on every instruction-set variant this CPU supports
    (AVX-512, AVX2, baseline), not only the widest one the import picks."""
    if not VARIANTS:
        yield None
        return
    chosen = native._native.variant()
    native._native.set_variant(request.param)
    yield request.param
    native._native.set_variant(chosen)


def test_the_widest_variant_this_cpu_supports_runs_by_default(kernel_variant):
    import subprocess
    import sys

    picked = subprocess.run([sys.executable, "-c", "from sluice.kernels import _paged_attention_cpu as k; "
                             "print(k.variant(), *k.supported_variants())"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert picked[0] == picked[1]  # the first supported is the widest
    assert picked[-1] == "baseline"
    with pytest.raises(ValueError):
        native._native.set_variant("avx1024")


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """The same logical cache stored [kv_heads, num_blocks, block_size, head_dim]."""
    return cache.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)


def transposed(cache: torch.Tensor) -> torch.Tensor:
    """The same logical cache stored [kv_heads, num_blocks, head_dim, block_size]."""
    return cache.permute(2, 0, 3, 1).contiguous().permute(1, 3, 0, 2)


def call(b, layout="block_major", **kwargs):
    k, v = b["key_cache"], b["value_cache"]
    if layout == "head_major":
        k, v = head_major(k), head_major(v)
    if layout == "transposed_keys":
        k, v = transposed(k), head_major(v)
    if layout == "interleaved":
        num_blocks, block_size, kv_heads, head_dim = k.shape
        k, v = (interleaved.copy_(cache) for interleaved, cache
                in zip(interleaved_kv(num_blocks, block_size, kv_heads, head_dim, k.dtype, "cpu"), (k, v)))
    return paged_attention_native(b["query"], k, v, b["block_tables"], b["seq_lens"],
                                  b["query_start_loc"], b["query"].shape[-1] ** -0.5, **kwargs)


def reference(b):
    return paged_attention(b["query"], b["key_cache"], b["value_cache"], b["block_tables"],
                           b["seq_lens"], b["query_start_loc"], b["query"].shape[-1] ** -0.5)


def test_kernel_is_built_where_a_compiler_is():
    # CI installs with a C compiler: a silent fallback to the torch path would
    # pass every other test here by skipping them and lose the speed.
    assert native.available()


@pytest.mark.parametrize("layout", ["block_major", "head_major", "transposed_keys", "interleaved"])
@pytest.mark.parametrize(("block_size", "head_dim", "num_heads", "num_kv_heads"), [
    (16, 32, 8, 4), (32, 64, 4, 1), (16, 128, 4, 4), (16, 64, 8, 2), (8, 32, 4, 2),
])
def test_ragged_batch_matches_reference(layout, block_size, head_dim, num_heads, num_kv_heads):
    b = paged_batch(RAGGED, block_size, num_heads, num_kv_heads, head_dim, seed=block_size + head_dim)
    torch.testing.assert_close(call(b, layout), reference(b), atol=ATOL, rtol=0)


@pytest.mark.parametrize("layout", ["block_major", "transposed_keys", "interleaved"])
def test_odd_head_dim_takes_the_generic_loop(layout):
    b = paged_batch([(5, 1), (40, 7)], 16, 4, 2, 24, seed=3)
    torch.testing.assert_close(call(b, layout), reference(b), atol=ATOL, rtol=0)


# Prefills and chunks whose tiles of query rows straddle block edges, end
# short, and see different numbers of keys (the tiled path).
CHUNKS = [(37, 37), (70, 13), (45, 9), (16, 3), (129, 2)]


@pytest.mark.parametrize("layout", ["transposed_keys", "interleaved"])
@pytest.mark.parametrize(("head_dim", "num_heads", "num_kv_heads"), [
    (16, 4, 4),   # one vector a row: the values one vector at a time
    (48, 8, 1),   # eight query heads a KV head, an odd number of vectors a row
    (32, 16, 1),  # more query heads than a tile's rows
    (128, 4, 2),  # values in four passes of two vectors
])
def test_chunks_of_any_group_and_head_size_match_reference(layout, head_dim, num_heads, num_kv_heads):
    b = paged_batch(CHUNKS, 16, num_heads, num_kv_heads, head_dim, seed=head_dim + num_heads)
    torch.testing.assert_close(call(b, layout), reference(b), atol=ATOL, rtol=0)


def test_a_nan_key_reaches_only_the_rows_of_a_chunk_that_see_it():
    # A chunk's query rows see more keys the later they are. A corrupt key
    # (the last of the context) must make exactly the rows that see it NaN:
    # the rows before it in the same tile of rows must not take it in, not
    # even as a zero weight times NaN.
    b = paged_batch([(40, 12)], 16, 4, 2, 32, seed=8)
    key_cache, value_cache = b["key_cache"].clone(), b["value_cache"].clone()
    block, slot = int(b["block_tables"][0, 39 // 16]), 39 % 16
    for corrupt_keys in (True, False):
        corrupt = dict(b)
        cache = key_cache if corrupt_keys else value_cache
        cache[block, slot] = float("nan")
        corrupt["key_cache" if corrupt_keys else "value_cache"] = cache.clone()
        cache[block, slot] = b["key_cache" if corrupt_keys else "value_cache"][block, slot]
        for layout in ("transposed_keys", "interleaved"):
            out = call(corrupt, layout)
            assert bool(out[-1].isnan().all()), (corrupt_keys, layout)  # the last query sees position 39
            torch.testing.assert_close(out[:-1], reference(b)[:-1], atol=ATOL, rtol=0)


def test_seq_ids_compute_only_those_rows():
    b = paged_batch(RAGGED, 16, 8, 4, 32, seed=5)
    out = torch.full_like(b["query"], 7.0)
    call(b, seq_ids=torch.tensor([0, 2, 6], dtype=torch.int32), out=out)
    expected = reference(b)
    starts = b["query_start_loc"].tolist()
    for i in range(len(RAGGED)):
        rows = slice(starts[i], starts[i + 1])
        if i in (0, 2, 6):
            torch.testing.assert_close(out[rows], expected[rows], atol=ATOL, rtol=0)
        else:
            assert bool((out[rows] == 7.0).all()), f"sequence {i} was written"


def test_far_apart_scores_underflow_to_zero_weight():
    # Scores that differ by more than ~87 make exp underflow: the kernel must
    # give those keys weight 0 (not NaN, not garbage from the exponent bits).
    b = paged_batch([(40, 1), (33, 1)], 16, 4, 2, 32, seed=6)
    # Scores in the hundreds: a 1e-7 relative rounding difference moves them by
    # 1e-5, so this one is held to the fp32 tolerance, 1e-4.
    b["query"] = b["query"] * 60.0
    torch.testing.assert_close(call(b), reference(b), atol=1e-4, rtol=0)
    torch.testing.assert_close(call(b, "transposed_keys"), reference(b), atol=1e-4, rtol=0)


def test_a_nan_key_makes_its_sequences_output_nan_and_leaves_the_others_alone():
    # A corrupt key must show in its sequence's output, not be weighted 0
    # (the exponential's clamp lets NaNs of either sign through), and must
    # not reach another sequence's rows.
    b = paged_batch([(40, 1), (33, 1)], 16, 4, 2, 32, seed=7)
    for sign in (1.0, -1.0):
        corrupt = dict(b)
        key_cache = b["key_cache"].clone()
        slot = int(b["block_tables"][0, 1])  # a block of the first sequence only
        key_cache[slot, 3] = sign * float("nan")
        corrupt["key_cache"] = key_cache
        for layout in ("block_major", "transposed_keys"):
            out = call(corrupt, layout)
            assert bool(out[0].isnan().all()), (sign, layout)
            torch.testing.assert_close(out[1], reference(b)[1], atol=ATOL, rtol=0)


def test_out_of_range_inputs_are_refused_before_the_kernel_runs():
    b = paged_batch([(20, 1), (5, 1)], 16, 4, 2, 32)
    bad_table = b["block_tables"].clone()
    bad_table[0, 1] = b["key_cache"].shape[0]  # one past the last block
    with pytest.raises(ValueError, match="block tables"):
        paged_attention_native(b["query"], b["key_cache"], b["value_cache"], bad_table,
                               b["seq_lens"], b["query_start_loc"], 0.1)
    too_long = b["seq_lens"].clone()
    too_long[1] = b["block_tables"].shape[1] * 16 + 1  # more tokens than its table covers
    with pytest.raises(ValueError, match="block tables"):
        paged_attention_native(b["query"], b["key_cache"], b["value_cache"], b["block_tables"],
                               too_long, b["query_start_loc"], 0.1)
    past_the_query = b["query_start_loc"].clone()
    past_the_query[-1] = b["query"].shape[0] + 1  # a query row that is not there
    with pytest.raises(ValueError, match="block tables"):
        paged_attention_native(b["query"], b["key_cache"], b["value_cache"], b["block_tables"],
                               b["seq_lens"], past_the_query, 0.1)
    with pytest.raises(ValueError, match="seq_ids outside"):
        call(b, seq_ids=torch.tensor([2], dtype=torch.int32))
    with pytest.raises(ValueError, match="float32"):
        paged_attention_native(b["query"].half(), b["key_cache"].half(), b["value_cache"].half(),
                               b["block_tables"], b["seq_lens"], b["query_start_loc"], 0.1)


def test_write_kv_refuses_slots_outside_the_cache():
    from sluice.kernels.paged_attention_native import write_kv_native

    cache = torch.zeros(4, 16, 2, 32)
    rows = torch.zeros(1, 2, 32)
    with pytest.raises(ValueError, match="slot outside"):
        write_kv_native(rows, rows, cache, cache.clone(), torch.tensor([4 * 16]))
    two_rows = torch.ones(2, 2, 32)
    with pytest.raises(ValueError, match="slot outside"):  # the good slot before it is not written either
        write_kv_native(two_rows, two_rows, cache, cache.clone(), torch.tensor([3, 4 * 16]))
    assert not cache.any()


@pytest.mark.parametrize("layout", ["block_major", "interleaved"])
def test_column_slices_of_a_fused_projection_are_read_where_they_lie(layout):
    # A step's q, k and v are column slices of one [tokens, (heads + 2 kv_heads) * head_dim]
    # projection: rows a token stride apart, heads and head_dim dense within a token.
    from sluice.kernels.paged_attention_native import token_rows, write_kv_native
    from sluice.kernels.paged_attention_reference import write_kv

    b = paged_batch(RAGGED, 16, 8, 4, 32, seed=9)
    num_tokens, heads, head_dim = b["query"].shape
    kv_heads = b["key_cache"].shape[2]
    fused = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim)
    q = fused[:, : heads * head_dim].view(num_tokens, heads, head_dim)
    k = fused[:, heads * head_dim : (heads + kv_heads) * head_dim].view(num_tokens, kv_heads, head_dim)
    v = fused[:, (heads + kv_heads) * head_dim :].view(num_tokens, kv_heads, head_dim)
    for rows in (q, k, v):
        assert not rows.is_contiguous() and token_rows(rows).data_ptr() == rows.data_ptr()  # no copy
    assert token_rows(q.transpose(1, 2).contiguous().transpose(1, 2)).is_contiguous()  # heads not dense: copied
    b["query"] = q
    num_blocks = b["key_cache"].shape[0]
    slots = torch.randperm(num_blocks * 16)[:num_tokens]
    expected = dict(b, query=q.contiguous())
    write_kv(k.contiguous(), v.contiguous(), expected["key_cache"], expected["value_cache"], slots)
    if layout == "interleaved":
        keys, values = interleaved_kv(num_blocks, 16, kv_heads, head_dim, torch.float32, "cpu")
        keys.copy_(b["key_cache"])
        values.copy_(b["value_cache"])
    else:
        keys, values = b["key_cache"].clone(), b["value_cache"].clone()
    write_kv_native(k, v, keys, values, slots)
    torch.testing.assert_close(keys, expected["key_cache"], atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(values, expected["value_cache"], atol=0, rtol=0, equal_nan=True)
    got = paged_attention_native(q, keys, values, b["block_tables"], b["seq_lens"], b["query_start_loc"],
                                 head_dim**-0.5)
    torch.testing.assert_close(got, reference(expected), atol=ATOL, rtol=0)
