"""Noisy neighbour: does a tenant flooding far over its token limit hurt a
quiet tenant, and is it refused cheaply?

One stack (one replica). Tenant A's key has a small --tokens-per-minute;
A keeps 64 long streaming requests outstanding (~1,500-token prompts,
max_tokens 128), sending again shortly after each refusal. Tenant B (no
limits) sends short interactive requests at a steady rate. Baseline, in the
same run and on the same stack: B's identical load with A silent, the two
in alternating rounds (the machine is shared and its load drifts; each
round is printed, the verdict is on all rounds' requests pooled).

Prints
  * B's p99 TTFT under the flood / alone          (target <= 2)
  * A's refusals: count, reasons, median time from send to the 429
                                                    (target < 50 ms),
    and how many carried Retry-After              (target: all)
  * the largest KV share A ever held, from the scheduler's
    sluice_tenant_reserved_kv_share{tenant="tenant-a"} sampled every 0.5 s
    ("n/a" while the scheduler does not export it; no target)
then one PASS/FAIL line per target and a JSON line. Exits 0 whatever the
verdict; 1 only when the stack fails.

With --decompose, each round also runs B beside two halves of the flood,
each from a tenant of its own, so the cost of each is read apart:
  * refused only: A's 64 workers with a bucket of 1 token a minute, every
    request refused at the gateway (what answering a flood costs)
  * admitted only: 8 workers and no token limit, all admitted within A's
    KV share (what serving the work a tenant's caps allow costs)
and prints B's p99 ratio beside each, with the cores each process (and
this client) kept busy in every phase: on a machine where the engine and
the services share the cores, the admitted half is the floor of the ratio.

    .venv/bin/python bench/bench_cluster_noisy_neighbour.py [--quick] [--rounds N] [--decompose]
"""

import argparse
import asyncio
import math
import os
from collections import Counter

from cluster_harness import (
    PromptMaker, PromptPool, RequestRecord, closed_loop, cluster, open_loop, run_main, stream_chat, warm_up,
)
from cluster_stats import (
    CoresUsed, LoopLag, MetricsSampler, describe_cores, median, metric_value, metric_values, ms, percentile,
    print_json, ratio, summary, verdict,
)

TENANT_A, TENANT_B = "tenant-a", "tenant-b"
ENV = {
    # Capacity is set, not left to defaults, so the flood contends for it:
    # 2,048 blocks x 16 tokens = 32k tokens, ~20 of A's 1,628-token requests.
    "SLUICE_KV_CACHE_BLOCKS": "2048",
    "SLUICE_BLOCK_SIZE_TOKENS": "16",
    "SLUICE_MAX_NUM_SEQS": "128",
    "SLUICE_MAX_NUM_BATCHED_TOKENS": "2048",
    # The most of the pool's KV one tenant may hold (the default, stated:
    # the largest share A held is read against it).
    "SLUICE_TENANT_MAX_KV_SHARE": "0.5",
    "SLUICE_INTERACTIVE_TTFT_SLO_S": "2.0",  # predicted start past this is refused at once
}
# A's bucket: 60k tokens a minute is ~25 of its requests as the first burst,
# then one every ~2.4 s, against a flood that asks for ~100x that.
A_TOKENS_PER_MINUTE = 60_000
A_CONCURRENCY = 64
A_PROMPT_TOKENS, A_MAX_TOKENS = 1500, 128
B_RATE_PER_S = 4.0
B_PROMPT_TOKENS, B_MAX_TOKENS = 32, 16
# --decompose: the flood's halves, each a tenant of its own (its own bucket
# and caps). 8 workers keep about A's KV share (~9 of its requests) resident.
TENANT_REFUSED, TENANT_ADMITTED = "tenant-a-refused", "tenant-a-admitted"
ADMITTED_CONCURRENCY = 8
UNLIMITED_TOKENS_PER_MINUTE = 100_000_000
HALVES = (("refused only", TENANT_REFUSED, A_CONCURRENCY), ("admitted only", TENANT_ADMITTED, ADMITTED_CONCURRENCY))


async def quiet_tenant(cluster_, key: str, prompts: PromptPool, duration_s: float) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    async with cluster_.client() as client:
        await open_loop(B_RATE_PER_S, duration_s, lambda i: stream_chat(
            client, key, TENANT_B, prompts.next(), max_tokens=B_MAX_TOKENS, sink=records))
    return records


