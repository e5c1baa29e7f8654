"""`sluice sim` (also `sluice-sim`): a workload on a fleet, simulated.

    sluice sim --model llama-3-70b --gpu h200 --tp 8 --replicas 1 \\
               --workload seed-mix --rate 2 --duration-s 600 \\
               [--policy sluice | --compare] [--seed 0] [--json out.json]
    sluice sim plan ...        the smallest fleet meeting SLOs (sluice.sim.plan_cli; also `sluice plan`)
    sluice sim calibrate ...   fit the cost model to this machine (sluice.sim.calibrate_cli)
    sluice sim disagg ...      disaggregated prefill/decode pools vs co-located (sluice.sim.disagg_cli)

`--model` is a preset (llama-3-70b, llama-3-8b, tiny-llama) or a Hugging
Face config.json (or its directory); `--gpu` a preset (h100, h200, cpu);
`--workload` `seed-mix` (200-token chats beside 32K documents) or a trace
CSV (arrival timestamp, prompt tokens, output tokens), where `--rate` is a
scale factor (2 = twice as fast) instead of requests per second.
`--compare` runs every policy (sluice, fcfs-no-chunk, chunked-unfair,
no-kv-admission) on the same requests and prints them side by side.

Prints TTFT / ITL / e2e percentiles by class, goodput (requests per second
that met both their TTFT and TPOT targets), output tokens per second,
rejections by reason, KV occupancy and cost per million tokens; `--json`
writes the same as a document: per policy, overall and per class,
`ttft_s`, `itl_s`, `e2e_s` ({p50, p90, p99}), `goodput_rps`,
`output_tokens_per_s`, `rejections`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from sluice.sim.calibrate import load_calibration
from sluice.sim.cost_model import CostModel
from sluice.sim.hardware import HARDWARE, hardware_by_name
from sluice.sim.model_spec import MODELS, model_by_name_or_path
from sluice.sim.policies import POLICIES, build_policy, cpu_engine_config, gpu_engine_config, slo_placement
from sluice.sim.results import class_slos, summarize
from sluice.sim.simulator import FleetSpec, Simulation
from sluice.sim.trace import workload_requests


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3-70b", help=f"preset ({', '.join(MODELS)}) or config.json path")
    parser.add_argument("--gpu", default="h200", help=f"hardware preset ({', '.join(HARDWARE)})")
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel degree of one replica")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--dtype", default="bf16", help="weights and KV dtype (bf16, fp16, fp8, fp32)")
    parser.add_argument("--workload", default="seed-mix", help="seed-mix, or a trace CSV path")
    parser.add_argument("--rate", type=float, default=1.0,
                        help="requests per second (seed-mix), or a rate scale factor (trace)")
    parser.add_argument("--burst-factor", type=float, default=1.0, help="seed-mix arrivals: gamma CV^2 (1 = Poisson)")
    parser.add_argument("--duration-s", type=float, default=600.0, help="arrivals over this long")
    parser.add_argument("--policy", default="sluice", choices=POLICIES)
    parser.add_argument("--compare", action="store_true", help="every policy, side by side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ttft-slo-s", type=float, default=2.0, help="interactive TTFT target (admission and goodput)")
    parser.add_argument("--tpot-slo-s", type=float, default=0.1, help="interactive time per output token target")
    parser.add_argument("--ttft-slo-per-1k-tokens-s", type=float, default=0.0,
                        help="added to the goodput TTFT target per 1,000 prompt tokens (a long prompt's own prefill)")
    parser.add_argument("--max-itl-slo-s", type=float, default=0.0,
                        help="longest gap between two tokens an interactive request may see (0 = no bound)")
    parser.add_argument("--batch-ttft-slo-s", type=float, default=600.0)
    parser.add_argument("--gpu-hour-price", type=float, default=None,
                        help="price of one GPU-hour (default: the preset's)")
    parser.add_argument("--calibration", type=Path, default=None,
                        help="a `sluice sim calibrate` file: its hardware and efficiencies replace --gpu's preset")
    parser.add_argument("--kv-blocks", type=int, default=0,
                        help="KV blocks per replica (the replica's SLUICE_KV_CACHE_BLOCKS); 0 = from memory")
    parser.add_argument("--json", type=Path, default=None, help="write the results document here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


# Subcommands with flags of their own: each module's main(argv).
SUBCOMMANDS = {
    "plan": "sluice.sim.plan_cli", "calibrate": "sluice.sim.calibrate_cli", "disagg": "sluice.sim.disagg_cli",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        document = run(args)
    except ValueError as error:
        print(f"sluice sim: {error}", file=sys.stderr)
        return 2
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> dict:
    model = model_by_name_or_path(args.model)
    if args.calibration is not None:
        hardware, efficiency = load_calibration(args.calibration)
        cost = CostModel(hardware, model, tp=args.tp, dtype=args.dtype, efficiency=efficiency)
    else:
        hardware = hardware_by_name(args.gpu)
        cost = CostModel(hardware, model, tp=args.tp, dtype=args.dtype)
    block_size = 16
    kv_blocks = args.kv_blocks or cost.kv_capacity_blocks(block_size)
    requests = _requests(args)
    if not requests:
        raise ValueError("the workload has no requests in that duration")
    if args.ttft_slo_per_1k_tokens_s < 0 or args.max_itl_slo_s < 0:
        raise ValueError("--ttft-slo-per-1k-tokens-s and --max-itl-slo-s must be >= 0")
    placement = slo_placement(args.ttft_slo_s, args.batch_ttft_slo_s)
    engine = cpu_engine_config(model) if hardware.name.startswith("cpu") else gpu_engine_config(model)
    slos = class_slos(args.ttft_slo_s, args.tpot_slo_s, args.batch_ttft_slo_s,
                      ttft_per_1k_prompt_tokens_s=args.ttft_slo_per_1k_tokens_s, max_itl_s=args.max_itl_slo_s)
    price = hardware.price_per_hour if args.gpu_hour_price is None else args.gpu_hour_price
    fleet_price = price * args.tp * args.replicas
    names = POLICIES if args.compare else (args.policy,)
    print(f"{len(requests)} requests over {requests[-1].arrival_s:.0f}s; {args.replicas} x {model.name} on "
          f"{args.tp} x {hardware.name} ({kv_blocks * block_size:,} KV tokens per replica)", file=sys.stderr)
    results = {}
    for name in names:
        policy = build_policy(name, engine, placement)
        fleet = FleetSpec(args.replicas, kv_blocks, policy, model_version=model.name, block_size_tokens=block_size,
                          max_context_tokens=model.max_context_tokens, step_segments=model.num_layers + 1)
        progress = None if args.quiet else _progress(name, len(requests))
        outcome = Simulation(fleet, cost.step_time_s, requests, progress).run()
        results[name] = summarize(outcome, slos, fleet_price)
        _print(name, results[name])
    document = {
        "config": {
            "model": model.name, "gpu": hardware.name, "tp": args.tp, "replicas": args.replicas, "dtype": args.dtype,
            "workload": args.workload, "rate": args.rate, "duration_s": args.duration_s, "seed": args.seed,
            "kv_blocks_per_replica": kv_blocks, "ttft_slo_s": args.ttft_slo_s, "tpot_slo_s": args.tpot_slo_s,
            "ttft_slo_per_1k_tokens_s": args.ttft_slo_per_1k_tokens_s, "max_itl_slo_s": args.max_itl_slo_s,
            "gpu_hour_price": price,
        },
        **results[names[0]],
        "policies": results,
    }
    if args.compare:
        base = results["fcfs-no-chunk"]["by_class"].get("interactive", {}).get("goodput_rps") or 0.0
        ours = results["sluice"]["by_class"].get("interactive", {}).get("goodput_rps") or 0.0
        ratio = ours / base if base else float("inf")
        document["interactive_goodput_vs_fcfs_no_chunk"] = ratio
        print(f"interactive goodput, sluice / fcfs-no-chunk: {ratio:.2f}x")
    return document


def _requests(args: argparse.Namespace):
    return workload_requests(args.workload, args.rate, args.duration_s, args.seed, args.burst_factor)[0]


def _progress(name: str, total: int):
    def report(now_s: float, arrived: int) -> None:
        print(f"  {name}: {now_s:.0f}s simulated, {arrived}/{total} arrived", file=sys.stderr)
    return report


def _fmt(stats: dict) -> str:
    return " / ".join("-" if stats.get(p) is None else f"{stats[p] * 1000:.0f}" for p in ("p50", "p90", "p99"))


def _print(name: str, summary: dict) -> None:
    print(f"== {name}  (simulated in {summary['wall_s']:.1f}s)")
    print(f"   {'class':<12} {'reqs':>6} {'done':>6} {'TTFT ms p50/p90/p99':>22} {'ITL ms p50/p90/p99':>20} "
          f"{'e2e ms p50/p90/p99':>24} {'goodput/s':>10} {'out tok/s':>10}  rejections")
    for label, block in [("overall", summary["overall"]), *summary["by_class"].items()]:
        rejections = ", ".join(f"{k} {v}" for k, v in block["rejections"].items()) or "-"
        print(f"   {label:<12} {block['requests']:>6} {block['finished']:>6} {_fmt(block['ttft_s']):>22} "
              f"{_fmt(block['itl_s']):>20} {_fmt(block['e2e_s']):>24} {block['goodput_rps']:>10.2f} "
              f"{block['output_tokens_per_s']:>10.0f}  {rejections}")
    occupancy, cost = summary["kv_occupancy"], summary["cost"]
    per_m = cost["per_million_output_tokens"]
    print(f"   KV occupancy mean {occupancy['mean'] or 0:.0%}, p99 {occupancy['p99'] or 0:.0%};  "
          f"cost per million output tokens {'-' if per_m is None else f'{per_m:.3f}'}")


if __name__ == "__main__":
    sys.exit(main())
