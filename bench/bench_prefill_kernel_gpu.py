"""Achieved TFLOP/s of the Triton paged prefill kernel on long chunks, and its launch configs.

CUDA only: on a machine without a GPU it prints why and exits 0 (so
``make bench`` stays green on CPU boxes). ``--device cpu --tiny`` with
TRITON_INTERPRET=1 runs the same code on a tiny shape, to try the script.

bench_sim_gpu_fidelity.py found an 8,192-token chunk after 16K cached tokens
of a Llama-3-8B shape 32% slower than the cost model's roofline at the
preset's efficiency, the gap growing with depth: the prefill kernel's
attention. This times that kernel alone on a Llama-3-8B attention shape
(32 query heads, 8 KV heads, head_dim 128, bf16, 16-token pages scattered
over the cache):

    long     one 8,192-token chunk after 8,192 cached tokens
    burst    four 2,048-token prompts from the start (a mixed batch)

Attention FLOPs: 4 x heads x head_dim x attended pairs (causal; a chunk of
n after c cached attends n x c + n (n + 1) / 2 pairs). Every launch config
of a small sweep (block_m x block_n x num_warps x num_stages) is checked
against torch SDPA on the gathered context before it is timed. The last
line of output is one JSON object with every result.

    python bench/bench_prefill_kernel_gpu.py [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
import traceback
from pathlib import Path

import torch
from bench_decode_kernel_gpu import time_cuda

ROOT = Path(__file__).resolve().parents[1]
try:
    import sluice.kernels  # noqa: F401
except ImportError:  # not pip-installed here (the GPU machine): use the checkout
    sys.path.insert(0, str(ROOT / "libs" / "kernels" / "src"))

H200_PEAK_TFLOPS = 989.0  # dense bf16
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 4e-3, torch.float32: 1e-4}
# The wrapper's defaults (the sweep's winner on an H200; 64/64/4/2 before).
DEFAULT = {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 3}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="fewer configs")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--tiny", action="store_true", help="tiny shapes (the interpreter on a CPU)")
    return p.parse_args()


def time_ms(fn, iters: int, device: torch.device) -> float:
    """Median milliseconds of ``fn()``: CUDA events on a GPU, the wall clock elsewhere."""
    if device.type == "cuda":
        return time_cuda(fn, iters, warmup=1)
    fn()
    started = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - started) / iters * 1e3


def build(chunks, heads, kv_heads, head_dim, block_size, dtype, device, seed=0):
    """A paged cache holding each sequence's context in shuffled pages, and
    the query rows of each chunk: chunks = [(context_before, new_tokens)]."""
    g = torch.Generator(device=device).manual_seed(seed)
    lens = [c + n for c, n in chunks]
    blocks = [math.ceil(s / block_size) for s in lens]
    num_blocks = sum(blocks) + 1
    perm = torch.randperm(num_blocks, generator=g, device=device).to(torch.int32)
    table = torch.zeros(len(chunks), max(blocks), dtype=torch.int32, device=device)
    at = 0
    for row, n in enumerate(blocks):
        table[row, :n] = perm[at:at + n]
        at += n
    shape = (num_blocks, block_size, kv_heads, head_dim)
    key_cache = torch.randn(shape, generator=g, device=device, dtype=dtype)
    value_cache = torch.randn(shape, generator=g, device=device, dtype=dtype)
    q_lens = [n for _, n in chunks]
    query = torch.randn(sum(q_lens), heads, head_dim, generator=g, device=device, dtype=dtype)
    qsl = torch.tensor([0, *q_lens], device=device).cumsum(0).to(torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return query, key_cache, value_cache, table, seq_lens, qsl, max(q_lens)


def reference(query, key_cache, value_cache, table, seq_lens, qsl, scale):
    """SDPA per sequence over its gathered context (causal from its chunk's start)."""
    heads, kv_heads = query.shape[1], key_cache.shape[2]
    block_size = key_cache.shape[1]
    out = torch.empty_like(query)
    for i in range(seq_lens.shape[0]):
        length, start, end = int(seq_lens[i]), int(qsl[i]), int(qsl[i + 1])
        n = end - start
        pages = table[i, :math.ceil(length / block_size)].long()
        k = key_cache[pages].reshape(-1, kv_heads, key_cache.shape[3])[:length]  # [len, kv, D]
        v = value_cache[pages].reshape(-1, kv_heads, key_cache.shape[3])[:length]
        k = k.transpose(0, 1).repeat_interleave(heads // kv_heads, 0)  # [H, len, D]
        v = v.transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        q = query[start:end].transpose(0, 1)  # [H, n, D]
        positions = torch.arange(length - n, length, device=query.device)
        mask = torch.arange(length, device=query.device)[None, :] <= positions[:, None]  # [n, len]
        o = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                             scale=scale)
        out[start:end] = o.transpose(0, 1).to(query.dtype)
    return out


def attention_flops(chunks, heads, head_dim) -> float:
    return sum(4.0 * heads * head_dim * (n * c + n * (n + 1) / 2) for c, n in chunks)


def main() -> int:
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_prefill_kernel_gpu: CUDA is not available; this benchmark needs a GPU. Skipping.")
        print(json.dumps({"bench": "prefill_kernel_gpu", "skipped": "no CUDA device"}))
        return 0
    from sluice.kernels.triton_paged_prefill import paged_prefill_attention

    heads, kv_heads, head_dim, block_size, dtype = 32, 8, 128, 16, torch.bfloat16
    shapes = {"long": [(8192, 8192)], "burst": [(0, 2048)] * 4}
    if args.tiny:
        heads, kv_heads, head_dim, dtype = 4, 2, 32, torch.float32
        shapes = {"long": [(48, 40)], "burst": [(0, 24)] * 2}
    configs = [dict(zip(DEFAULT, values)) for values in itertools.product(
        (64, 128), (32, 64, 128), (4, 8), (2, 3) if args.quick else (2, 3, 4))]
    if args.tiny:
        configs = [DEFAULT, {"block_m": 32, "block_n": 16, "num_warps": 4, "num_stages": 2}]
    scale = head_dim**-0.5
    result: dict = {"bench": "prefill_kernel_gpu", "device": str(device), "shapes": {}, "errors": {}}
    if device.type == "cuda":
        result["device"] = torch.cuda.get_device_name()
    print(f"{result['device']}: {heads}/{kv_heads} heads, head_dim {head_dim}, {dtype}, pages of {block_size}")
    t_start = time.time()
    for name, chunks in shapes.items():
        try:
            query, kc, vc, table, seq_lens, qsl, max_q = build(chunks, heads, kv_heads, head_dim, block_size, dtype,
                                                               device)
            expected = reference(query, kc, vc, table, seq_lens, qsl, scale)
            flops = attention_flops(chunks, heads, head_dim)
            rows = []
            for config in configs:
                try:
                    def run(config=config):
                        return paged_prefill_attention(query, kc, vc, table, seq_lens, qsl, max_q, scale, **config)
                    diff = (run().float() - expected.float()).abs().max().item()
                    ms = time_ms(run, args.iters, device)
                    rows.append({**config, "ms": ms, "tflops": flops / ms / 1e9, "max_abs_diff": diff,
                                 "ok": diff <= TOLERANCE[dtype]})
                except Exception as error:  # a config the compiler refuses (shared memory): skip it
                    rows.append({**config, "error": repr(error)[:200]})
            timed = [r for r in rows if r.get("ok")]
            default = next((r for r in rows if all(r[k] == v for k, v in DEFAULT.items())), None)
            best = min(timed, key=lambda r: r["ms"]) if timed else None
            result["shapes"][name] = {"chunks": chunks, "flops": flops, "configs": rows, "default": default,
                                      "best": best}
            print(f"{name}: {chunks[0][1]:,}-token chunk x {len(chunks)} after {chunks[0][0]:,} cached, "
                  f"{flops / 1e12:.2f} TFLOP")
            for r in rows:
                if "error" in r:
                    print(f"  {r['block_m']}/{r['block_n']}/{r['num_warps']}w/{r['num_stages']}s: {r['error']}")
                else:
                    print(f"  {r['block_m']}/{r['block_n']}/{r['num_warps']}w/{r['num_stages']}s: {r['ms']:.3f} ms "
                          f"{r['tflops']:.0f} TFLOP/s, max diff {r['max_abs_diff']:.3g}{'' if r['ok'] else ' WRONG'}")
            if default and best and "ms" in default:
                print(f"  default {default['tflops']:.0f} TFLOP/s; best {best['block_m']}/{best['block_n']}/"
                      f"{best['num_warps']}w/{best['num_stages']}s {best['tflops']:.0f} TFLOP/s "
                      f"({default['ms'] / best['ms']:.2f}x the default; {best['tflops'] / H200_PEAK_TFLOPS:.0%} of "
                      f"an H200's dense bf16 peak)")
            del query, kc, vc, expected
        except Exception:
            result["errors"][name] = traceback.format_exc()[-2000:]
            traceback.print_exc()
    result["wall_s"] = round(time.time() - t_start, 1)
    if not result["errors"]:
        del result["errors"]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