async def flood(cluster_, key: str, prompts: PromptPool, duration_s: float, pause_s: float,
                honour_retry_after: bool, *, tenant: str = TENANT_A,
                concurrency: int = A_CONCURRENCY) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    async with cluster_.worker_clients(concurrency) as clients:
        await closed_loop(concurrency, duration_s, lambda i: stream_chat(
            clients[i], key, tenant, prompts.next(), max_tokens=A_MAX_TOKENS, sink=records),
            pause_after_refusal_s=pause_s, honour_retry_after=honour_retry_after)
    return records


async def beside(cluster_, key_b: str, short: PromptPool, start_flood, duration_s: float
                 ) -> tuple[list[RequestRecord], list[RequestRecord]]:
    """B's load beside a flood begun a second before it: (B's, the flood's)."""
    flood_task = asyncio.ensure_future(start_flood(duration_s + 2.0))
    await asyncio.sleep(1.0)  # the flood is on before B's first request
    records = await quiet_tenant(cluster_, key_b, short, duration_s)
    return records, await flood_task


def p99_ttft(records: list[RequestRecord]) -> float:
    return percentile([r.ttft_s for r in records if r.ttft_s is not None], 99)


def p50_ttft(records: list[RequestRecord]) -> float:
    return median([r.ttft_s for r in records if r.ttft_s is not None])


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round of 8 s phases")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of alone and flood (default 3)")
    parser.add_argument("--refusal-pause-s", type=float, default=0.5,
                        help="how long an A worker waits after a refusal before sending again")
    parser.add_argument("--decompose", action="store_true",
                        help="also run B beside the flood's refused-only and admitted-only halves")
    parser.add_argument("--honour-retry-after", action="store_true",
                        help="A's workers wait the Retry-After they were given (as the openai SDK does) "
                             "instead of --refusal-pause-s")
    args = parser.parse_args()
    rounds, duration_s = (1, 8.0) if args.quick else (args.rounds, 10.0)
    prompts = PromptMaker(seed=1)

    alone: list[RequestRecord] = []
    beside_flood: list[RequestRecord] = []
    flooded: list[RequestRecord] = []
    # --decompose: phase -> B's records beside it, and the cores used in each phase
    halves: dict[str, list[RequestRecord]] = {phase: [] for phase, _, _ in HALVES}
    cores: dict[str, list[dict[str, float]]] = {}
    with cluster(ENV, label="noisy") as c:
        key_a = c.create_key(TENANT_A, tokens_per_minute=A_TOKENS_PER_MINUTE, wait=False)
        key_b = c.create_key(TENANT_B)
        keys = {"refused only": c.create_key(TENANT_REFUSED, tokens_per_minute=1, wait=False),
                "admitted only": c.create_key(TENANT_ADMITTED, tokens_per_minute=UNLIMITED_TOKENS_PER_MINUTE,
                                              wait=False)} if args.decompose else {}
        for key in (key_a, *keys.values()):
            c.wait_for_key(key)
        await warm_up(c, prompts)
        short, long = prompts.pool(B_PROMPT_TOKENS), prompts.pool(A_PROMPT_TOKENS)
        pids = {name: process.pid for name, process in c.stack.processes.items()} | {"client": os.getpid()}

        async def metered(phase: str, records_of):
            meter = CoresUsed(pids)
            result = await records_of()
            cores.setdefault(phase, []).append(meter.read())
            return result

        def flood_of(key: str, tenant: str, concurrency: int):
            return lambda duration_s: flood(c, key, long, duration_s, args.refusal_pause_s, args.honour_retry_after,
                                            tenant=tenant, concurrency=concurrency)

        print(f"{rounds} rounds of: tenant B alone at {B_RATE_PER_S:g}/s, then the same B load beside tenant A's "
              f"flood (x{A_CONCURRENCY} long requests, tpm {A_TOKENS_PER_MINUTE}); {duration_s:g} s each"
              + ("; then beside the flood's halves (refused only, admitted only)" if args.decompose else ""),
              flush=True)
        async with MetricsSampler(c.metrics_url("scheduler")) as sampler, LoopLag() as lag:
            for index in range(rounds):
                round_alone = await metered("alone", lambda: quiet_tenant(c, key_b, short, duration_s))
                round_beside, round_flood = await metered("flood", lambda: beside(
                    c, key_b, short, flood_of(key_a, TENANT_A, A_CONCURRENCY), duration_s))
                flooded += round_flood
                alone += round_alone
                beside_flood += round_beside
                print(f"round {index + 1}: B TTFT p50/p99 alone {ms(p50_ttft(round_alone))}/"
                      f"{ms(p99_ttft(round_alone))}, beside the flood {ms(p50_ttft(round_beside))}/"
                      f"{ms(p99_ttft(round_beside))} ({ratio(p99_ttft(round_beside), p99_ttft(round_alone)):.2f}x)",
                      flush=True)
                for phase, tenant, concurrency in HALVES if args.decompose else ():
                    records, _ = await metered(phase, lambda: beside(
                        c, key_b, short, flood_of(keys[phase], tenant, concurrency), duration_s))
                    halves[phase] += records
                    print(f"  beside {phase}: B TTFT p50/p99 {ms(p50_ttft(records))}/{ms(p99_ttft(records))} "
                          f"({ratio(p99_ttft(records), p99_ttft(round_alone)):.2f}x)", flush=True)

    ttft_alone = p99_ttft(alone)
    ttft_beside = p99_ttft(beside_flood)
    ttft_ratio = ratio(ttft_beside, ttft_alone)
    refusals = [r for r in flooded if r.status == 429]
    reasons = Counter(r.reject_reason or "none" for r in flooded if r.refused)
    refusal_s = median([r.time_to_answer_s for r in refusals])
    with_retry_after = sum(r.retry_after_s is not None for r in refusals)
    shares = [metric_values(page, "sluice_tenant_reserved_kv_share", "tenant").get(TENANT_A)
              for _, page in sampler.samples]
    shares = [s for s in shares if s is not None]
    max_share = max(shares) if shares else None

    print(f"B alone : {summary(alone)}; TTFT p50 {ms(p50_ttft(alone))}, "
          f"p99 {ms(ttft_alone)}")
    print(f"B beside: {summary(beside_flood)}; TTFT p50 {ms(p50_ttft(beside_flood))}, "
          f"p99 {ms(ttft_beside)}")
    print(f"A flood : {summary(flooded)}; tokens received {sum(r.tokens_received for r in flooded)}")
    print(f"A refusals: {len(refusals)} x 429, reasons {dict(reasons)}, median time to 429 {ms(refusal_s)} "
          f"(p99 {ms(percentile([r.time_to_answer_s for r in refusals], 99))}), "
          f"Retry-After on {with_retry_after}/{len(refusals)}")
    for reason in sorted(reasons):
        times = [r.time_to_answer_s for r in flooded if r.refused and (r.reject_reason or "none") == reason]
        print(f"  {reason}: {len(times)}, median time to refusal {ms(median(times))}")
    # Refusals the scheduler made (tokenized by the router, placed, refused)
    # against those the gateway answered (its bucket, or its memory of the
    # scheduler's tenant-cap refusal): a refusal is cheap only at the gateway.
    deep = math.nan
    if len(sampler.samples) > 1:
        first, last = (metric_value(page, "sluice_rejections_total") or 0.0
                       for _, page in (sampler.samples[0], sampler.samples[-1]))
        deep = last - first
    print(f"  refused by the scheduler: {deep:.0f} of {len(refusals)} (the rest answered at the gateway)")
    print(f"largest KV share A held: {'n/a' if max_share is None else f'{max_share:.2f}'} "
          f"({len(sampler.samples)} scheduler samples)")
    print(f"during the run: {lag.describe()} (included in the client's timings above)")
    decomposed = {}
    for phase, records in halves.items():
        if records:
            decomposed[phase] = ratio(p99_ttft(records), ttft_alone)
            print(f"B beside the flood's {phase} half: TTFT p50 {ms(p50_ttft(records))}, p99 {ms(p99_ttft(records))}"
                  f" ({decomposed[phase]:.2f}x alone)")
    for phase, readings in cores.items():
        mean = {name: sum(r[name] for r in readings) / len(readings) for name in readings[0]}
        print(f"cores busy, {phase}: {describe_cores(mean)}")
    print(f"ratio B p99 TTFT flood / alone: {ttft_ratio:.2f}x")
    print(verdict(None if math.isnan(ttft_ratio) else ttft_ratio <= 2.0,
                  f"B p99 TTFT under the flood / alone = {ttft_ratio:.2f}x (target <= 2)"))
    print(verdict(refusal_s < 0.050 if refusals else None,
                  f"A's median time to its 429 = {ms(refusal_s)} (target < 50 ms)"))
    print(verdict(with_retry_after == len(refusals) if refusals else None,
                  f"Retry-After on {with_retry_after}/{len(refusals)} of A's 429s (target: all)"))
    print_json("cluster_noisy_neighbour", b_p99_ttft_ratio=ttft_ratio, b_p99_ttft_alone_s=ttft_alone,
               b_p99_ttft_flood_s=ttft_beside, a_refusals=len(refusals), a_reasons=dict(reasons),
               a_median_refusal_s=refusal_s, a_retry_after=with_retry_after, a_max_kv_share=max_share,
               a_refused_by_scheduler=deep,
               **({"b_p99_ttft_ratio_by_half": decomposed} if decomposed else {}))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
