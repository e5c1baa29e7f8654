"""Where one engine step's time goes on a GPU: the replica's CUDA path under torch.profiler.

CUDA only: on a machine without a GPU it prints why and exits 0.

bench_sim_gpu_fidelity.py measured Sluice's eager engine on an H200 at
17-30 ms for any small step of a Llama-3-8B shape, against ~5 ms of GPU work
by the roofline: a step is bound by the host, not the GPU (on 2026-12-04:
~1,040 kernel launches per decode step, the GPU busy 5.5 ms of 17). This runs a
few decode steps of that model (random weights, bf16) under torch.profiler
and prints the step split into the scheduler's turn and the executor's
(inputs, forward, sampling), the kernels launched per step, and the
operators by host time with the GPU's busy time at the table's foot, so the
fix (CUDA graphs, fewer launches, no host syncs) can aim at the right part.

    python bench/profile_gpu_step.py [--decodes 32 --context 1024 --steps 5]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import sluice.sim  # noqa: F401
except ImportError:  # not pip-installed here (the GPU machine): use the checkout
    sys.path[:0] = [str(p) for p in sorted(ROOT.glob("libs/*/src")) + sorted(ROOT.glob("services/*/src"))]

import torch  # noqa: E402

from sluice.sim.calibrate import GridPoint, build_timing_engine, PointRun, blocks_needed  # noqa: E402
from sluice.sim.model_spec import model_by_name_or_path  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--decodes", type=int, default=32)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cuda", help="cpu runs the same profile (to try the script)")
    args = p.parse_args()
    on_cuda = args.device.startswith("cuda")
    if on_cuda and not torch.cuda.is_available():
        print("profile_gpu_step: no CUDA device here; nothing to profile")
        return 0
    spec = model_by_name_or_path(args.model)
    point = GridPoint(decodes=args.decodes, decode_context_tokens=args.context)
    steps = 3 + 3 * args.steps  # warm-up, then three runs of args.steps: timed, in parts, profiled
    engine = build_timing_engine(spec, blocks_needed([point], steps + 4), 16, "bfloat16" if on_cuda else "float32",
                           args.device)

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize()

    run = PointRun(engine, point, steps + 4, random.Random(0))
    for _ in range(3):
        run.timed_step()
    sync()

    walls = [run.timed_step()[1] for _ in range(args.steps)]
    print(f"{spec.name}, {args.decodes} decodes @{args.context}: step wall ms "
          + ", ".join(f"{w * 1e3:.1f}" for w in walls))

    # The parts, timed apart: the scheduler's turn, then the executor (input prep + forward + sample).
    core = run.core
    plan_s = exec_s = 0.0
    for _ in range(args.steps):
        t0 = time.perf_counter()
        plan = core.schedule(time.monotonic())
        t1 = time.perf_counter()
        sampled = engine.executor.execute(plan)
        sync()
        t2 = time.perf_counter()
        core.update(plan, sampled)
        core.blocks.drain_cache_events()
        plan_s += t1 - t0
        exec_s += t2 - t1
    print(f"per step: scheduler {plan_s / args.steps * 1e3:.2f} ms, executor (inputs, forward, sampling) "
          f"{exec_s / args.steps * 1e3:.2f} ms")

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            run.timed_step()
        sync()
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                                         "cudaLaunchKernelExC"))
    copies = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                       "cudaMemcpyAsync", "cudaEventSynchronize"))
    # The GPU's busy time is the table's "Self CUDA time total" (over all the profiled steps).
    print(f"per step: {launches / args.steps:.0f} kernel launches, {copies / args.steps:.0f} copies/syncs; "
          f"the table below covers {args.steps} steps")
    print(events.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
