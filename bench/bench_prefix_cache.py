"""Time to first token with a 1,024-token system prompt already in the prefix
cache vs the same prompt length uncached, side by side in one process.

Engine in-process (engine_harness: IterationScheduler + StepExecutor over the
CPU ModelRunner), tiny model, fp32, the replica's default step budget
(512 tokens) and block size (16). Each repeat:

    warm:     SYSTEM(1024) + suffix_w(32)  -> puts SYSTEM's 64 full blocks in the cache
    cached:   SYSTEM(1024) + suffix_c(32)  -> prefix hit of 1,024 tokens, computes 32
    uncached: random(1056)                 -> computes all 1,056 (3 steps at budget 512)

each request alone, one output token; TTFT = arrival to first token. The
cached and uncached requests alternate which goes first. Prints the medians
and the ratio cached / uncached (issue target <= 0.25x).

    .venv/bin/python bench/bench_prefix_cache.py [--model-dir DIR] [--repeats N]
"""

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_harness import build, greedy_request, run_to_completion, tune_process  # noqa: E402

SYSTEM_TOKENS, SUFFIX_TOKENS = 1024, 32


def ttft_s(core, executor, request_id: str, prompt: list[int]) -> tuple[float, int]:
    """(TTFT, prefix-cache hit tokens) of one request run alone."""
    hits_before = core.blocks.prefix_cache_hit_tokens_total
    stats = run_to_completion(core, executor, [(0.0, greedy_request(request_id, prompt, 1))])
    return stats.first_token_s[request_id], core.blocks.prefix_cache_hit_tokens_total - hits_before


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, default=Path(".sluice/models/tiny-llama"))
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    tune_process()
    vocab = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(10, vocab) for _ in range(n)]

    core, executor = build(args.model_dir)
    ttft_s(core, executor, "warm-up", tokens(64))  # first-call costs out of the measurement
    cached, uncached = [], []
    for i in range(args.repeats):
        system = tokens(SYSTEM_TOKENS)  # fresh per repeat: each repeat warms its own prefix
        _, warm_hits = ttft_s(core, executor, f"warm{i}", system + tokens(SUFFIX_TOKENS))
        assert warm_hits == 0, "a fresh system prompt must miss"
        runs = [("cached", system + tokens(SUFFIX_TOKENS)), ("uncached", tokens(SYSTEM_TOKENS + SUFFIX_TOKENS))]
        for kind, prompt in runs if i % 2 == 0 else runs[::-1]:
            seconds, hits = ttft_s(core, executor, f"{kind}{i}", prompt)
            if kind == "cached":
                assert hits == SYSTEM_TOKENS, f"expected a {SYSTEM_TOKENS}-token prefix hit, got {hits}"
                cached.append(seconds)
            else:
                assert hits == 0, f"an unshared prompt hit {hits} cached tokens"
                uncached.append(seconds)
    c, u = statistics.median(cached), statistics.median(uncached)
    print(f"TTFT, {SYSTEM_TOKENS}-token system prompt cached + {SUFFIX_TOKENS} new: {c * 1e3:.1f} ms   "
          f"uncached {SYSTEM_TOKENS + SUFFIX_TOKENS} tokens: {u * 1e3:.1f} ms   (medians of {args.repeats})")
    print(f"ratio cached / uncached = {c / u:.3f}x   (target <= 0.25x)")
    print(json.dumps({"bench": "prefix_cache", "cached_ttft_ms": round(c * 1e3, 2),
                      "uncached_ttft_ms": round(u * 1e3, 2), "ratio": round(c / u, 4),
                      "runs_cached_ms": [round(x * 1e3, 1) for x in cached],
                      "runs_uncached_ms": [round(x * 1e3, 1) for x in uncached]}))


if __name__ == "__main__":
    main()
