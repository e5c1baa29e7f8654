"""The simulator's GPU cost model against real steps of Sluice's engine on a GPU.

CUDA only: on a machine without a GPU it prints why and exits 0 (so
``make bench`` stays green on CPU boxes).

The simulator sizes 70B fleets on H100/H200 from a cost model whose GPU
efficiency defaults (``Efficiency()``) come from published serving figures,
not from a measurement. This times the replica's own CUDA path (the
IterationScheduler and BlockManager, ModelRunner with the Triton paged
attention kernels, block-major KV, the sampler) on a Llama-3-8B-shaped model
with random weights in bf16 on one GPU, over a grid of decode batches,
prefill chunks and mixed steps (``sluice.sim.calibrate.gpu_grid``), and
prints for every step:

    measured   median wall time of the real step (the engine loop's own timing)
    preset     what ``sluice sim`` predicts with the GPU preset and the default efficiencies
    floor      the roofline at 100% of the datasheet peaks, no overhead:
               no measured step may be faster ("the simulator never beats physics")

then the efficiencies fitted to these timings (``sluice sim calibrate``'s
fit, relative to the preset's peaks) and the preset's median error. The
last line of output is one JSON object with every figure.

    python bench/bench_sim_gpu_fidelity.py [--preset h200] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import sluice.sim  # noqa: F401
except ImportError:  # not pip-installed here (the GPU machine): use the checkout
    sys.path[:0] = [str(p) for p in sorted(ROOT.glob("libs/*/src")) + sorted(ROOT.glob("services/*/src"))]

import torch  # noqa: E402

from sluice.sim.calibrate import fit_efficiency, gpu_grid, host_facts, measure_step_times  # noqa: E402
from sluice.sim.calibrate_cli import describe_shape  # noqa: E402
from sluice.sim.cost_model import PEAK, CostModel, Efficiency  # noqa: E402
from sluice.sim.hardware import hardware_by_name  # noqa: E402
from sluice.sim.model_spec import model_by_name_or_path  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3-8b", help="model shape (preset or config.json), random weights")
    p.add_argument("--preset", default="h200", help="the GPU preset whose predictions are checked")
    p.add_argument("--quick", action="store_true", help="a coarser grid")
    p.add_argument("--repetitions", type=int, default=4, help="samples per step shape")
    p.add_argument("--json", type=Path, default=None, help="also write the JSON document here")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        print("bench_sim_gpu_fidelity: no CUDA device here; it times real GPU steps, so nothing to do")
        return 0
    model = model_by_name_or_path(args.model)
    hardware = hardware_by_name(args.preset)
    preset = CostModel(hardware, model, tp=1, dtype="bf16", efficiency=Efficiency())
    floor = CostModel(hardware, model, tp=1, dtype="bf16", efficiency=PEAK)
    grid = gpu_grid(args.quick)
    facts = host_facts("cuda")
    print(f"{facts.get('gpu')}, torch {facts['torch_version']}; {model.name} bf16, random weights, tp 1; "
          f"{len(grid)} step shapes x {args.repetitions} samples; preset {hardware.name}", flush=True)

    def progress(done: int, total: int) -> None:
        if done % 10 == 0 or done == total:
            print(f"  {done}/{total} shapes timed", file=sys.stderr, flush=True)

    timings = measure_step_times(model, grid, repetitions=args.repetitions, passes=2, dtype="bfloat16",
                                 device="cuda", progress=progress)
    fit = fit_efficiency(timings, model, hardware, "bf16")
    rows = []
    print(f"{'kind':<8} {'shape (tokens @ context)':<30} {'measured ms':>12} {'preset ms':>10} {'error':>8} "
          f"{'floor ms':>9} {'fitted ms':>10}")
    for timing, fitted_s in zip(timings, fit.fitted_s):
        predicted_s, floor_s = preset.step_time_s(timing.shape), floor.step_time_s(timing.shape)
        error = (predicted_s - timing.seconds) / timing.seconds
        rows.append({"kind": timing.kind, "chunks": [list(c) for c in timing.shape.chunks],
                     "measured_s": timing.seconds, "preset_s": predicted_s, "preset_error": error,
                     "floor_s": floor_s, "fitted_s": fitted_s, "samples_s": list(timing.samples_s)})
        print(f"{timing.kind:<8} {describe_shape(timing.shape.chunks):<30} {timing.seconds * 1e3:>12.2f} "
              f"{predicted_s * 1e3:>10.2f} {error:>+8.1%} {floor_s * 1e3:>9.2f} {fitted_s * 1e3:>10.2f}")
    under_floor = [r for r in rows if r["measured_s"] < r["floor_s"]]
    preset_errors = sorted(abs(r["preset_error"]) for r in rows)
    summary = {
        "gpu": facts.get("gpu"), "torch": facts["torch_version"], "model": model.name, "preset": hardware.name,
        "preset_efficiency": asdict(Efficiency()),
        "preset_median_abs_error": statistics.median(preset_errors),
        "preset_max_abs_error": preset_errors[-1],
        "fitted_flops_per_s": fit.flops_per_s, "fitted_bytes_per_s": fit.bytes_per_s,
        "fitted_efficiency": asdict(fit.efficiency),
        "fit_median_abs_error": fit.median_relative_error, "fit_max_abs_error": fit.max_relative_error,
        "steps_faster_than_the_floor": len(under_floor),
        "steps": rows,
    }
    e = fit.efficiency
    print(f"preset {hardware.name} with default efficiencies: median |error| {summary['preset_median_abs_error']:.1%}, "
          f"max {summary['preset_max_abs_error']:.1%}")
    print(f"fitted: {fit.flops_per_s / 1e12:.0f} TFLOP/s (compute {e.compute:.2f} of peak), "
          f"{fit.bytes_per_s / 1e12:.2f} TB/s (bandwidth {e.bandwidth:.2f} of peak), step overhead "
          f"{e.step_overhead_s * 1e3:.2f} ms; fit median |error| {fit.median_relative_error:.1%}, "
          f"max {fit.max_relative_error:.1%}")
    print(f"steps faster than the roofline floor: {len(under_floor)} of {len(rows)}")
    document = json.dumps(summary)
    if args.json:
        args.json.write_text(document + "\n", encoding="utf-8")
    print(document)
    return 0


if __name__ == "__main__":
    sys.exit(main())
