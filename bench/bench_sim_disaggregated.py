"""Simulated Llama-3-70B on H200, TP8 replicas: co-located against
disaggregated prefill/decode pools on the same requests and the same GPUs
(4 replicas: 4 co-located, or 1P+3D, 2P+2D, 3P+1D), the seed's mix of
200-token chats beside 32K-token documents (and a batch share), at two
loads up to near the co-located fleet's capacity.

The disaggregated side carries each prompt's KV from its prefill replica
to a decode replica over the GPU's link (NVLink, 450 GB/s at 70%
efficiency; one transfer at a time per prefill replica), and a client sees
the transfer and the decode queue in the gap before its second token. Step
times come from the uncalibrated first-principles cost model: the figures
are the deployments' relative merit on that hardware model.

Prints, per rate and deployment: interactive goodput (2 s TTFT, 100 ms
TPOT), TTFT and ITL p50/p99 for interactive requests, output tokens per
second, cost per million output tokens (the same fleet price for both),
and which wins on interactive goodput and by how much; then a JSON line.
Exits 0 whatever the verdict.

    .venv/bin/python bench/bench_sim_disaggregated.py [--quick] [--transfer-gbps 50]
"""

import argparse
import json
import time

from sluice.sim.cost_model import CostModel
from sluice.sim.disagg_cli import compare, interactive_goodput_rps, print_side_by_side
from sluice.sim.disaggregated import DisaggregatedSimulation, DisaggregatedSpec, KvLink
from sluice.sim.hardware import HARDWARE
from sluice.sim.model_spec import MODELS
from sluice.sim.policies import build_policy, gpu_engine_config, slo_placement
from sluice.sim.results import class_slos, summarize
from sluice.sim.simulator import FleetSpec, Simulation
from sluice.sim.workload import seed_mix

TP = 8
TOTAL_REPLICAS = 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one rate, one split, a shorter run")
    parser.add_argument("--transfer-gbps", type=float, default=None, help="KV link GB/s (default: NVLink)")
    args = parser.parse_args()
    model, hardware = MODELS["llama-3-70b"], HARDWARE["h200"]
    cost = CostModel(hardware, model, tp=TP)
    kv_blocks = cost.kv_capacity_blocks(16)
    policy = build_policy("sluice", gpu_engine_config(model), slo_placement(2.0, 600.0))
    slos = class_slos(2.0, 0.1, 600.0)
    fleet_price = hardware.price_per_hour * TP * TOTAL_REPLICAS
    bandwidth = hardware.link_bandwidth_bytes_per_s if args.transfer_gbps is None else args.transfer_gbps * 1e9
    link = KvLink(model.kv_bytes_per_token("bf16"), bandwidth)
    duration_s = 60.0 if args.quick else 150.0
    rates = (12.0,) if args.quick else (10.0, 16.0)
    splits = ((2, 2),) if args.quick else ((1, 3), (2, 2), (3, 1))

    def fleet(n: int) -> FleetSpec:
        return FleetSpec(n, kv_blocks, policy, model_version=model.name, max_context_tokens=model.max_context_tokens)

    started_s = time.perf_counter()
    rows = []
    for rate in rates:
        requests = seed_mix(rate).generate(duration_s, seed=0)
        colocated = summarize(Simulation(fleet(TOTAL_REPLICAS), cost.step_time_s, requests).run(), slos, fleet_price)
        for prefill, decode in splits:
            spec = DisaggregatedSpec(fleet(prefill), fleet(decode), link)
            disaggregated = summarize(
                DisaggregatedSimulation(spec, cost.step_time_s, requests).run(), slos, fleet_price)
            verdict = compare(colocated, disaggregated)
            print(f"== {rate:g} req/s, {len(requests)} requests: {TOTAL_REPLICAS} co-located vs {prefill}P+{decode}D "
                  f"(KV link {bandwidth / 1e9:.0f} GB/s)")
            print_side_by_side(colocated, disaggregated, verdict)
            rows.append({
                "rate": rate, "prefill": prefill, "decode": decode, "winner": verdict["winner"],
                "goodput_ratio": round(verdict["goodput_ratio"], 4),
                "colocated_goodput_rps": round(interactive_goodput_rps(colocated), 3),
                "disaggregated_goodput_rps": round(interactive_goodput_rps(disaggregated), 3),
                "colocated_cost_per_m_output": colocated["cost"]["per_million_output_tokens"],
                "disaggregated_cost_per_m_output": disaggregated["cost"]["per_million_output_tokens"],
                "colocated_itl_p99_s": colocated["by_class"]["interactive"]["itl_s"]["p99"],
                "disaggregated_itl_p99_s": disaggregated["by_class"]["interactive"]["itl_s"]["p99"],
            })
    best = max(rows, key=lambda r: r["disaggregated_goodput_rps"] / max(r["colocated_goodput_rps"], 1e-9))
    print(f"best split for disaggregation: {best['prefill']}P+{best['decode']}D at {best['rate']:g} req/s, "
          f"{best['winner']} wins by {best['goodput_ratio']:.3f}x")
    print(json.dumps({"bench": "sim_disaggregated", "transfer_bandwidth_bytes_per_s": bandwidth, "rows": rows,
                      "wall_s": round(time.perf_counter() - started_s, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
