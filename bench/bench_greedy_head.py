"""A greedy decode step's LM head: the full float32 head and its argmax
against each screen this CPU runs (bf16 where torch has bf16 kernels, int8
on each of the kernel's instruction sets), side by side in one process.

64 rows (a decode batch) over the tiny model's head, 32,000 x 256, on rows
normalised as a final RMSNorm leaves them; every screen's tokens are
checked against the exact (double) argmax before it is timed. Rounds
alternate the order of the variants; prints every round, each variant's
median, its ratio to the full head, the candidates the int8 screen leaves
a row, and the CPU it ran on. To see what a CPU without AVX-512 gets, hold
MKL and oneDNN to AVX2 (the int8 kernel's AVX2 path is timed anyway):

    .venv/bin/python bench/bench_greedy_head.py [--rounds N] [--threads N]
    MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python bench/bench_greedy_head.py
"""

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_harness import cpu_model  # noqa: E402

from sluice.kernels import int8_head  # noqa: E402
from sluice.kernels.argmax import argmax_rows  # noqa: E402
from sluice.kernels.int8_head import int8_head_scores, int8_screened_argmax, pack_int8_head  # noqa: E402
from sluice.model.cpu_linear import PackedLinear  # noqa: E402
from sluice.model.greedy_head import MAX_CANDIDATES, ScreenedHead, screen_available  # noqa: E402

ROWS, HIDDEN, VOCAB = 64, 256, 32000
MIN_TIME_S = 0.3


def ms_per_call(call: Callable[[], object]) -> float:
    call()
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < MIN_TIME_S or calls < 3:
        call()
        calls += 1
    return elapsed / calls * 1e3


def int8_call(head: ScreenedHead, hidden: torch.Tensor, isa: tuple[int, int]) -> Callable[[], torch.Tensor]:
    """The int8 screen on one instruction set (ScreenedHead's path, the
    one-pass int8_screened_argmax, with the set pinned)."""
    packed = pack_int8_head(head.weight.detach())

    def call() -> torch.Tensor:
        tokens = int8_screened_argmax(hidden, packed, head.weight.detach(), MAX_CANDIDATES, isa=isa)
        unresolved = (tokens < 0).nonzero().flatten()
        if unresolved.numel():
            tokens[unresolved] = argmax_rows(head(hidden[unresolved]))
        return tokens
    return call


def candidates_per_row(head: ScreenedHead, hidden: torch.Tensor, isa: tuple[int, int]) -> tuple[float, int]:
    packed = pack_int8_head(head.weight.detach())
    scores = torch.empty(hidden.shape[0], packed.padded_vocab)
    margins = int8_head_scores(hidden, packed, scores, isa=isa)
    s = scores[:, :VOCAB]
    count = (s >= s.max(dim=1, keepdim=True).values - 2 * margins[:, None]).sum(dim=1).float()
    return float(count.median()), int(count.max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(HIDDEN, VOCAB, bias=False).requires_grad_(False)
    linear.weight.copy_(torch.randn(VOCAB, HIDDEN, generator=generator) * 0.02)
    x = torch.randn(ROWS, HIDDEN, generator=generator)
    hidden = x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True))
    exact = (hidden.double() @ linear.weight.double().t()).argmax(dim=1)

    full = PackedLinear(linear)
    variants: dict[str, Callable[[], torch.Tensor]] = {"full": lambda: argmax_rows(full(hidden))}
    if screen_available("bf16"):
        variants["bf16"] = lambda bf16=ScreenedHead(linear, screen="bf16"): bf16.greedy_token_ids(hidden)
    int8 = ScreenedHead(linear, screen="int8")
    isas = [isa for isa in int8_head.supported_isas() if isa[0] != int8_head.ISA_SCALAR]
    for isa in isas:
        variants[f"int8-{int8_head.isa_label(isa)}"] = int8_call(int8, hidden, isa)

    print(f"CPU: {cpu_model()}; {args.threads} thread(s); {ROWS} rows x {VOCAB} x {HIDDEN}")
    with torch.inference_mode():
        for name, call in variants.items():
            agree = torch.equal(call(), exact)
            print(f"{name}: tokens {'match' if agree else 'DIFFER from'} the exact argmax")
        for isa in isas:
            median, most = candidates_per_row(int8, hidden, isa)
            print(f"int8-{int8_head.isa_label(isa)}: {median:.0f} candidates a row (median), at most {most}")
        timings: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                timings[name].append(ms_per_call(variants[name]))
            print(f"round {r + 1}: " + ", ".join(f"{name} {timings[name][-1]:.2f} ms" for name in names), flush=True)
    base = statistics.median(timings["full"])
    ratios = {}
    for name in names:
        median = statistics.median(timings[name])
        ratios[name] = round(base / median, 3)
        print(f"{name}: median {median:.2f} ms, {base / median:.2f}x the full head")
    print(json.dumps({"bench": "greedy_head", "cpu": cpu_model(), "threads": args.threads,
                      "speedup_vs_full": ratios, "ms": timings}))


if __name__ == "__main__":
    main()
