"""Prefix-aware placement: what hit rate does it buy when many tenants share
a few system prompts?

Two replicas, each with a KV cache that holds about half of the system
prompts at once. 8 tenants share 12 system prompts (~600 tokens each);
every request is a random tenant's call with a random one of those prompts
plus a short question of its own. The same load runs against a stack whose scheduler
scores replicas by the prompt blocks they cache (SLUICE_PREFIX_AWARE=true)
and against one that only balances load (false), alternating, one stack
per round.

Prints per round and arm
  * the replicas' prefix-cache hit rate (tokens served from the cache /
    tokens looked up, from sluice_prefix_cache_{hits,queries}_total)
  * the scheduler's placement hit rate (prompt blocks the chosen replica
    already held / prompt blocks looked up)
  * TTFT p50 / p99
then the ratios aware / blind (hit rate: higher is better; TTFT: lower).
No target is set by the issue; it asks for the measurement.

    .venv/bin/python bench/bench_cluster_prefix_placement.py [--quick] [--rounds N]
"""

import argparse
import asyncio
import random

from cluster_harness import PromptMaker, RequestRecord, cluster, open_loop, run_main, stream_chat, warm_up
from cluster_stats import median, metric_value, ms, parse_metrics, percentile, print_json, ratio, summary

import httpx

NUM_PROMPTS, NUM_TENANTS = 12, 8
SYSTEM_TOKENS, QUESTION_TOKENS, MAX_TOKENS = 600, 24, 8
RATE_PER_S = 6.0
ENV = {
    # ~40 blocks a request; 256 blocks hold about six system prompts.
    "SLUICE_KV_CACHE_BLOCKS": "256",
    "SLUICE_BLOCK_SIZE_TOKENS": "16",
    "SLUICE_TORCH_THREADS": "1",  # two replicas on two cores
    "SLUICE_TENANT_MAX_KV_SHARE": "1.0",
    "SLUICE_PREFIX_LOAD_MARGIN": "0.25",
    # The tenants here share their system prompts on purpose: the platform
    # opts them into one cache (by default each tenant caches apart).
    "SLUICE_PREFIX_CACHE_SCOPE": "shared",
}


def replica_cache(c, num_replicas: int) -> tuple[float, float]:
    """(hit tokens, queried tokens) summed over the replicas."""
    hits = queried = 0.0
    for index in range(num_replicas):
        page = parse_metrics(httpx.get(c.metrics_url("replica", index), timeout=5).text)
        hits += metric_value(page, "sluice_prefix_cache_hits_total") or 0.0
        queried += metric_value(page, "sluice_prefix_cache_queries_total") or 0.0
    return hits, queried


def placement_cache(c) -> tuple[float, float]:
    page = parse_metrics(httpx.get(c.metrics_url("scheduler"), timeout=5).text)
    return (metric_value(page, "sluice_placement_prefix_hit_blocks_total") or 0.0,
            metric_value(page, "sluice_placement_prefix_queried_blocks_total") or 0.0)


async def arm(prefix_aware: bool, duration_s: float, systems: list[str], questions: list[str]) -> dict:
    env = {**ENV, "SLUICE_PREFIX_AWARE": "true" if prefix_aware else "false"}
    rng = random.Random(7)  # the same request sequence in both arms
    with cluster(env, num_replicas=2, label="prefix") as c:
        keys = {f"tenant-{t}": c.create_key(f"tenant-{t}", wait=False) for t in range(NUM_TENANTS)}
        for key in keys.values():  # the gateway loads keys in batches: every one, not just the first
            c.wait_for_key(key)
        await warm_up(c, PromptMaker(seed=3))
        before_replica, before_placement = replica_cache(c, 2), placement_cache(c)
        records: list[RequestRecord] = []
        tenants = list(keys)

        def send(i: int):
            tenant = rng.choice(tenants)
            prompt = f"{rng.choice(systems)}\n{questions[i % len(questions)]}"
            return stream_chat(client, keys[tenant], tenant, prompt, max_tokens=MAX_TOKENS, sink=records)

        async with c.client() as client:
            await open_loop(RATE_PER_S, duration_s, send)
        after_replica, after_placement = replica_cache(c, 2), placement_cache(c)
    hit, queried = (a - b for a, b in zip(after_replica, before_replica))
    placed_hit, placed_queried = (a - b for a, b in zip(after_placement, before_placement))
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    return {
        "records": records,
        "hit_rate": hit / queried if queried else float("nan"),
        "placement_hit_rate": placed_hit / placed_queried if placed_queried else float("nan"),
        "ttft_p50": median(ttfts), "ttft_p99": percentile(ttfts, 99),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 s phases instead of 20 s")
    parser.add_argument("--rounds", type=int, default=1, help="aware/blind pairs, alternating")
    args = parser.parse_args()
    duration_s = 8.0 if args.quick else 20.0
    maker = PromptMaker(seed=11)
    systems = [maker.text(SYSTEM_TOKENS) for _ in range(NUM_PROMPTS)]
    questions = [maker.text(QUESTION_TOKENS) for _ in range(256)]
    results: dict[str, list[dict]] = {"aware": [], "blind": []}
    for round_index in range(args.rounds):
        for name, aware in (("aware", True), ("blind", False)):
            print(f"round {round_index + 1}: prefix {name}, {RATE_PER_S:g}/s for {duration_s:g} s", flush=True)
            result = await arm(aware, duration_s, systems, questions)
            results[name].append(result)
            print(f"  {summary(result['records'])}; replica prefix-cache hit rate {result['hit_rate']:.1%}, "
                  f"placement hit rate {result['placement_hit_rate']:.1%}, "
                  f"TTFT p50 {ms(result['ttft_p50'])}, p99 {ms(result['ttft_p99'])}", flush=True)
    aware_hit = median([r["hit_rate"] for r in results["aware"]])
    blind_hit = median([r["hit_rate"] for r in results["blind"]])
    aware_p50 = median([r["ttft_p50"] for r in results["aware"]])
    blind_p50 = median([r["ttft_p50"] for r in results["blind"]])
    print(f"hit rate aware {aware_hit:.1%} vs blind {blind_hit:.1%}: {ratio(aware_hit, blind_hit):.2f}x; "
          f"TTFT p50 aware / blind {ratio(aware_p50, blind_p50):.2f}x")
    print_json("cluster_prefix_placement", hit_rate_aware=aware_hit, hit_rate_blind=blind_hit,
               hit_rate_ratio=ratio(aware_hit, blind_hit), ttft_p50_ratio=ratio(aware_p50, blind_p50))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
