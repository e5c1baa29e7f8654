"""Which build of each native CPU kernel runs, measured on this machine.

The attention kernel is built once per instruction set (AVX-512, AVX2, the
baseline) and the int8 LM head has a path per instruction set and
activation width; each starts on the widest this CPU runs within the cap
(sluice.kernels.cpu_isa). Wider is usually faster but not everywhere: some
Xeons lower their clock for 512-bit work, a decode's attention waits on
memory whatever the width, and AVX-VNNI on ymm can beat AVX-512 VNNI where
the latter costs frequency. `probe_kernels` times every build the CPU runs,
on the model's own shapes (a decode step of DECODE_SEQS sequences at
DECODE_CONTEXT tokens; a greedy step's rows through an LM head of the
model's size), and `choose_kernels` keeps the widest unless another was
faster by more than NARROWER_BY: a probe at a busy start is noisy, and the
widest is the right default. The timings are cached per machine beside the
linear probe's (cpu_fast_path), so a restart reads them.

    load_llama ─▶ finish_for_device: choose_kernels(config, cache) ─▶ apply_kernel_choice
                                     then choose_linears (its int8 screen timed on the chosen path)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from sluice.kernels import cpu_isa, int8_head, paged_attention_native
from sluice.model.config import LlamaConfig
from sluice.model.cpu_fast_path import PROBE_ROWS, best_times, cached_timings, machine_key
from sluice.model.greedy_head import MAX_CANDIDATES
from sluice.model.kv_cache import interleaved_kv

log = logging.getLogger(__name__)

DECODE_SEQS = 64
DECODE_CONTEXT = 256
BLOCK_SIZE = 16
# A narrower build must beat the widest by more than this to be chosen.
NARROWER_BY = 0.10
# The attention probe's caches stay under this, whatever the model's heads.
MAX_PROBE_CACHE_BYTES = 64 << 20
TRIALS = 3
MIN_TIME_S = 0.01

ATTENTION = "attention"
INT8_HEAD = "int8_head"


@dataclass(frozen=True, slots=True)
class KernelChoice:
    attention: str | None  # the attention kernel's variant; None: leave it
    int8_head: tuple[int, int] | None  # (instruction set, bits); None: the widest


def probe_kernels(config: LlamaConfig) -> dict[str, dict[str, float]]:
    """Seconds per call of each build: {"attention": {variant: s}, "int8_head": {"avx2-7bit": s, ...}},
    each only where the kernel is built and more than one build runs here."""
    timings: dict[str, dict[str, float]] = {}
    variants = cpu_isa.attention_variants()
    if len(variants) > 1:
        timings[ATTENTION] = _time_attention(config, variants)
    # The scalar path is the fallback for CPUs without a vector one, never faster.
    pairs = [pair for pair in int8_head.allowed_isas() if pair[0] != int8_head.ISA_SCALAR] \
        if int8_head.int8_head_available() else []
    if len(pairs) > 1:
        timings[INT8_HEAD] = _time_int8_head(config, pairs)
    return timings


def _time_attention(config: LlamaConfig, variants: list[str]) -> dict[str, float]:
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    per_seq_bytes = 2 * DECODE_CONTEXT * kv_heads * head_dim * 4
    seqs = max(1, min(DECODE_SEQS, MAX_PROBE_CACHE_BYTES // per_seq_bytes))
    blocks_per_seq = DECODE_CONTEXT // BLOCK_SIZE
    generator = torch.Generator().manual_seed(0)
    keys, values = interleaved_kv(seqs * blocks_per_seq, BLOCK_SIZE, kv_heads, head_dim, torch.float32, "cpu")
    keys.copy_(torch.randn(keys.shape, generator=generator))
    values.copy_(torch.randn(values.shape, generator=generator))
    query = torch.randn(seqs, heads, head_dim, generator=generator)
    block_tables = torch.randperm(seqs * blocks_per_seq, generator=generator, dtype=torch.int32).view(seqs, -1)
    seq_lens = torch.full((seqs,), DECODE_CONTEXT, dtype=torch.int32)
    starts = torch.arange(seqs + 1, dtype=torch.int32)
    out = torch.empty_like(query)
    scale = head_dim ** -0.5

    def decode() -> None:
        paged_attention_native.paged_attention_native(query, keys, values, block_tables, seq_lens, starts, scale,
                                                      out=out)

    chosen = paged_attention_native.variant()
    timings: dict[str, float] = {}
    try:
        for variant in variants:
            paged_attention_native.set_variant(variant)
            timings[variant] = best_times({variant: decode}, TRIALS, MIN_TIME_S)[variant]
    finally:
        paged_attention_native.set_variant(chosen)
    return timings


def _time_int8_head(config: LlamaConfig, pairs: list[tuple[int, int]]) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(config.vocab_size, config.hidden_size, generator=generator) * 0.02
    x = torch.randn(PROBE_ROWS, config.hidden_size, generator=generator)
    normed = x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True))  # as a final RMSNorm leaves them
    head = int8_head.pack_int8_head(weight)
    calls = {int8_head.isa_label(pair): (lambda pair=pair: int8_head.int8_screened_argmax(
        normed, head, weight, MAX_CANDIDATES, isa=pair)) for pair in pairs}
    return best_times(calls, TRIALS, MIN_TIME_S)


def choose_kernels(timings: dict[str, dict[str, float]]) -> KernelChoice:
    """The widest build of each kernel, unless another beat it by more than NARROWER_BY."""
    variants = cpu_isa.attention_variants()
    attention = _pick(timings.get(ATTENTION, {}), variants[0] if variants else None)
    pairs = {int8_head.isa_label(pair): pair for pair in int8_head.allowed_isas()} \
        if int8_head.int8_head_available() else {}
    widest = int8_head.isa_label(max(pairs.values())) if pairs else None
    int8 = _pick(timings.get(INT8_HEAD, {}), widest)
    return KernelChoice(attention=attention, int8_head=pairs.get(int8))


def _pick(timing: dict[str, float], widest: str | None) -> str | None:
    if widest is None or widest not in timing:
        return widest
    fastest = min(timing, key=timing.__getitem__)
    return fastest if timing[fastest] < (1 - NARROWER_BY) * timing[widest] else widest


def apply_kernel_choice(choice: KernelChoice) -> None:
    if choice.attention is not None:
        paged_attention_native.set_variant(choice.attention)
    if choice.int8_head is not None:
        int8_head.prefer_isa(choice.int8_head)


def choose_and_apply_kernels(config: LlamaConfig, cache_dir: Path | None) -> KernelChoice:
    """Measure (or read this machine's cached measurement) and run the chosen builds."""
    facts = [f"kernel-probe heads={config.num_attention_heads}/{config.num_key_value_heads}x{config.head_dim}",
             f"head={config.vocab_size}x{config.hidden_size}", f"context={DECODE_CONTEXT}"]
    path = cache_dir / f"cpu-kernel-probe-{machine_key([], facts)}.json" if cache_dir else None

    def measure() -> dict[str, dict[str, float]]:
        started = time.perf_counter()
        timings = probe_kernels(config)
        log.info("probed CPU kernel builds in %.2f s: %s", time.perf_counter() - started,
                 "; ".join(f"{kernel} " + ", ".join(f"{name} {seconds * 1e3:.3f} ms" for name, seconds in t.items())
                           for kernel, t in timings.items()) or "one build each")
        return timings

    choice = choose_kernels(cached_timings(path, measure, required=()))
    apply_kernel_choice(choice)
    log.info("native CPU kernels, as measured: %s", cpu_isa.describe())
    return choice
