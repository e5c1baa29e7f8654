"""Triton paged attention kernels against the torch reference.

On a machine without CUDA the kernels run under the Triton interpreter
(TRITON_INTERPRET=1, numpy on the CPU). Triton reads that variable when a
``@triton.jit`` decorator runs: for ``triton.language`` itself when triton is
first imported (done in interpreter mode by this directory's conftest), for
our kernels when their modules are imported. The ``kernels`` fixture sets it,
(re)imports the kernel modules, and restores the environment after this
module, so other tests in the same process never see it. With CUDA the same
tests run the compiled kernels on the GPU.

The interpreter is slow (one Python-level program at a time), so batches
are small but ragged: decode rows, a full prefill, prefill chunks that start
mid-context, contexts that end on / just past / inside a page, over page
sizes 16 and 32, head dims 32/64/128, GQA ratios 1/2/4.

Tolerances (max abs error; outputs are convex mixes of N(0,1) values, |o| < ~3):
- fp32: 1e-4. Kernel and reference both accumulate in fp32 (the kernel's
  dot products are exact-fp32 "ieee", not tf32); the only difference is
  summation order and the online-softmax rescaling (observed max 9e-7).
- fp16: 4e-3 (observed max 9.8e-4). The kernel rounds the softmax probabilities to fp16 before
  the P @ V product (as flash attention does) and rounds the output to fp16
  (half an ulp at |o| ~ 2 is 1e-3); the reference keeps P in fp32.
- bf16: 3e-2. Same two roundings with bf16's 8-bit mantissa: one output
  ulp is 7.8e-3 at |o| in [1, 2) and 1.6e-2 in [2, 4); observed max 1.6e-2.
  Under the interpreter bf16 dot operands are upcast to fp32 (its bf16
  tl.dot is broken in triton 3.7); that upcast is exact, so the numerics
  are those of the GPU path (bf16 inputs, fp32 accumulation).
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

pytest.importorskip("triton")

from sluice.kernels import paged_attention, write_kv  # noqa: E402
from support.paged_batches import paged_batch  # noqa: E402

ON_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
KERNEL_MODULES = (
    "sluice.kernels.triton_paged_decode",
    "sluice.kernels.triton_paged_prefill",
    "sluice.kernels.triton_write_kv",
)

# (seq_len, q_len). Decode of a 1-token context, decode mid-page, a full
# prefill crossing pages, a chunk starting mid-context, decode right past a
# page edge, a chunk ending exactly on a page edge.
MIXED_BATCH = [(1, 1), (37, 1), (50, 50), (70, 13), (33, 1), (64, 16)]
DECODE_BATCH = [(1, 1), (16, 1), (17, 1), (45, 1), (96, 1)]

# (dtype, block_size, head_dim, num_heads, num_kv_heads): every dtype, page
# size, head dim and GQA ratio appears at least once.
CONFIGS = [
    pytest.param(torch.float32, 16, 64, 4, 2, id="fp32-bs16-d64-gqa2"),
    pytest.param(torch.float32, 32, 128, 4, 1, id="fp32-bs32-d128-gqa4"),
    pytest.param(torch.float32, 16, 32, 2, 2, id="fp32-bs16-d32-mha"),
    pytest.param(torch.float16, 32, 64, 4, 2, id="fp16-bs32-d64-gqa2"),
    pytest.param(torch.bfloat16, 16, 128, 4, 1, id="bf16-bs16-d128-gqa4"),
]


@pytest.fixture(scope="module")
def kernels():
    """The kernel modules, imported in interpreter mode when there is no GPU."""
    if not ON_CUDA:
        from triton.language import standard
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(standard.zeros, InterpretedFunction):
            pytest.skip(
                "triton was imported before TRITON_INTERPRET=1 was set (by a test "
                "collected earlier), so its interpreter cannot run here; run "
                "tests/unit/kernels on its own or with TRITON_INTERPRET=1"
            )
    saved = os.environ.get("TRITON_INTERPRET")
    if not ON_CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        modules = {}
        for name in KERNEL_MODULES:
            # Reload if already imported: the jit decorators must run under
            # the current TRITON_INTERPRET setting.
            module = sys.modules.get(name)
            modules[name.rsplit(".", 1)[1]] = (
                importlib.reload(module) if module is not None else importlib.import_module(name)
            )
        yield modules
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def build_batch(batch, block_size, num_heads, num_kv_heads, head_dim, dtype, seed=0):
    return paged_batch(batch, block_size, num_heads, num_kv_heads, head_dim, dtype, seed=seed, device=DEVICE)


def reference(b, scale):
    return paged_attention(
        b["query"], b["key_cache"], b["value_cache"], b["block_tables"], b["seq_lens"],
        b["query_start_loc"], scale,
    )


def assert_close(out, ref, dtype):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= TOLERANCE[dtype], f"max abs error {err:.3g} > {TOLERANCE[dtype]:g} ({dtype})"


@pytest.mark.parametrize(("dtype", "block_size", "head_dim", "num_heads", "num_kv_heads"), CONFIGS)
def test_prefill_kernel_matches_reference_on_mixed_batch(
    kernels, dtype, block_size, head_dim, num_heads, num_kv_heads
):
    b = build_batch(MIXED_BATCH, block_size, num_heads, num_kv_heads, head_dim, dtype)
    scale = head_dim**-0.5
    out = kernels["triton_paged_prefill"].paged_prefill_attention(
        b["query"], b["key_cache"], b["value_cache"], b["block_tables"], b["seq_lens"],
        b["query_start_loc"], b["max_query_len"], scale,
    )
    assert_close(out, reference(b, scale), dtype)


def test_prefill_kernel_small_tiles_and_padding_rows(kernels):
    """Several query tiles per sequence, KV tiles smaller than a page, and
    padding tokens past query_start_loc[-1] that must stay zero."""
    dtype = torch.float32
    b = build_batch([(70, 40), (9, 9), (32, 1)], 32, 4, 2, 32, dtype, seed=1)
    pad = torch.randn(3, 4, 32, device=DEVICE)
    b["query"] = torch.cat([b["query"], pad])
    scale = 0.2
    out = kernels["triton_paged_prefill"].paged_prefill_attention(
        b["query"], b["key_cache"], b["value_cache"], b["block_tables"], b["seq_lens"],
        b["query_start_loc"], b["max_query_len"], scale, block_m=16, block_n=16,
    )
    ref = reference(b, scale)
    assert_close(out, ref, dtype)
    assert torch.all(out[-3:] == 0)


@pytest.mark.parametrize(("dtype", "block_size", "head_dim", "num_heads", "num_kv_heads"), CONFIGS)
def test_decode_kernel_matches_reference(
    kernels, dtype, block_size, head_dim, num_heads, num_kv_heads
):
    b = build_batch(DECODE_BATCH, block_size, num_heads, num_kv_heads, head_dim, dtype)
    scale = head_dim**-0.5
    out = kernels["triton_paged_decode"].paged_decode_attention(
        b["query"], b["key_cache"], b["value_cache"], b["block_tables"], b["seq_lens"], scale,
    )
    assert_close(out, reference(b, scale), dtype)


@pytest.mark.parametrize("num_splits", [2, 3])
def test_decode_kernel_with_kv_splits(kernels, num_splits):
    """Flash-decoding path: partial softmax states merged by the second kernel,
    including splits that are empty for the shorter sequences."""
    dtype = torch.float32
    b = build_batch(DECODE_BATCH, 16, 8, 2, 64, dtype, seed=2)
    out_buf = torch.full_like(b["query"], float("nan"))
    out = kernels["triton_paged_decode"].paged_decode_attention(
        b["query"], b["key_cache"], b["value_cache"], b["block_tables"], b["seq_lens"], 0.125,
        out=out_buf, max_seq_len=b["max_seq_len"], num_splits=num_splits, block_n=16,
    )
    assert out is out_buf
    assert_close(out, reference(b, 0.125), dtype)


def test_write_kv_kernel_matches_reference(kernels):
    g = torch.Generator().manual_seed(3)
    shape = (5, 16, 2, 32)
    key_cache = torch.randn(shape, generator=g)
    value_cache = torch.randn(shape, generator=g)
    key = torch.randn(6, 2, 32, generator=g)
    value = torch.randn(6, 2, 32, generator=g)
    slots = torch.tensor([3, -1, 17, 79, -1, 40])
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    write_kv(key, value, ref_k, ref_v, slots)
    k_dev, v_dev = key_cache.to(DEVICE), value_cache.to(DEVICE)
    kernels["triton_write_kv"].write_kv_triton(
        key.to(DEVICE), value.to(DEVICE), k_dev, v_dev, slots.to(DEVICE)
    )
    assert torch.equal(k_dev.cpu(), ref_k) and torch.equal(v_dev.cpu(), ref_v)


@pytest.mark.parametrize("phase", ["mixed", "decode"])
def test_triton_backend_matches_reference_backend(kernels, phase):
    """The AttentionBackend: writes this step's K/V, then dispatches on
    max_query_len. Query/key/value are strided views of one fused qkv
    tensor, as a model produces them."""
    from sluice.model import attention
    from sluice.kernels.triton_backend import triton_attention
    from sluice.model.kv_cache import KVCache

    batch = [(20, 1), (40, 24), (17, 1)] if phase == "mixed" else [(20, 1), (40, 1), (17, 1)]
    num_heads, num_kv_heads, head_dim, block_size = 4, 2, 32, 16
    b = build_batch(batch, block_size, num_heads, num_kv_heads, head_dim, torch.float32, seed=4)
    # This step's tokens are not in the cache yet: the backend writes them.
    g = torch.Generator().manual_seed(5)
    num_tokens = b["query"].shape[0]
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=g)
    qkv = qkv.to(DEVICE)
    query = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    key = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim]
    key = key.view(num_tokens, num_kv_heads, head_dim)
    value = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    bt, qsl = b["block_tables"].cpu(), b["query_start_loc"].cpu().tolist()
    slot_mapping = []
    for i, (seq_len, q_len) in enumerate(batch):
        for p in range(seq_len - q_len, seq_len):
            slot_mapping.append(int(bt[i, p // block_size]) * block_size + p % block_size)
    assert len(slot_mapping) == qsl[-1] == num_tokens
    meta = attention.AttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=DEVICE),
        block_tables=b["block_tables"],
        seq_lens=b["seq_lens"],
        query_start_loc=b["query_start_loc"],
        max_query_len=b["max_query_len"],
        max_seq_len=b["max_seq_len"],
    )
    ref_cache = KVCache(b["key_cache"].clone(), b["value_cache"].clone())
    tri_cache = KVCache(b["key_cache"].clone(), b["value_cache"].clone())
    scale = head_dim**-0.5
    ref = attention.reference_attention(query, key, value, ref_cache, meta, scale)
    out = triton_attention(query, key, value, tri_cache, meta, scale)
    assert torch.equal(tri_cache.key_cache.isnan(), ref_cache.key_cache.isnan())
    assert torch.equal(tri_cache.key_cache.nan_to_num(), ref_cache.key_cache.nan_to_num())
    assert torch.equal(tri_cache.value_cache.nan_to_num(), ref_cache.value_cache.nan_to_num())
    assert_close(out, ref, torch.float32)


def test_model_over_triton_backend_matches_reference_backend(kernels):
    """The whole model on the Triton backend (q and k as views of one rotated
    tensor, v a view of the fused projection) gives the reference's logits."""
    import sluice.model as model_lib
    from sluice.kernels.triton_backend import triton_attention
    from sluice.model.runner import ModelInput, SequenceInput
    from sluice.model.sampler import SampleRequest, SamplingParams
    from support.tiny_llama import tiny_config

    config = tiny_config(vocab_size=64, hidden_size=128, max_position_embeddings=128)  # head_dim 32
    torch.manual_seed(0)
    reference = model_lib.LlamaModel(config).eval()
    tri = model_lib.LlamaModel(config, triton_attention).eval()
    tri.load_state_dict(reference.state_dict())
    tri.to(DEVICE)
    runners = [
        model_lib.ModelRunner(model, model_lib.allocate_kv_caches(config, 16, 16, torch.float32, device))
        for model, device in ((reference, "cpu"), (tri, DEVICE))
    ]
    greedy = SampleRequest(SamplingParams(temperature=0.0))
    steps = [  # a prefill beside a short prompt, then a decode step for both
        (SequenceInput([5, 6, 7, 8, 9], 0, [3], greedy), SequenceInput([10, 11], 0, [5], greedy)),
        (SequenceInput([12], 5, [3], greedy), SequenceInput([13], 2, [5], greedy)),
    ]
    for sequences in steps:
        expected, got = (runner.execute(ModelInput(sequences, return_logits=True)) for runner in runners)
        assert_close(got.logits.cpu(), expected.logits, torch.float32)


