"""Retry-After: when the pool is full, is the wait a refusal suggests one
after which a retry gets in, and how does it compare to the real wait?

One stack (one replica) whose capacity is 16 requests by both bounds: 16
resident sequences (SLUICE_MAX_NUM_SEQS) and KV for 16 of these requests
(SLUICE_KV_CACHE_BLOCKS; each is ~103 prompt tokens with the chat template
plus exactly 128 output tokens with ignore_eos, 15 blocks of 16; long
enough that a wave of 16 takes longer than the interactive TTFT SLO, so
the scheduler must refuse part of the burst rather than queue it all). A burst
of 3x capacity (48 requests, 12 from each of four tenants, interleaved, so
no per-tenant cap is what refuses them) arrives at once; every client
refused with 429 retries once, after exactly the retry-after-ms it was given (or
Retry-After, whole seconds, when that is all it got). Rounds run one after
another on an idle pool.

Prints
  * first attempts: admitted, refused (reasons)
  * the share of retries admitted                  (target >= 0.8)
    (admitted = HTTP 200, which the gateway sends once the request is
    placed on a replica, after any time in the scheduler's queue)
  * the median predicted wait (what the refusal suggested) beside the
    realised wait: from the retry to its first token, and from the first
    attempt to the first token; and the admitted-at-once TTFT for scale
then a PASS/FAIL line and a JSON line. Exits 0 whatever the verdict; 1
only when the stack fails.

    .venv/bin/python bench/bench_cluster_retry_after.py [--quick]
"""

import argparse
import asyncio
import time
from collections import Counter

from cluster_harness import PromptMaker, RequestRecord, cluster, run_main, stream_chat, warm_up
from cluster_stats import median, ms, print_json, ratio, verdict
from load_client import LoadClient

TENANTS = ("acme", "globex", "initech", "umbrella")
CAPACITY = 16
PROMPT_TOKENS, MAX_TOKENS = 96, 128
ENV = {
    "SLUICE_MAX_NUM_SEQS": str(CAPACITY),
    # 16 x 15 blocks = 240 <= 248 < 17 x 15: the KV holds exactly 16 too.
    "SLUICE_KV_CACHE_BLOCKS": "248",
    "SLUICE_BLOCK_SIZE_TOKENS": "16",
    "SLUICE_MAX_NUM_BATCHED_TOKENS": "2048",
    # A tenant may hold and queue up to one pool's KV (the default is half):
    # each tenant's 12 (180 blocks) fit under it, so refusals are the pool's.
    "SLUICE_TENANT_MAX_KV_SHARE": "1.0",
    # A predicted start past the SLO is refused rather than queued; the
    # advice under test comes from that prediction. Well under a wave's
    # service time (128 tokens: ~0.6 s on the fastest box this ran on, so
    # the default 2 s let the whole burst queue there and refused nothing).
    "SLUICE_INTERACTIVE_TTFT_SLO_S": "0.5",
}
BURST = 3 * CAPACITY


Retry = tuple[RequestRecord, RequestRecord]  # (the refused first attempt, its one retry)


async def client_with_one_retry(client: LoadClient, key: str, tenant: str, prompt: str,
                                attempts: list[RequestRecord], retries: list[Retry]) -> None:
    first = await stream_chat(client, key, tenant, prompt, max_tokens=MAX_TOKENS)
    attempts.append(first)
    if first.status != 429:
        return
    wait_s = first.suggested_retry_s()
    if wait_s is None:
        return  # counted as a refusal without advice
    # Exactly the advice, measured from when the refusal arrived.
    await asyncio.sleep(max(0.0, first.answered_s + wait_s - time.monotonic()))
    retry = await stream_chat(client, key, tenant, prompt, max_tokens=MAX_TOKENS)
    retries.append((first, retry))


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one burst instead of three")
    args = parser.parse_args()
    rounds = 1 if args.quick else 3
    prompts = PromptMaker(seed=5)

    attempts: list[RequestRecord] = []
    retries: list[Retry] = []
    with cluster(ENV, label="retry-after") as c:
        keys = {tenant: c.create_key(tenant, wait=False) for tenant in TENANTS}
        for key in keys.values():
            c.wait_for_key(key)
        await warm_up(c, prompts)
        async with c.client() as client:
            for index in range(rounds):
                print(f"round {index + 1}/{rounds}: burst of {BURST} (capacity {CAPACITY})", flush=True)
                texts = [prompts.text(PROMPT_TOKENS) for _ in range(BURST)]
                await asyncio.wait_for(asyncio.gather(
                    *(client_with_one_retry(client, keys[tenant], tenant, text, attempts, retries)
                      for tenant, text in zip(TENANTS * (BURST // len(TENANTS)), texts))), timeout=120)
                await asyncio.sleep(1.0)  # the pool drains its last streams' state before the next burst

    admitted_first = [r for r in attempts if r.status == 200]
    refused = [r for r in attempts if r.refused]
    reasons = Counter(f"{r.status} {r.reject_reason}" for r in refused)
    unadvised = sum(r.status == 429 and r.suggested_retry_s() is None for r in refused)
    admitted_retry = [(f, r) for f, r in retries if r.status == 200 and r.first_token_s is not None]
    share = ratio(len(admitted_retry), len(retries))
    predicted = median([f.suggested_retry_s() for f, _ in retries])
    from_retry = median([r.first_token_s - r.sent_s for _, r in admitted_retry])
    from_first = median([r.first_token_s - f.sent_s for f, r in admitted_retry])
    gave_ms = sum(f.retry_after_ms is not None for f, _ in retries)
    prompt_sizes = sorted({r.prompt_tokens for r in admitted_first if r.prompt_tokens})

    print(f"first attempts: {len(attempts)}: {len(admitted_first)} admitted (TTFT p50 "
          f"{ms(median([r.ttft_s for r in admitted_first if r.ttft_s is not None]))}), {len(refused)} refused "
          f"{dict(reasons)}; prompt tokens {prompt_sizes[:1] + prompt_sizes[-1:]}")
    print(f"advice: retry-after-ms on {gave_ms}/{len(retries)} refusals (else Retry-After in whole seconds); "
          f"{unadvised} 429s gave none")
    retry_reasons = Counter(f"{r.status} {r.reject_reason}" for _, r in retries if r.status != 200)
    print(f"retries: {len(retries)}, admitted {len(admitted_retry)} ({share:.0%}); refused again {dict(retry_reasons)}")
    placed = median([r.answered_s - r.sent_s for _, r in admitted_retry])
    print(f"median wait: predicted {ms(predicted)}; realised from the retry to first token {ms(from_retry)} "
          f"(to its HTTP 200, i.e. queued: {ms(placed)}), from the first attempt to first token {ms(from_first)}")
    print(f"ratio realised (first attempt -> first token) / predicted: {ratio(from_first, predicted):.2f}x")
    print(verdict(None if not retries else share >= 0.8,
                  f"share of retries admitted after exactly the advised wait = {share:.2f} (target >= 0.8)"))
    print_json("cluster_retry_after", retry_admitted_share=share, retries=len(retries),
               first_admitted=len(admitted_first), refusal_reasons=dict(reasons), predicted_wait_s=predicted,
               realised_from_retry_s=from_retry, realised_from_first_attempt_s=from_first,
               retry_queued_s=placed)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
