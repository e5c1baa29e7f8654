"""`sluice sim calibrate`: time real engine steps of the tiny model on this
machine and fit the CPU cost model to them (sluice.sim.calibrate).

    sluice sim calibrate [--model-dir .sluice/models/tiny-llama] [--out .sluice/sim-calibration.json]
                         [--quick] [--repetitions 6] [--passes 2] [--torch-threads N]
    sluice sim calibrate --device cuda --random-weights llama-3-8b --preset h200

Prints every shape's measured and fitted step time, the fitted rates and
the Hardware + Efficiency written to `--out`; `sluice sim --gpu cpu
--model tiny-llama --dtype float32 --calibration PATH` then simulates this
machine. Needs torch (the dev venv); the rest of the simulator does not.
Takes ~1-2 minutes (`--quick`: ~20 s); other work on the machine meanwhile
slows the steps it lands on, so run it on a quiet machine, and match
`--torch-threads` to the replica's SLUICE_TORCH_THREADS.

On a GPU (`--device cuda`) the replica's CUDA path is timed (Triton
attention, block-major KV) over a grid of GPU-sized batches and chunks.
`--random-weights MODEL` times a model of that shape (a preset or a
config.json) with random weights, so an 8B model needs no checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from sluice.sim.calibrate import (
    DEFAULT_OUT, calibrate, default_grid, describe_fit, gpu_grid, tune_process, write_calibration,
)
from sluice.sim.model_spec import model_by_name_or_path

DEFAULT_MODEL_DIR = Path(".sluice") / "models" / "tiny-llama"
# A GPU calibration never lands where the CPU one lives (bench_sim_fidelity reads that one).
GPU_OUT = Path(".sluice") / "sim-calibration-gpu.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice sim calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR,
                        help="the checkpoint to time (make model builds the tiny one)")
    parser.add_argument("--random-weights", metavar="MODEL", default=None,
                        help="time a model of this shape (preset or config.json) with random weights, "
                             "instead of the checkpoint in --model-dir")
    parser.add_argument("--device", default="cpu", help="torch device to time on: cpu or cuda[:N]")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where to write the calibration JSON (default {DEFAULT_OUT} on cpu, "
                             f"{GPU_OUT} on a GPU)")
    parser.add_argument("--preset", default=None,
                        help="hardware preset whose peaks the fit is relative to (default cpu; on a GPU, required: "
                             "h100 or h200)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                        help="weights and KV dtype, as the replica's SLUICE_DTYPE (default float32 on cpu, "
                             "bfloat16 on a GPU)")
    parser.add_argument("--quick", action="store_true", help="a coarser grid, 3 samples per shape")
    parser.add_argument("--repetitions", type=int, default=None, help="samples per shape (default 6; quick 3)")
    parser.add_argument("--passes", type=int, default=2, help="sweeps over the grid the samples are split into")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch intra-op threads; 0 = torch's default")
    parser.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                        help="fit wall time (what the engine loop sees) or process CPU time (steady while other "
                             "work shares the machine; the same thing with one torch thread on an idle core)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scatter-over-blocks", type=int, default=0, metavar="N",
                        help="time each shape over blocks scattered at random over a pool of N, as a replica "
                             "whose prefix cache has cycled through its pool hands them out (its KV blocks, "
                             "e.g. 8192 for the tiny model's 512 MiB on CPU); 0 = consecutive blocks, as fresh")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    repetitions = args.repetitions or (3 if args.quick else 6)
    on_gpu = args.device != "cpu"
    dtype = args.dtype or ("bfloat16" if on_gpu else "float32")
    out = args.out or (GPU_OUT if on_gpu else DEFAULT_OUT)
    try:
        if on_gpu and args.preset in (None, "cpu"):
            raise ValueError(f"--device {args.device}: name the GPU's preset (--preset h100 or h200); the fit's "
                             "efficiencies are relative to its peaks")
        preset = args.preset or "cpu"
        if args.random_weights:
            model_dir, model = None, model_by_name_or_path(args.random_weights)
        elif not (args.model_dir / "config.json").is_file():
            raise ValueError(f"{args.model_dir} holds no config.json (make model builds the tiny model)")
        else:
            model_dir, model = args.model_dir, model_by_name_or_path(str(args.model_dir))
        tune_process(args.torch_threads or None)
        grid = gpu_grid(args.quick) if on_gpu else default_grid(args.quick)
        print(f"timing {len(grid)} step shapes x {repetitions} samples of {model.name} ...", file=sys.stderr)
        timings, fit, document = calibrate(
            model_dir, model, base=preset, grid=grid, repetitions=repetitions, passes=args.passes,
            dtype=dtype, seed=args.seed, clock=args.clock, device=args.device, progress=_progress,
            scatter_over_blocks=args.scatter_over_blocks)
    except (RuntimeError, ValueError) as error:
        print(f"sluice sim calibrate: {error}", file=sys.stderr)
        return 2
    print_calibration(document)
    path = write_calibration(out, document)
    print(f"wrote {path}")
    return 0


def _progress(done: int, total: int) -> None:
    if done % 10 == 0 or done == total:
        print(f"  {done}/{total} shapes timed", file=sys.stderr)


def describe_shape(chunks: Sequence[Sequence[int]]) -> str:
    """'32 decodes @1024 + 128 @ 0' for a calibration file's chunks."""
    decodes = [context for tokens, context in chunks if tokens == 1]
    parts = []
    if decodes:
        low, high = min(decodes), max(decodes)
        parts.append(f"{len(decodes)} decode{'s' if len(decodes) > 1 else ''} @{low}"
                     + (f"-{high}" if high != low else ""))
    parts += [f"{tokens} @{context}" for tokens, context in chunks if tokens > 1]
    return " + ".join(parts)


