"""The replica's engine loop with async scheduling (overlap) against one
step at a time, side by side in one process.

Tiny model, fp32, 64 concurrent sequences, 128 prompt / 128 output tokens,
greedy, ignore_eos, through `EngineLoop` itself (threads, sinks and all).
Rounds alternate the two modes; prints every round, the medians and their
ratio, and the CPU it ran on. Overlap takes the engine's planning, input
preparation and output bookkeeping off the model's critical path: it pays
where the model runs on a device of its own (a GPU), and can cost where the
two threads share the cores the model computes on.

    .venv/bin/python bench/bench_async_scheduling.py [--rounds N] [--model-dir DIR]
"""

import argparse
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_harness import cpu_model  # noqa: E402
from engine_harness import build, greedy_request, tune_process  # noqa: E402

from sluice.replica.engine_loop import EngineLoop  # noqa: E402
from sluice.replica.settings import DEVICE_DEFAULTS, ReplicaSettings  # noqa: E402

BATCH, PROMPT, OUTPUT = 64, 128, 128


def tokens_per_s(model_dir: Path, prompts: list[list[int]], overlap: bool,
                 single_thread_step_tokens: int) -> tuple[float, float]:
    """Output tok/s of one run, and the engine's average step time in ms."""
    core, executor = build(model_dir, budget=2048, single_thread_step_tokens=single_thread_step_tokens)
    engine = EngineLoop(core, executor, overlap=overlap)
    done = threading.Semaphore(0)
    produced = [0]

    def sink(event) -> None:
        if isinstance(event, BaseException):
            raise event
        produced[0] += len(event.new_token_ids)  # one engine thread calls every sink
        if event.finished:
            done.release()

    engine.start()
    try:
        engine.submit(greedy_request("warm", prompts[0], 4), sink)
        assert done.acquire(timeout=60)
        produced[0] = 0
        started = time.perf_counter()
        for i, prompt in enumerate(prompts):
            engine.submit(greedy_request(f"r{i}", prompt, OUTPUT), sink)
        for _ in prompts:
            assert done.acquire(timeout=600)
        wall_s = time.perf_counter() - started
    finally:
        engine.stop()
    assert produced[0] == BATCH * OUTPUT
    return produced[0] / wall_s, engine.snapshot.step_time_s * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=Path(".sluice/models/tiny-llama"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--single-thread-step-tokens", type=int, default=DEVICE_DEFAULTS["single_thread_step_tokens"].cpu,
                        help="as the replica's SLUICE_SINGLE_THREAD_STEP_TOKENS (default: its CPU default)")
    args = parser.parse_args()
    tune_process()
    # The replica's GIL switch interval (SLUICE_GIL_SWITCH_INTERVAL_S): with
    # CPython's 5 ms, the model thread waits behind the engine thread's
    # Python for up to that long after each torch call.
    sys.setswitchinterval(ReplicaSettings.model_fields["gil_switch_interval_s"].default)
    vocab = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    prompts = [[rng.randrange(10, vocab) for _ in range(PROMPT)] for _ in range(BATCH)]
    runs: dict[bool, list[float]] = {False: [], True: []}
    print(f"CPU: {cpu_model()}")
    for round_index in range(args.rounds):
        # Alternate which goes first, so a drift in the machine hits both alike.
        for overlap in (False, True) if round_index % 2 == 0 else (True, False):
            rate, step_ms = tokens_per_s(args.model_dir, prompts, overlap, args.single_thread_step_tokens)
            runs[overlap].append(rate)
            print(f"round {round_index + 1}  {'overlap' if overlap else 'one step at a time':>18}: "
                  f"{rate:,.0f} output tok/s   (step ~{step_ms:.1f} ms)")
    sync, overlapped = statistics.median(runs[False]), statistics.median(runs[True])
    print(f"medians: one step at a time {sync:,.0f}, overlap {overlapped:,.0f} output tok/s   "
          f"ratio overlap / one at a time = {overlapped / sync:.2f}x")
    print(json.dumps({"bench": "async_scheduling", "cpu": cpu_model(), "ratio": round(overlapped / sync, 3),
                      "runs_sync": [round(x) for x in runs[False]], "runs_overlap": [round(x) for x in runs[True]]}))


if __name__ == "__main__":
    main()
