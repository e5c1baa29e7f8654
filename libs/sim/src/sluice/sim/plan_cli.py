"""`sluice plan` (also `sluice sim plan`): the smallest fleet that meets the
SLOs at an arrival rate, and its cost per million tokens.

    sluice plan --model llama-3-70b --gpus h100,h200 --tp 4,8 \\
                --workload seed-mix --rate 3 --duration-s 300 \\
                --ttft-slo-s 2 --tpot-slo-s 0.1 --slo-attainment 0.99 \\
                [--ttft-slo-per-1k-tokens-s 0.1] [--price h100=2.2,h200=3.1] \\
                [--compare-policies] [--plots DIR] [--json plan.json]

For every GPU type and TP degree the model fits on, the smallest replica
count meeting the SLOs (exponential then binary search, each probe one
simulation of `--duration-s` of the workload; see sluice.sim.planner for
what "meeting" means), its GPUs, cost per hour and per million output and
total tokens; then the cheapest. `--compare-policies` re-simulates the
chosen fleet under every policy side by side. `--plots DIR` writes, for the
chosen fleet, latency CDFs by class (one line per policy), KV occupancy per
replica over time, and goodput against arrival rate per policy (a sweep of
`--sweep-factors` x the rate, each `--sweep-duration-s` long).
Progress goes to stderr, the tables to stdout; the exit status is 1 when
no candidate met the SLOs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from sluice.sim.hardware import HARDWARE
from sluice.sim.model_spec import MODELS, model_by_name_or_path
from sluice.sim.planner import (
    MET, Attempt, Fleet, FleetCost, Plan, Probe, Scenario, SearchSpace, ShapeOutcome, SloTargets, measure, meets,
    parse_prices, plan,
)
from sluice.sim.policies import POLICIES
from sluice.sim.results import SimResults, summarize
from sluice.sim.trace import workload_requests


def _csv(cast):
    def parse(text: str):
        try:
            return tuple(cast(part.strip()) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama-3-70b", help=f"preset ({', '.join(MODELS)}) or config.json path")
    parser.add_argument("--gpus", type=_csv(str), default=("h100", "h200"),
                        help=f"GPU types to consider ({', '.join(HARDWARE)})")
    parser.add_argument("--tp", type=_csv(int), default=(1, 2, 4, 8), help="TP degrees to consider")
    parser.add_argument("--max-replicas", type=int, default=32, help="largest replica count probed per shape")
    parser.add_argument("--dtype", default="bf16", help="weights and KV dtype (bf16, fp16, fp8, fp32)")
    parser.add_argument("--workload", default="seed-mix", help="seed-mix, or a trace CSV path")
    parser.add_argument("--rate", type=float, default=1.0,
                        help="requests per second (seed-mix), or a rate scale factor (trace)")
    parser.add_argument("--burst-factor", type=float, default=1.0, help="seed-mix arrivals: gamma CV^2 (1 = Poisson)")
    parser.add_argument("--duration-s", type=float, default=300.0, help="arrivals over this long, per probe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default="sluice", choices=POLICIES, help="the policy the search runs")
    parser.add_argument("--ttft-slo-s", type=float, default=2.0, help="interactive TTFT target")
    parser.add_argument("--ttft-slo-per-1k-tokens-s", type=float, default=0.0,
                        help="added to the TTFT target per 1,000 prompt tokens (a long prompt's own prefill)")
    parser.add_argument("--tpot-slo-s", type=float, default=0.1, help="interactive time per output token target")
    parser.add_argument("--max-itl-slo-s", type=float, default=0.0,
                        help="longest gap between two tokens an interactive request may see (0 = no bound)")
    parser.add_argument("--slo-attainment", type=float, default=0.99,
                        help="share of interactive requests that must meet both targets (refused ones miss)")
    parser.add_argument("--batch-ttft-slo-s", type=float, default=600.0)
    parser.add_argument("--batch-attainment", type=float, default=0.9,
                        help="share of batch requests that must finish within their TTFT target (refused ones miss)")
    parser.add_argument("--price", action="append", default=[], metavar="GPU=PRICE",
                        help="price per GPU-hour, overriding the preset's (repeatable or comma-separated)")
    parser.add_argument("--compare-policies", action="store_true",
                        help="re-simulate the chosen fleet under every policy, side by side")
    parser.add_argument("--plots", type=Path, default=None, metavar="DIR",
                        help="write PNG plots for the chosen fleet here (implies --compare-policies)")
    # From half the load to three times it: the plan's own rate, the
    # headroom above it, and the overload where the policies part ways.
    parser.add_argument("--sweep-factors", type=_csv(float), default=(0.5, 1.0, 1.5, 2.0, 3.0),
                        help="the goodput-vs-rate sweep's rates, as multiples of --rate")
    parser.add_argument("--sweep-duration-s", type=float, default=120.0,
                        help="each sweep run's duration (at most --duration-s)")
    parser.add_argument("--sweep-budget-s", type=float, default=300.0,
                        help="wall-clock seconds after which the sweep starts no further rate")
    parser.add_argument("--json", type=Path, default=None, help="write the plan document here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        document = run(args)
    except (ValueError, ImportError) as error:  # ImportError: --plots without matplotlib
        print(f"sluice plan: {error}", file=sys.stderr)
        return 2
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0 if document["best"] is not None else 1


def run(args: argparse.Namespace) -> dict:
    if args.plots is not None:
        from sluice.sim import plots  # fail before a long search, not after it
        plots.require_matplotlib()
    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    targets = SloTargets(
        ttft_s=args.ttft_slo_s, tpot_s=args.tpot_slo_s, attainment=args.slo_attainment,
        ttft_per_1k_prompt_tokens_s=args.ttft_slo_per_1k_tokens_s, batch_ttft_s=args.batch_ttft_slo_s,
        max_itl_s=args.max_itl_slo_s,
        batch_attainment=args.batch_attainment,
    )
    space = SearchSpace(gpus=tuple(g.lower() for g in args.gpus), tps=args.tp, max_replicas=args.max_replicas)
    prices = parse_prices(args.price, space.gpus)
    model = model_by_name_or_path(args.model)
    requests, window_s = workload_requests(args.workload, args.rate, args.duration_s, args.seed, args.burst_factor)
    scenario = Scenario(model, tuple(requests), window_s, targets, dtype=args.dtype)
    log(f"{len(requests)} requests over {window_s:.0f}s; {model.name}; searching "
        f"{', '.join(space.gpus)} x tp {', '.join(map(str, space.tps))} up to {space.max_replicas} replicas")

    kept: dict[Fleet, SimResults] = {}  # per shape, the smallest fleet that met the SLOs so far

    def simulate(fleet: Fleet) -> Probe:
        probe, results = scenario.probe(fleet, args.policy)
        if meets(probe, targets):
            shape = [f for f in kept if (f.gpu, f.tp) == (fleet.gpu, fleet.tp)]
            if not shape or shape[0].replicas > fleet.replicas:
                for old in shape:
                    del kept[old]
                kept[fleet] = results
        return probe

    started_s = time.perf_counter()
    result = plan(space, targets, prices, scenario.fits, simulate, on_attempt=lambda a: log(_attempt_line(a)))
    search_s = time.perf_counter() - started_s
    log(f"search: {result.probes_run} probes in {search_s:.1f}s")
    _print_plan(result)
    document = {"config": _config(args, scenario, prices), "shapes": [_shape_doc(s, scenario) for s in result.shapes],
                "best": _choice_doc(result.best), "timings_s": {"search": search_s}}
    if result.best is None:
        return document

    chosen = result.best.fleet
    if args.compare_policies or args.plots is not None:
        started_s = time.perf_counter()
        by_policy = {args.policy: kept[chosen]}
        for name in POLICIES:
            if name not in by_policy:
                log(f"  {chosen} under {name} ...")
                by_policy[name] = scenario.simulate(chosen, name)
        by_policy = {name: by_policy[name] for name in POLICIES}
        document["policies"] = _compare(scenario, chosen, by_policy, result.best.price_per_gpu_hour)
        document["timings_s"]["compare"] = time.perf_counter() - started_s
        if args.plots is not None:
            document["plots"], document["sweep"] = _plots(args, scenario, chosen, by_policy, log)
            document["timings_s"]["sweep"] = document["sweep"]["wall_s"]
    return document


def _attempt_line(attempt: Attempt) -> str:
    probe = attempt.probe
    return (f"  {attempt.fleet}: interactive {probe.interactive_attainment:.1%}, batch {probe.batch_attainment:.1%}, "
            f"delayed {probe.delayed_share:.1%} -> {'meets' if attempt.meets else 'misses'} "
            f"({probe.wall_s:.1f}s)")


def _money(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _print_plan(result: Plan) -> None:
    print(f"{'gpu':<6} {'tp':>3}  {'result':<12} {'replicas':>8} {'GPUs':>5} {'interactive':>11} {'batch':>7} "
          f"{'$/GPU-h':>8} {'$/h':>8} {'$/M out':>8} {'$/M tok':>8} {'probes':>6}")
    notes = []
    for shape in result.shapes:
        choice = shape.choice
        notes.append(f"  {shape.gpu} tp {shape.tp}: {shape.note}")
        if choice is None:
            print(f"{shape.gpu:<6} {shape.tp:>3}  {shape.status:<12} {'-':>8}")
            continue
        probe = choice.probe
        print(f"{shape.gpu:<6} {shape.tp:>3}  {shape.status:<12} {choice.fleet.replicas:>8} {choice.fleet.num_gpus:>5} "
              f"{probe.interactive_attainment:>11.1%} {probe.batch_attainment:>7.1%} "
              f"{choice.price_per_gpu_hour:>8.2f} {choice.cost_per_hour:>8.2f} "
              f"{_money(choice.cost_per_million_output_tokens):>8} {_money(choice.cost_per_million_tokens, 3):>8} "
              f"{len(shape.attempts):>6}")
    for note in notes:
        print(note)
    best = result.best
    if best is None:
        print("no fleet met the SLOs")
        return
    print(f"cheapest: {best.fleet} ({best.fleet.num_gpus} GPUs), {best.cost_per_hour:.2f}/h, "
          f"{_money(best.cost_per_million_output_tokens)} per million output tokens, "
          f"{_money(best.cost_per_million_tokens, 3)} per million tokens")


def _compare(scenario: Scenario, fleet: Fleet, by_policy: dict[str, SimResults], price: float) -> dict:
    out = {}
    print(f"policies on {fleet}:")
    print(f"   {'policy':<16} {'meets':>5} {'interactive':>11} {'batch':>7} {'TTFT ms p50/p99':>16} "
          f"{'ITL ms p99':>10} {'goodput/s':>9} {'$/M out':>8}  rejections")
    for name, results in by_policy.items():
        probe = measure(results, scenario.targets, scenario.window_s)
        cost = FleetCost.of(fleet, probe, price)
        summary = summarize(results, scenario.summary_slos(), cost.cost_per_hour)
        interactive = summary["by_class"].get("interactive", {})
        ttft, itl = interactive.get("ttft_s", {}), interactive.get("itl_s", {})
        rejections = ", ".join(f"{k} {v}" for k, v in summary["overall"]["rejections"].items()) or "-"
        met = meets(probe, scenario.targets)
        print(f"   {name:<16} {'yes' if met else 'no':>5} {probe.interactive_attainment:>11.1%} "
              f"{probe.batch_attainment:>7.1%} {_ms(ttft.get('p50')) + ' / ' + _ms(ttft.get('p99')):>16} "
              f"{_ms(itl.get('p99')):>10} {probe.interactive_goodput_rps:>9.2f} "
              f"{_money(cost.cost_per_million_output_tokens):>8}  {rejections}")
        out[name] = {"meets": met, "probe": asdict(probe), "cost": _cost_doc(cost), "summary": summary}
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _plots(args: argparse.Namespace, scenario: Scenario, fleet: Fleet, by_policy: dict[str, SimResults], log):
    from sluice.sim import plots
    args.plots.mkdir(parents=True, exist_ok=True)
    written = [
        str(plots.latency_cdfs(by_policy, args.plots / "latency_cdfs.png")),
        str(plots.kv_occupancy(by_policy[args.policy], args.plots / "kv_occupancy.png",
                               title=f"KV occupancy per replica: {fleet}, {args.policy}")),
    ]
    started_s = time.perf_counter()
    duration_s = min(args.sweep_duration_s, args.duration_s)
    points: dict[str, list[tuple[float, float]]] = {name: [] for name in by_policy}
    skipped = []
    for factor in sorted(args.sweep_factors):
        rate = args.rate * factor
        if time.perf_counter() - started_s > args.sweep_budget_s:
            skipped.append(rate)
            continue
        requests, window_s = workload_requests(args.workload, rate, duration_s, args.seed, args.burst_factor)
        if not requests:
            continue
        at_rate = scenario.with_requests(requests, window_s)
        for name in by_policy:
            probe = measure(at_rate.simulate(fleet, name), at_rate.targets, window_s)
            points[name].append((rate, probe.interactive_goodput_rps))
        log(f"  sweep: rate {rate:g} done ({time.perf_counter() - started_s:.1f}s)")
    sweep_s = time.perf_counter() - started_s
    title = f"interactive goodput vs arrival rate: {fleet}, {duration_s:.0f}s per point"
    written.append(str(plots.goodput_vs_rate(points, args.plots / "goodput_vs_rate.png", title=title)))
    done = len(args.sweep_factors) - len(skipped)
    log(f"sweep: {done} rates x {len(by_policy)} policies of {duration_s:.0f}s in {sweep_s:.1f}s"
        + (f"; past the {args.sweep_budget_s:.0f}s budget, skipped rates {', '.join(map(str, skipped))}"
           if skipped else ""))
    for path in written:
        log(f"wrote {path}")
    return written, {"duration_s": duration_s, "wall_s": sweep_s, "skipped_rates": skipped,
                     "goodput_rps": {name: [list(p) for p in pts] for name, pts in points.items()}}


def _config(args: argparse.Namespace, scenario: Scenario, prices: dict[str, float]) -> dict:
    return {
        "model": scenario.model.name, "gpus": list(args.gpus), "tp": list(args.tp),
        "max_replicas": args.max_replicas, "dtype": args.dtype, "workload": args.workload, "rate": args.rate,
        "burst_factor": args.burst_factor, "duration_s": args.duration_s, "seed": args.seed, "policy": args.policy,
        "requests": len(scenario.requests), "window_s": scenario.window_s, "targets": asdict(scenario.targets),
        "price_per_gpu_hour": prices,
    }


def _cost_doc(cost: FleetCost) -> dict:
    return {"price_per_gpu_hour": cost.price_per_gpu_hour, "per_hour": cost.cost_per_hour,
            "per_million_output_tokens": cost.cost_per_million_output_tokens,
            "per_million_tokens": cost.cost_per_million_tokens}


def _choice_doc(choice: FleetCost | None) -> dict | None:
    if choice is None:
        return None
    fleet = choice.fleet
    return {"gpu": fleet.gpu, "tp": fleet.tp, "replicas": fleet.replicas, "gpus": fleet.num_gpus,
            "cost": _cost_doc(choice), "probe": asdict(choice.probe)}


def _shape_doc(shape: ShapeOutcome, scenario: Scenario) -> dict:
    document = {"gpu": shape.gpu, "tp": shape.tp, "status": shape.status, "note": shape.note,
                "fleet": _choice_doc(shape.choice),
                "attempts": [{"replicas": a.fleet.replicas, "meets": a.meets, **asdict(a.probe)}
                             for a in shape.attempts]}
    if shape.status == MET or shape.attempts:
        document["kv_tokens_per_replica"] = scenario.cost_model(shape.gpu, shape.tp).kv_capacity_tokens(
            scenario.block_size_tokens)
    return document


if __name__ == "__main__":
    sys.exit(main())
