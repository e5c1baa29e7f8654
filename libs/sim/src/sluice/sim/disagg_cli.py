"""`sluice sim disagg`: co-located against disaggregated prefill/decode pools.

    sluice sim disagg --model llama-3-70b --gpu h200 --tp 8 \\
                      --prefill-replicas 2 --decode-replicas 2 \\
                      --workload seed-mix --rate 4 --duration-s 300 [--seed 0] \\
                      [--transfer-gbps 50] [--json out.json]

Runs the same requests on P prefill + D decode replicas (the prompt's KV
carried over a link: prompt tokens x KV bytes per token / (bandwidth x
efficiency), one transfer at a time per prefill replica) and on P + D
co-located replicas of the same tensor-parallel degree, so both cost the
same per hour. Prints each side's interactive goodput, TTFT and ITL
p50/p99, output tokens per second and cost per million output tokens, and
which wins on interactive goodput and by how much. The link defaults to
the GPU's (NVLink within a node); `--transfer-gbps 50` models cross-node
RDMA (GB/s).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from sluice.sim.cost_model import CostModel
from sluice.sim.disaggregated import DisaggregatedSimulation, DisaggregatedSpec, KvLink
from sluice.sim.hardware import HARDWARE, hardware_by_name
from sluice.sim.model_spec import MODELS, model_by_name_or_path
from sluice.sim.policies import POLICIES, build_policy, gpu_engine_config, slo_placement
from sluice.sim.results import class_slos, summarize
from sluice.sim.simulator import FleetSpec, Simulation
from sluice.sim.trace import workload_requests

BLOCK_SIZE_TOKENS = 16


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice sim disagg", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3-70b", help=f"preset ({', '.join(MODELS)}) or config.json path")
    parser.add_argument("--gpu", default="h200", help=f"hardware preset ({', '.join(HARDWARE)})")
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel degree of every replica")
    parser.add_argument("--prefill-replicas", type=int, default=2)
    parser.add_argument("--decode-replicas", type=int, default=2)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--workload", default="seed-mix", help="seed-mix, or a trace CSV path")
    parser.add_argument("--rate", type=float, default=1.0,
                        help="requests per second (seed-mix), or a rate scale factor (trace)")
    parser.add_argument("--burst-factor", type=float, default=1.0, help="seed-mix arrivals: gamma CV^2 (1 = Poisson)")
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default="sluice", choices=POLICIES)
    parser.add_argument("--transfer-gbps", type=float, default=None,
                        help="KV link, GB/s per prefill replica (default: the GPU's link; ~50 for cross-node RDMA)")
    parser.add_argument("--link-efficiency", type=float, default=0.7, help="share of the link rate a transfer reaches")
    parser.add_argument("--ttft-slo-s", type=float, default=2.0)
    parser.add_argument("--tpot-slo-s", type=float, default=0.1)
    parser.add_argument("--batch-ttft-slo-s", type=float, default=600.0)
    parser.add_argument("--gpu-hour-price", type=float, default=None, help="one GPU-hour (default: the preset's)")
    parser.add_argument("--json", type=Path, default=None, help="write both documents and the verdict here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        document = run(args)
    except ValueError as error:
        print(f"sluice sim disagg: {error}", file=sys.stderr)
        return 2
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> dict:
    if args.prefill_replicas < 1 or args.decode_replicas < 1:
        raise ValueError("each pool needs at least one replica")
    model = model_by_name_or_path(args.model)
    hardware = hardware_by_name(args.gpu)
    cost = CostModel(hardware, model, tp=args.tp, dtype=args.dtype)
    requests, _ = workload_requests(args.workload, args.rate, args.duration_s, args.seed, args.burst_factor)
    if not requests:
        raise ValueError("the workload has no requests in that duration")
    policy = build_policy(args.policy, gpu_engine_config(model), slo_placement(args.ttft_slo_s, args.batch_ttft_slo_s))
    slos = class_slos(args.ttft_slo_s, args.tpot_slo_s, args.batch_ttft_slo_s)
    kv_blocks = cost.kv_capacity_blocks(BLOCK_SIZE_TOKENS)
    total = args.prefill_replicas + args.decode_replicas
    price = hardware.price_per_hour if args.gpu_hour_price is None else args.gpu_hour_price
    fleet_price = price * args.tp * total  # the same GPUs either way

    def fleet(num_replicas: int) -> FleetSpec:
        return FleetSpec(num_replicas, kv_blocks, policy, model_version=model.name,
                         block_size_tokens=BLOCK_SIZE_TOKENS, max_context_tokens=model.max_context_tokens)

    bandwidth = hardware.link_bandwidth_bytes_per_s if args.transfer_gbps is None else args.transfer_gbps * 1e9
    link = KvLink(model.kv_bytes_per_token(args.dtype), bandwidth, args.link_efficiency)
    print(f"{len(requests)} requests over {requests[-1].arrival_s:.0f}s; {model.name} on {args.tp} x {hardware.name} "
          f"a replica; co-located {total} vs {args.prefill_replicas}P + {args.decode_replicas}D, "
          f"KV link {bandwidth / 1e9:.0f} GB/s", file=sys.stderr)
    colocated = summarize(Simulation(fleet(total), cost.step_time_s, requests).run(), slos, fleet_price)
    simulation = DisaggregatedSimulation(
        DisaggregatedSpec(fleet(args.prefill_replicas), fleet(args.decode_replicas), link), cost.step_time_s, requests)
    disaggregated = summarize(simulation.run(), slos, fleet_price)
    transfers = list(simulation.transfers.values())
    disaggregated["kv_transfer"] = {
        "transfers": len(transfers),
        "transfer_s_mean": sum(t.transfer_s for t in transfers) / len(transfers) if transfers else None,
        "queue_s_max": max((t.queue_s for t in transfers), default=None),
    }
    verdict = compare(colocated, disaggregated)
    print_side_by_side(colocated, disaggregated, verdict)
    return {
        "config": {
            "model": model.name, "gpu": hardware.name, "tp": args.tp, "prefill_replicas": args.prefill_replicas,
            "decode_replicas": args.decode_replicas, "workload": args.workload, "rate": args.rate,
            "duration_s": args.duration_s, "seed": args.seed, "policy": args.policy,
            "transfer_bandwidth_bytes_per_s": bandwidth, "link_efficiency": args.link_efficiency,
            "gpu_hour_price": price,
        },
        "colocated": colocated,
        "disaggregated": disaggregated,
        "verdict": verdict,
    }


def interactive_goodput_rps(summary: dict) -> float:
    return summary["by_class"].get("interactive", {}).get("goodput_rps") or 0.0


def compare(colocated: dict, disaggregated: dict) -> dict:
    """Which deployment serves more interactive requests within their SLOs,
    and by how much (the ratio of the winner's goodput to the loser's)."""
    ours, theirs = interactive_goodput_rps(disaggregated), interactive_goodput_rps(colocated)
    if ours == theirs:
        return {"winner": "tie", "goodput_ratio": 1.0}
    winner, high, low = ("disaggregated", ours, theirs) if ours > theirs else ("colocated", theirs, ours)
    return {"winner": winner, "goodput_ratio": high / low if low else float("inf")}


def _ms(stats: dict, point: str) -> str:
    value = stats.get(point)
    return "-" if value is None else f"{value * 1000:.0f}"


def print_side_by_side(colocated: dict, disaggregated: dict, verdict: dict) -> None:
    print(f"   {'':<15} {'goodput/s':>10} {'TTFT ms p50/p99':>16} {'ITL ms p50/p99':>15} {'out tok/s':>10} "
          f"{'$/M out':>9}  rejections")
    for name, summary in (("co-located", colocated), ("disaggregated", disaggregated)):
        block = summary["by_class"].get("interactive") or summary["overall"]
        ttft, itl = block["ttft_s"], block["itl_s"]
        per_m = summary["cost"]["per_million_output_tokens"]
        rejections = ", ".join(f"{k} {v}" for k, v in summary["overall"]["rejections"].items()) or "-"
        print(f"   {name:<15} {block['goodput_rps']:>10.2f} {_ms(ttft, 'p50') + ' / ' + _ms(ttft, 'p99'):>16} "
              f"{_ms(itl, 'p50') + ' / ' + _ms(itl, 'p99'):>15} {summary['overall']['output_tokens_per_s']:>10.0f} "
              f"{'-' if per_m is None else f'{per_m:.2f}':>9}  {rejections}")
    if verdict["winner"] == "tie":
        print("   interactive goodput: a tie")
    else:
        ratio = verdict["goodput_ratio"]
        print(f"   {verdict['winner']} wins on interactive goodput by {ratio:.3f}x ({(ratio - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    sys.exit(main())