def test_wrappers_reject_bad_inputs(kernels):
    b = build_batch([(5, 1)], 16, 2, 1, 32, torch.float32)
    decode = kernels["triton_paged_decode"].paged_decode_attention
    args = (b["key_cache"], b["value_cache"], b["block_tables"], b["seq_lens"], 1.0)
    with pytest.raises(AssertionError, match="dtype"):
        decode(b["query"].to(torch.float64), *args)
    with pytest.raises(AssertionError, match="contiguous"):
        decode(b["query"].transpose(1, 2).contiguous().transpose(1, 2), *args)
    with pytest.raises(AssertionError, match="head_dim"):
        decode(b["query"][..., :24], b["key_cache"][..., :24].contiguous(),
               b["value_cache"][..., :24].contiguous(), *args[2:])
    with pytest.raises(AssertionError, match="block_size"):
        decode(b["query"], b["key_cache"][:, :12].contiguous(),
               b["value_cache"][:, :12].contiguous(), *args[2:])
    prefill = kernels["triton_paged_prefill"].paged_prefill_attention
    with pytest.raises(AssertionError, match="query_start_loc"):
        prefill(b["query"], *args[:4], b["query_start_loc"][:1], 1, 1.0)


SM90_COMPILE = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sluice.kernels.triton_paged_decode import _paged_decode_kernel
from sluice.kernels.triton_paged_prefill import _paged_prefill_kernel


