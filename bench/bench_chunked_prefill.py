"""Inter-token latency of decoding streams while a long prompt is prefilled,
with chunked prefill vs without, side by side in one process.

Engine in-process (engine_harness), tiny model, fp32. 16 streams (64-token
prompts) decode; once every stream has its first tokens, one 4,000-token
prompt arrives. (The model's context is 4,096 positions, so the long prompt
is 4,000 tokens, leaving room for its 8 output tokens.) Configurations:

    chunked:   step budget 256 tokens: the prompt runs in ~17 chunks of ~240
               tokens, each step sharing the budget with the 16 decodes
    unchunked: step budget 4,112 (>= 4,000 + 16): the whole prompt runs in
               one step, and every stream waits for it

Window (per stream): the inter-token gaps that overlap the long prompt's
prefill (from its arrival to its first token), plus the WINDOW_MARGIN_STEPS
gaps just before and just after, so the window shows the stall against the
decode rhythm around it. Prints p99 and median ITL of the 16 streams over the
window for both configurations (issue target: chunked p99 <= 3x median).

    .venv/bin/python bench/bench_chunked_prefill.py [--model-dir DIR] [--repeats N]
"""

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_harness import build, greedy_request, tune_process  # noqa: E402

STREAMS, STREAM_PROMPT, LONG_PROMPT, LONG_OUTPUT = 16, 64, 4000, 8
CHUNKED_BUDGET = 256
UNCHUNKED_BUDGET = 4096 + STREAMS
WINDOW_MARGIN_STEPS = 4
WARM_TOKENS = 4  # every stream has this many tokens before the long prompt arrives


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def window_gaps_s(budget: int, model_dir: Path, prompts: list[list[int]], long_prompt: list[int]) -> list[float]:
    """The 16 streams' inter-token gaps over the window, one run."""
    core, executor = build(model_dir, budget=budget, max_seqs=STREAMS + 1)
    stream_ids = [f"s{i}" for i in range(STREAMS)]
    # Long enough that every stream still decodes well after the long prefill.
    for request_id, prompt in zip(stream_ids, prompts):
        core.add(greedy_request(request_id, prompt, 400))
    times: dict[str, list[float]] = {r: [] for r in stream_ids}
    arrival_s = first_long_s = None
    steps_after = 0
    while steps_after < WINDOW_MARGIN_STEPS + 1:
        if arrival_s is None and all(len(t) >= WARM_TOKENS + WINDOW_MARGIN_STEPS for t in times.values()):
            arrival_s = time.perf_counter()
            core.add(greedy_request("long", long_prompt, LONG_OUTPUT))
        plan = core.schedule(time.perf_counter())
        outputs = core.update(plan, executor.execute(plan))
        done_s = time.perf_counter()
        for output in outputs:
            if output.request_id in times and output.new_token_ids:
                times[output.request_id].append(done_s)
            elif output.request_id == "long" and first_long_s is None:
                first_long_s = done_s
        if first_long_s is not None:
            steps_after += 1
        assert core.has_work()
    gaps = []
    for stamps in times.values():
        pairs = list(zip(stamps, stamps[1:]))
        inside = [i for i, (a, b) in enumerate(pairs) if b > arrival_s and a < first_long_s]
        lo, hi = max(0, inside[0] - WINDOW_MARGIN_STEPS), inside[-1] + WINDOW_MARGIN_STEPS + 1
        gaps += [b - a for a, b in pairs[lo:hi]]
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, default=Path(".sluice/models/tiny-llama"))
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    tune_process()
    vocab = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    prompts = [[rng.randrange(10, vocab) for _ in range(STREAM_PROMPT)] for _ in range(STREAMS)]
    long_prompt = [rng.randrange(10, vocab) for _ in range(LONG_PROMPT)]
    configs = {"chunked": CHUNKED_BUDGET, "unchunked": UNCHUNKED_BUDGET}
    gaps: dict[str, list[float]] = {name: [] for name in configs}
    window_gaps_s(CHUNKED_BUDGET, args.model_dir, prompts, long_prompt[:512])  # warm-up, not measured
    for _ in range(args.repeats):  # interleaved, so machine noise hits both alike
        for name, budget in configs.items():
            gaps[name] += window_gaps_s(budget, args.model_dir, prompts, long_prompt)
    result = {"bench": "chunked_prefill", "long_prompt_tokens": LONG_PROMPT, "streams": STREAMS}
    for name, budget in configs.items():
        p99, p50 = percentile(gaps[name], 99), statistics.median(gaps[name])
        print(f"{name:9s} (budget {budget:5d} tokens/step): ITL median {p50 * 1e3:7.1f} ms   "
              f"p99 {p99 * 1e3:7.1f} ms   p99/median {p99 / p50:6.2f}x   ({len(gaps[name])} gaps)")
        result[name] = {"budget_tokens": budget, "itl_median_ms": round(p50 * 1e3, 2),
                        "itl_p99_ms": round(p99 * 1e3, 2), "p99_over_median": round(p99 / p50, 3)}
    ratio = result["chunked"]["p99_over_median"]
    print(f"chunked p99 / median = {ratio:.2f}x   (target <= 3x)")
    result["ratio"] = ratio
    print(json.dumps(result))


if __name__ == "__main__":
    main()
