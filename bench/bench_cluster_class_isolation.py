"""Class isolation: does a batch flood (service_tier "flex") leave
interactive latency alone, while batch still gets work done?

One stack (one replica), one tenant (no limits) for both classes, so only
the service class tells them apart. Three phases of the same length, in
this order, on the same stack, repeated in alternating rounds (the machine
is shared and its load drifts; each round is printed, the verdict is on
all rounds' requests pooled):
  1. interactive alone: short requests at a steady rate
  2. batch alone: 64 long flex requests kept outstanding (~1,500-token
     prompts, max_tokens 128) by a well-behaved batch client: a refused
     request is sent again after the Retry-After it got; at the end of the
     window whatever is still running is cancelled
  3. both together
Batch work is the output tokens batch requests received inside the window
(streamed, so partial requests count).

Prints
  * interactive p99 TTFT beside the batch flood / alone   (target <= 1.5)
  * batch tokens in the window beside interactive / alone (target >= 0.5)
then PASS/FAIL lines and a JSON line. Exits 0 whatever the verdict; 1 only
when the stack fails.

    .venv/bin/python bench/bench_cluster_class_isolation.py [--quick] [--rounds N]
"""

import argparse
import asyncio
import math
import time

from cluster_harness import (
    PromptMaker, PromptPool, RequestRecord, closed_loop, cluster, open_loop, run_main, stream_chat, warm_up,
)
from cluster_stats import LoopLag, median, ms, percentile, print_json, ratio, summary, verdict

TENANT = "acme"
ENV = {
    # Capacity set explicitly so the flood contends for it: 2,048 blocks x 16
    # tokens = 32k tokens, ~20 of the batch requests at once.
    "SLUICE_KV_CACHE_BLOCKS": "2048",
    "SLUICE_BLOCK_SIZE_TOKENS": "16",
    "SLUICE_MAX_NUM_SEQS": "128",
    "SLUICE_MAX_NUM_BATCHED_TOKENS": "2048",
    # How much batch may hold while interactive is present, and how long
    # interactive may wait before batch stops starting (the defaults, stated).
    "SLUICE_BATCH_MAX_SHARE": "0.5",
    "SLUICE_BATCH_PAUSE_QUEUE_AGE_S": "0.5",
    "SLUICE_TENANT_MAX_KV_SHARE": "0.5",
}
INTERACTIVE_RATE_PER_S = 4.0
INTERACTIVE_PROMPT_TOKENS, INTERACTIVE_MAX_TOKENS = 32, 16
BATCH_CONCURRENCY = 64
BATCH_PROMPT_TOKENS, BATCH_MAX_TOKENS = 1500, 128


async def interactive(c, key: str, prompts: PromptPool, duration_s: float) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    async with c.client() as client:
        await open_loop(INTERACTIVE_RATE_PER_S, duration_s, lambda i: stream_chat(
            client, key, TENANT, prompts.next(), max_tokens=INTERACTIVE_MAX_TOKENS,
            sink=records))
    return records


async def batch(c, key: str, prompts: PromptPool, duration_s: float) -> tuple[list[RequestRecord], float, float]:
    """The flood for `duration_s`; returns its records and its window."""
    records: list[RequestRecord] = []
    async with c.worker_clients(BATCH_CONCURRENCY) as clients:
        start = time.monotonic()
        await closed_loop(BATCH_CONCURRENCY, duration_s, lambda i: stream_chat(
            clients[i], key, TENANT, prompts.next(), max_tokens=BATCH_MAX_TOKENS,
            service_tier="flex", sink=records), pause_after_refusal_s=0.2, honour_retry_after=True)
    return records, start, start + duration_s


def batch_tokens(records: list[RequestRecord], start_s: float, end_s: float) -> int:
    return sum(r.tokens_between(start_s, end_s) for r in records)


def ttfts(records: list[RequestRecord]) -> list[float]:
    return [r.ttft_s for r in records if r.ttft_s is not None]


