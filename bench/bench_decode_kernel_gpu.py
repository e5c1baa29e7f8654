"""Achieved HBM bandwidth of the Triton paged decode kernel vs the torch reference.

CUDA only: on a machine without a GPU it prints why and exits 0 (so
``make bench`` stays green on CPU boxes).

Default shape: a Llama-3-70B-like decode step on one GPU, 64 sequences with
4096 tokens of context each, 64 query heads / 8 KV heads, head_dim 128, bf16,
16-token pages scattered over the cache in random order.

Bytes moved per step (the minimum a decode kernel must read/write):
    K and V of every context token: 2 * sum(seq_lens) * kv_heads * head_dim * itemsize
    + query and output: 2 * num_seqs * heads * head_dim * itemsize
    + block tables and seq_lens (int32)
Achieved bandwidth = bytes / median kernel time (CUDA events, after warm-up).
The K/V working set (~1 GiB at the default shape) is far larger than L2.

Also: max |kernel - reference| on the same inputs, a small launch-config sweep
(block_n x num_warps x num_stages), the split-KV (flash-decoding) path on a
batch too small to fill the GPU, and a prefill-kernel correctness check.
Each part is guarded, so one failure still leaves the others' numbers.
The last line of output is one JSON object with every result.

    python bench/bench_decode_kernel_gpu.py [--num-seqs 64 --context 4096 ...]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

try:
    import sluice.kernels  # noqa: F401
except ImportError:  # not pip-installed on this machine: use the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "libs" / "kernels" / "src"))

H200_PEAK_GBPS = 4800.0  # HBM3e, ~4.8 TB/s
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 4e-3, torch.float32: 1e-4}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-seqs", type=int, default=64)
    p.add_argument("--context", type=int, default=4096, help="context tokens per sequence")
    p.add_argument("--num-heads", type=int, default=64)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--iters", type=int, default=50, help="timed kernel launches")
    p.add_argument("--ref-iters", type=int, default=5, help="timed reference calls")
    p.add_argument("--no-sweep", action="store_true", help="skip the launch-config sweep")
    return p.parse_args()


def time_cuda(fn, iters: int, warmup: int) -> float:
    """Median milliseconds of ``fn()`` over ``iters`` runs, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def build_decode_batch(num_seqs, context, num_heads, num_kv_heads, head_dim, block_size, dtype,
                       seed=0, ragged=False):
    """Random paged cache; each sequence's pages are random, non-contiguous blocks."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if ragged:  # lengths spread over [1, context]
        seq_lens = torch.randint(1, context + 1, (num_seqs,), generator=g, device="cuda")
    else:
        seq_lens = torch.full((num_seqs,), context, device="cuda")
    seq_lens = seq_lens.to(torch.int32)
    max_blocks = math.ceil(context / block_size)
    num_blocks = num_seqs * max_blocks + 8
    perm = torch.randperm(num_blocks, generator=g, device="cuda")
    block_tables = perm[: num_seqs * max_blocks].view(num_seqs, max_blocks).to(torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
    value_cache = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
    query = torch.randn(num_seqs, num_heads, head_dim, generator=g, device="cuda", dtype=dtype)
    return query, key_cache, value_cache, block_tables.contiguous(), seq_lens


def decode_bytes(query, key_cache, block_tables, seq_lens) -> int:
    _, _, num_kv_heads, head_dim = key_cache.shape
    item = key_cache.element_size()
    kv = 2 * int(seq_lens.sum().item()) * num_kv_heads * head_dim * item
    q_and_out = 2 * query.numel() * query.element_size()
    meta = block_tables.numel() * 4 + seq_lens.numel() * 4
    return kv + q_and_out + meta


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        print("bench_decode_kernel_gpu: CUDA is not available; this benchmark needs a GPU "
              "(it times the Triton decode kernel). Skipping.")
        print(json.dumps({"bench": "decode_kernel_gpu", "skipped": "no CUDA device"}))
        return 0

    try:
        import triton
    except ImportError as exc:
        print(f"bench_decode_kernel_gpu: triton is not importable ({exc}); install the triton "
              "that matches this torch (torch 2.13 pins triton 3.7.1).")
        print(json.dumps({"bench": "decode_kernel_gpu", "error": f"no triton: {exc}"}))
        return 2
    from sluice.kernels import paged_attention
    from sluice.kernels.triton_paged_decode import paged_decode_attention

    dtype = DTYPES[args.dtype]
    result: dict = {
        "bench": "decode_kernel_gpu",
        "device": torch.cuda.get_device_name(),
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shape": dict(num_seqs=args.num_seqs, context=args.context, num_heads=args.num_heads,
                      num_kv_heads=args.num_kv_heads, head_dim=args.head_dim,
                      block_size=args.block_size, dtype=args.dtype),
        "peak_gbps_assumed": H200_PEAK_GBPS,
        "errors": {},
    }
    print(f"device: {result['device']} ({result['sm_count']} SMs), torch {torch.__version__}, "
          f"triton {triton.__version__}")
    print(f"shape: {result['shape']}")
    t_start = time.time()

    query, key_cache, value_cache, block_tables, seq_lens = build_decode_batch(
        args.num_seqs, args.context, args.num_heads, args.num_kv_heads, args.head_dim,
        args.block_size, dtype,
    )
    scale = args.head_dim**-0.5
    max_seq_len = args.context
    nbytes = decode_bytes(query, key_cache, block_tables, seq_lens)
    result["bytes_per_step"] = nbytes
    print(f"bytes per decode step: {nbytes / 2**20:.1f} MiB "
          f"(ideal at peak: {nbytes / (H200_PEAK_GBPS * 1e9) * 1e6:.1f} us)")
    qsl = torch.arange(args.num_seqs + 1, dtype=torch.int32, device="cuda")
    out = torch.empty_like(query)

    def run_kernel(**kw):
        return paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens,
                                      scale, out=out, max_seq_len=max_seq_len, **kw)

    def run_reference():
        return paged_attention(query, key_cache, value_cache, block_tables, seq_lens, qsl, scale)

    # 1. Correctness at the benchmark shape.
    ok = True
    try:
        ref = run_reference()
        got = run_kernel().clone()
        torch.cuda.synchronize()
        diff = (got.float() - ref.float()).abs().max().item()
        result["max_abs_diff"] = diff
        result["tolerance"] = TOLERANCE[dtype]
        result["correct"] = bool(diff <= TOLERANCE[dtype]) and not math.isnan(diff)
        ok = result["correct"]
        print(f"max |kernel - reference| = {diff:.3g} (tolerance {TOLERANCE[dtype]:g}) "
              f"-> {'OK' if ok else 'MISMATCH'}")
        del ref
    except Exception:
        ok = False
        result["errors"]["correctness"] = traceback.format_exc()[-2000:]
        traceback.print_exc()

    # 2. Kernel timing (default launch config).
    try:
        ms = time_cuda(run_kernel, args.iters, warmup=5)
        result["kernel_ms"] = ms
        result["kernel_gbps"] = gbps(nbytes, ms)
        result["kernel_frac_of_peak"] = result["kernel_gbps"] / H200_PEAK_GBPS
        print(f"triton decode kernel: {ms * 1e3:8.1f} us  {result['kernel_gbps']:8.1f} GB/s  "
              f"({100 * result['kernel_frac_of_peak']:.1f}% of {H200_PEAK_GBPS:.0f} GB/s)")
    except Exception:
        ok = False
        result["errors"]["kernel_timing"] = traceback.format_exc()[-2000:]
        traceback.print_exc()

    # 3. Reference timing (a per-sequence python loop; it is the definition, not a fast path).
    try:
        ms = time_cuda(run_reference, args.ref_iters, warmup=1)
        result["reference_ms"] = ms
        result["reference_gbps"] = gbps(nbytes, ms)
        print(f"torch reference:      {ms * 1e3:8.1f} us  {result['reference_gbps']:8.1f} GB/s")
        if "kernel_gbps" in result:
            result["ratio_kernel_over_reference"] = result["kernel_gbps"] / result["reference_gbps"]
            print(f"ratio kernel/reference bandwidth: {result['ratio_kernel_over_reference']:.1f}x")
    except Exception:
        result["errors"]["reference_timing"] = traceback.format_exc()[-2000:]
        traceback.print_exc()

    # 4. A stronger torch baseline: one gather of every page + fused SDPA (GQA).
    try:
        num_seqs, max_blocks = block_tables.shape

        def run_gather_sdpa():
            k = key_cache[block_tables.long()]  # [S, max_blocks, block_size, KVH, D]
            v = value_cache[block_tables.long()]
            k = k.view(num_seqs, max_blocks * args.block_size, args.num_kv_heads, args.head_dim)
            v = v.view(num_seqs, max_blocks * args.block_size, args.num_kv_heads, args.head_dim)
            q = query.unsqueeze(2)  # [S, H, 1, D]
            return torch.nn.functional.scaled_dot_product_attention(
                q, k.transpose(1, 2), v.transpose(1, 2), scale=scale, enable_gqa=True
            ).squeeze(2)  # all contexts are full length here, so no mask is needed

        ms = time_cuda(run_gather_sdpa, min(args.iters, 20), warmup=2)
        result["gather_sdpa_ms"] = ms
        result["gather_sdpa_gbps"] = gbps(nbytes, ms)
        print(f"torch gather+SDPA:    {ms * 1e3:8.1f} us  {result['gather_sdpa_gbps']:8.1f} GB/s "
              "(useful K/V bytes; it also writes and re-reads a dense copy)")
        if "kernel_gbps" in result:
            result["ratio_kernel_over_gather_sdpa"] = result["kernel_gbps"] / result["gather_sdpa_gbps"]
            print(f"ratio kernel/gather+SDPA: {result['ratio_kernel_over_gather_sdpa']:.2f}x")
    except Exception:
        result["errors"]["gather_sdpa"] = traceback.format_exc()[-2000:]
        print("gather+SDPA baseline failed (not fatal):", traceback.format_exc().splitlines()[-1])

    # 5. Launch-config sweep of the decode kernel.
    if not args.no_sweep:
        sweep = []
        for block_n in (32, 64, 128):
            for num_warps in (4, 8):
                for num_stages in (2, 3):
                    cfg = dict(block_n=block_n, num_warps=num_warps, num_stages=num_stages)
                    try:
                        ms = time_cuda(lambda: run_kernel(**cfg), max(10, args.iters // 2), warmup=3)
                        sweep.append({**cfg, "ms": ms, "gbps": gbps(nbytes, ms)})
                    except Exception as exc:  # e.g. out of shared memory for a config
                        sweep.append({**cfg, "error": repr(exc)[:300]})
        result["sweep"] = sweep
        timed = [s for s in sweep if "gbps" in s]
        if timed:
            best = max(timed, key=lambda s: s["gbps"])
            result["sweep_best"] = best
            print("sweep (block_n, num_warps, num_stages -> GB/s): " + ", ".join(
                f"{s['block_n']}/{s['num_warps']}/{s['num_stages']}->{s['gbps']:.0f}"
                for s in timed))
            print(f"best config: {best}")

    # 6. Split-KV path: a batch too small to fill the GPU (4 seqs x 8 KV heads programs).
    try:
        small = build_decode_batch(4, 8192, args.num_heads, args.num_kv_heads, args.head_dim,
                                   args.block_size, dtype, seed=1)
        sq, sk, sv, sbt, ssl = small
        s_qsl = torch.arange(5, dtype=torch.int32, device="cuda")
        s_ref = paged_attention(sq, sk, sv, sbt, ssl, s_qsl, scale)
        s_bytes = decode_bytes(sq, sk, sbt, ssl)
        entry = {}
        for label, splits in (("one_split", 1), ("auto_splits", None)):
            fn = lambda splits=splits: paged_decode_attention(  # noqa: E731
                sq, sk, sv, sbt, ssl, scale, max_seq_len=8192, num_splits=splits)
            diff = (fn().float() - s_ref.float()).abs().max().item()
            ms = time_cuda(fn, args.iters, warmup=3)
            entry[label] = {"ms": ms, "gbps": gbps(s_bytes, ms), "max_abs_diff": diff}
            print(f"small batch (4 seqs x 8192 ctx, {sbt.shape[1]} pages) {label}: {ms * 1e3:.1f} us "
                  f"{gbps(s_bytes, ms):.0f} GB/s, max diff {diff:.3g}")
            if not diff <= TOLERANCE[dtype]:
                ok = False
        result["small_batch_split_kv"] = entry
        del small, s_ref
    except Exception:
        ok = False
        result["errors"]["split_kv"] = traceback.format_exc()[-2000:]
        traceback.print_exc()

    # 7. Prefill kernel correctness on a ragged mixed batch (GPU compile + run check).
    try:
        from sluice.kernels.triton_paged_prefill import paged_prefill_attention

        batch = [(1, 1), (300, 300), (777, 129), (4096, 1), (33, 17), (2048, 512)]
        g = torch.Generator(device="cuda").manual_seed(2)
        bs = args.block_size
        blocks = [math.ceil(s / bs) for s, _ in batch]
        nb = sum(blocks) + 4
        perm = torch.randperm(nb, generator=g, device="cuda").to(torch.int32)
        bt = torch.zeros(len(batch), max(blocks), dtype=torch.int32, device="cuda")
        i = 0
        for row, n in enumerate(blocks):
            bt[row, :n] = perm[i : i + n]
            i += n
        shape = (nb, bs, args.num_kv_heads, args.head_dim)
        pk = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
        pv = torch.randn(shape, generator=g, device="cuda", dtype=dtype)
        q_lens = [q for _, q in batch]
        pq = torch.randn(sum(q_lens), args.num_heads, args.head_dim, generator=g, device="cuda",
                         dtype=dtype)
        p_qsl = torch.tensor([0, *q_lens], device="cuda").cumsum(0).to(torch.int32)
        p_sl = torch.tensor([s for s, _ in batch], dtype=torch.int32, device="cuda")
        p_ref = paged_attention(pq, pk, pv, bt, p_sl, p_qsl, scale)
        p_out = paged_prefill_attention(pq, pk, pv, bt, p_sl, p_qsl, max(q_lens), scale)
        diff = (p_out.float() - p_ref.float()).abs().max().item()
        ms = time_cuda(lambda: paged_prefill_attention(pq, pk, pv, bt, p_sl, p_qsl, max(q_lens),
                                                       scale), 20, warmup=2)
        result["prefill_check"] = {"max_abs_diff": diff, "ms": ms,
                                   "ok": bool(diff <= TOLERANCE[dtype])}
        print(f"prefill kernel (mixed ragged batch): max diff {diff:.3g}, {ms * 1e3:.1f} us")
        ok = ok and diff <= TOLERANCE[dtype]
    except Exception:
        ok = False
        result["errors"]["prefill"] = traceback.format_exc()[-2000:]
        traceback.print_exc()

    result["ok"] = bool(ok) and "kernel_gbps" in result
    result["wall_s"] = round(time.time() - t_start, 1)
    if not result["errors"]:
        del result["errors"]
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