def print_calibration(document: dict) -> None:
    host, fit = document["host"], document["fit"]
    if host.get("gpu"):
        print(f"gpu: {host['gpu']}; timed on {host.get('device', 'cpu')}, {host.get('weights', 'checkpoint')} weights")
    print(f"host: {host.get('cpu_model')} ({host.get('cpu_count')} CPUs, {host.get('torch_threads')} torch threads); "
          f"load average before {_loads(host.get('load_average_before'))}, after "
          f"{_loads(host.get('load_average_after'))}")
    share = host.get("median_cpu_share")
    if share is not None:
        # With one torch thread an idle core gives ~100%; less is other work taking the CPU mid-step.
        print(f"clock: {host.get('clock')}; median CPU time / wall time of a step {share:.0%}")
    print(f"{'kind':<8} {'shape (tokens @ context)':<34} {'measured ms':>12} {'fitted ms':>10} {'error':>8}")
    for shape in document["shapes"]:
        print(f"{shape['kind']:<8} {describe_shape(shape['chunks']):<34} {shape['measured_s'] * 1e3:>12.2f} "
              f"{shape['fitted_s'] * 1e3:>10.2f} {shape['relative_error']:>+8.1%}")
    hardware, efficiency = document["hardware"], document["efficiency"]
    print(f"fitted: {describe_fit(fit)}")
    print(f"as {hardware['name']}: peak {hardware['peak_flops_per_s'] / 1e9:.1f} GFLOP/s x compute "
          f"{efficiency['compute']:.3f}, {hardware['hbm_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s x bandwidth "
          f"{efficiency['bandwidth']:.3f}")
    print(f"fit error |fitted - measured| / measured: median {fit['median_relative_error']:.1%}, "
          f"p90 {fit['p90_relative_error']:.1%}, max {fit['max_relative_error']:.1%} "
          f"over {len(document['shapes'])} shapes")


def _loads(values) -> str:
    return " ".join(f"{v:.2f}" for v in values) if values else "?"


if __name__ == "__main__":
    sys.exit(main())