async def one_round(c, key: str, short: PromptPool, long: PromptPool, duration_s: float) -> dict:
    """The three phases once: interactive alone, batch alone, both."""
    inter_alone = await interactive(c, key, short, duration_s)
    batch_alone, start, end = await batch(c, key, long, duration_s)
    tokens_alone = batch_tokens(batch_alone, start, end)
    async with LoopLag() as lag:
        batch_task = asyncio.ensure_future(batch(c, key, long, duration_s + 1.0))
        await asyncio.sleep(1.0)  # the flood is on before the first interactive request
        inter_beside = await interactive(c, key, short, duration_s)
        batch_beside, start, _ = await batch_task
    # The same window length as batch alone, from the flood's start.
    tokens_beside = batch_tokens(batch_beside, start, start + duration_s)
    return {"inter_alone": inter_alone, "inter_beside": inter_beside, "batch_alone": batch_alone,
            "batch_beside": batch_beside, "tokens_alone": tokens_alone, "tokens_beside": tokens_beside,
            "lag": lag.describe()}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round of 8 s phases")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three phases (default 3)")
    args = parser.parse_args()
    rounds, duration_s = (1, 8.0) if args.quick else (args.rounds, 10.0)
    prompts = PromptMaker(seed=2)

    results = []
    with cluster(ENV, label="classes") as c:
        key = c.create_key(TENANT)
        await warm_up(c, prompts)
        short, long = prompts.pool(INTERACTIVE_PROMPT_TOKENS), prompts.pool(BATCH_PROMPT_TOKENS)
        print(f"{rounds} rounds of: interactive alone ({INTERACTIVE_RATE_PER_S:g}/s), batch alone "
              f"({BATCH_CONCURRENCY} outstanding flex requests), both; {duration_s:g} s each", flush=True)
        for index in range(rounds):
            result = await one_round(c, key, short, long, duration_s)
            results.append(result)
            alone, beside = percentile(ttfts(result["inter_alone"]), 99), percentile(ttfts(result["inter_beside"]), 99)
            print(f"round {index + 1}: interactive TTFT p50/p99 alone {ms(median(ttfts(result['inter_alone'])))}/"
                  f"{ms(alone)}, beside {ms(median(ttfts(result['inter_beside'])))}/{ms(beside)} "
                  f"({ratio(beside, alone):.2f}x); batch tokens alone {result['tokens_alone']}, beside "
                  f"{result['tokens_beside']} ({ratio(result['tokens_beside'], result['tokens_alone']):.2f}x); "
                  f"both: {result['lag']}", flush=True)

    def pooled(name: str) -> list[RequestRecord]:
        return [record for result in results for record in result[name]]

    inter_alone, inter_beside = pooled("inter_alone"), pooled("inter_beside")
    tokens_alone = sum(r["tokens_alone"] for r in results)
    tokens_beside = sum(r["tokens_beside"] for r in results)
    p99_alone = percentile(ttfts(inter_alone), 99)
    p99_beside = percentile(ttfts(inter_beside), 99)
    ttft_ratio = ratio(p99_beside, p99_alone)
    work_ratio = ratio(tokens_beside, tokens_alone)
    print(f"all rounds pooled:")
    print(f"interactive alone : {summary(inter_alone)}; TTFT p50 {ms(median(ttfts(inter_alone)))}, p99 {ms(p99_alone)}")
    print(f"interactive beside: {summary(inter_beside)}; TTFT p50 {ms(median(ttfts(inter_beside)))}, "
          f"p99 {ms(p99_beside)}")
    print(f"batch alone : {summary(pooled('batch_alone'))}; {tokens_alone} output tokens in {rounds} x {duration_s:g} s")
    print(f"batch beside: {summary(pooled('batch_beside'))}; {tokens_beside} output tokens in {rounds} x {duration_s:g} s")
    print(f"ratios: interactive p99 TTFT beside / alone {ttft_ratio:.2f}x, batch tokens beside / alone "
          f"{work_ratio:.2f}x")
    print(verdict(None if math.isnan(ttft_ratio) else ttft_ratio <= 1.5,
                  f"interactive p99 TTFT beside batch / alone = {ttft_ratio:.2f}x (target <= 1.5)"))
    print(verdict(None if math.isnan(work_ratio) else work_ratio >= 0.5,
                  f"batch tokens in the window beside interactive / alone = {work_ratio:.2f}x (target >= 0.5)"))
    print_json("cluster_class_isolation", interactive_p99_ttft_ratio=ttft_ratio, batch_tokens_ratio=work_ratio,
               interactive_p99_ttft_alone_s=p99_alone, interactive_p99_ttft_beside_s=p99_beside,
               batch_tokens_alone=tokens_alone, batch_tokens_beside=tokens_beside, rounds=rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