def compile_sm90(fn, pointers, constexprs, num_stages=2):
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, "*bf16")
        else:
            signature[name] = "fp32" if name == "scale_log2" else "i32"
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=4, num_stages=num_stages))
    assert kernel.asm["cubin"], fn.__name__


ints = {"block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32"}
compile_sm90(_paged_decode_kernel, ints, dict(
    GROUP=8, GROUP_PAD=16, HEAD_DIM=128, BLOCK_SIZE=16, BLOCK_N=64, USE_SPLITS=False,
    DOT_F32=False))
# The wrapper's default launch: 128 rows (16 tokens x a group of 8), 3 stages.
compile_sm90(_paged_prefill_kernel, ints, dict(
    GROUP=8, GROUP_PAD=8, BLOCK_Q=16, BLOCK_M=128, HEAD_DIM=128, BLOCK_SIZE=32, BLOCK_N=64,
    DOT_F32=False), num_stages=3)
print("compiled")
"""


@pytest.mark.skipif(ON_CUDA, reason="on CUDA the tests above compile and run the kernels")
def test_kernels_compile_for_sm90_without_a_gpu(tmp_path):
    """The interpreter does not type-check or lower kernels the way the
    compiler does; compile the bf16 decode and prefill kernels to an sm_90
    (H100/H200) cubin, which needs no GPU (triton bundles ptxas). Runs in a
    subprocess: this process imported triton in interpreter mode."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # a fresh compile, no stale cache hit
    result = subprocess.run(
        [sys.executable, "-c", SM90_COMPILE], env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0 and "compiled" in result.stdout, result.stderr[-4000:]
