"""Fairness: two backlogged tenants, one sending 4x larger requests. Does
each get its share of served tokens, within the scheduler's VTC bound?

One stack (one replica) sized so the two backlogs contend (16 sequences
at once, 1,024 KV blocks). Tenants S and L (no limits) each keep 32
requests outstanding (a refused one is sent again after its Retry-After);
L's prompt and max_tokens are 4x S's. While both are backlogged the
scheduler's /metrics is sampled every 0.5 s for
    sluice_tenant_served_tokens_total{tenant}   (the fairness counter)
    sluice_fairness_bound_tokens                (the VTC bound it promises)
and the client computes served tokens itself from the responses' usage
(prompt tokens when the first token arrives, plus output tokens as they
stream, weighted 1 and 2 as the scheduler is told to) as a cross-check. Baselines, after, on the same
stack: L alone and S alone, half as long each.

Prints
  * a table over time: served L - S from the scheduler's counter, the bound,
    the client's own difference, and whether both were backlogged (each
    has had a request start and has another sent and not yet started)
  * the ratio of tokens L and S got while both were backlogged, and each
    one's throughput there as a share of its throughput alone
  * PASS/FAIL: max |served L - served S| <= the bound (the scheduler's
    counters; FAIL "not measurable" while it exports none), then a JSON
    line. Exits 0 whatever the verdict; 1 only when the stack fails.

    .venv/bin/python bench/bench_cluster_fairness.py [--quick]
"""

import argparse
import asyncio
import math
import time

from cluster_harness import PromptMaker, PromptPool, RequestRecord, closed_loop, cluster, run_main, stream_chat, warm_up
from cluster_stats import MetricsSampler, metric_value, metric_values, print_json, ratio, summary, verdict

SMALL, LARGE = "tenant-s", "tenant-l"
ENV = {
    # Contention is the point: 16 resident sequences and 1,024 blocks x 16
    # tokens (~25 of L's requests' reservations) for 64 outstanding requests.
    "SLUICE_MAX_NUM_SEQS": "16",
    "SLUICE_KV_CACHE_BLOCKS": "1024",
    "SLUICE_BLOCK_SIZE_TOKENS": "16",
    "SLUICE_MAX_NUM_BATCHED_TOKENS": "2048",
    # The VTC measure: served = input x 1 + output x 2 (the defaults,
    # stated; the client's cross-check uses the same weights), and each
    # tenant's cap of half the pool's KV.
    "SLUICE_VTC_INPUT_WEIGHT": "1",
    "SLUICE_VTC_OUTPUT_WEIGHT": "2",
    "SLUICE_TENANT_MAX_KV_SHARE": "0.5",
    # VTC's bound is for tenants that stay backlogged: the queues must hold
    # both backlogs (~3 s deep here, past the default 2 s SLO, which would
    # refuse them over_capacity and leave each tenant out of the queue
    # while it waits its Retry-After).
    "SLUICE_INTERACTIVE_TTFT_SLO_S": "30",
}
INPUT_WEIGHT, OUTPUT_WEIGHT = 1, 2
OUTSTANDING = 32
SIZES = {SMALL: (128, 32), LARGE: (512, 128)}  # (prompt tokens, max_tokens)
SERVED = "sluice_tenant_served_tokens_total"
BOUND = "sluice_fairness_bound_tokens"


async def backlog(c, key: str, tenant: str, prompts: PromptPool, duration_s: float,
                  records: list[RequestRecord]) -> None:
    max_tokens = SIZES[tenant][1]
    async with c.worker_clients(OUTSTANDING) as clients:
        await closed_loop(OUTSTANDING, duration_s, lambda i: stream_chat(
            clients[i], key, tenant, prompts.next(), max_tokens=max_tokens, sink=records),
            pause_after_refusal_s=0.2, honour_retry_after=True)


def backlogged_at(records: list[RequestRecord], t: float) -> bool:
    """By `t` one of the tenant's requests has started (so its requests reach
    the scheduler; until then the first dispatches go to whoever's arrived)
    and another was sent and neither refused nor started: it waits there."""
    started = any(r.first_token_s is not None and r.first_token_s <= t for r in records)
    return started and any(
        r.sent_s <= t and (r.first_token_s is None or r.first_token_s > t)
        and not (r.refused and r.answered_s is not None and r.answered_s <= t)
        for r in records
    )


def served_by(records: list[RequestRecord], t: float) -> int:
    """Weighted prompt tokens of requests whose first token came by `t`,
    plus weighted output tokens by `t` (the VTC measure, client-side)."""
    total = 0
    for r in records:
        if r.first_token_s is not None and r.first_token_s <= t:
            total += INPUT_WEIGHT * (r.prompt_tokens or 0) + OUTPUT_WEIGHT * r.tokens_between(-math.inf, t + 1e-9)
    return total


async def alone(c, key: str, tenant: str, prompts: PromptPool, duration_s: float) -> float:
    """Served tokens per second of `tenant` backlogged alone."""
    records: list[RequestRecord] = []
    start = time.monotonic()
    await backlog(c, key, tenant, prompts, duration_s, records)
    print(f"  {tenant} alone: {summary(records)}", flush=True)
    return served_by(records, start + duration_s) / duration_s


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 s instead of 24 s backlogged")
    args = parser.parse_args()
    duration_s = 10.0 if args.quick else 24.0
    prompts = PromptMaker(seed=4)

    with cluster(ENV, label="fairness") as c:
        keys = {tenant: c.create_key(tenant, wait=False) for tenant in (SMALL, LARGE)}
        for key in keys.values():
            c.wait_for_key(key)
        await warm_up(c, prompts)
        pools = {tenant: prompts.pool(size[0]) for tenant, size in SIZES.items()}
        # Both backlogged first, while both tenants are new to the scheduler
        # (a baseline before would leave one tenant's counter ahead).
        print(f"both backlogged for {duration_s:g} s (L's requests {SIZES[LARGE]} vs S's {SIZES[SMALL]})", flush=True)
        records: dict[str, list[RequestRecord]] = {SMALL: [], LARGE: []}
        async with MetricsSampler(c.metrics_url("scheduler")) as sampler:
            await asyncio.sleep(0.6)  # a first page before the load: counters' starting values
            start = time.monotonic()
            await asyncio.gather(*(backlog(c, keys[t], t, pools[t], duration_s, records[t]) for t in records))
        end = start + duration_s
        await asyncio.sleep(1.0)  # what was cancelled at the end leaves the pool
        print(f"baselines: each tenant alone, {OUTSTANDING} outstanding, {duration_s / 2:g} s", flush=True)
        rate_alone = {t: await alone(c, keys[t], t, pools[t], duration_s / 2) for t in (LARGE, SMALL)}

    # The bound is on service inside any interval [t1, t2) in which both
    # are backlogged: |(L - S)(t2) - (L - S)(t1)|, so the worst is the
    # spread (max - min) of L - S over that period; before both are (the
    # first dispatches go to whoever asked first) does not count.
    first_page = sampler.samples[0][1] if sampler.samples else {}
    start_served = metric_values(first_page, SERVED, "tenant")
    rows, bounds, gaps, client_gaps = [], [], [], []
    for t, page in sampler.samples:
        if not start <= t <= end:
            continue
        both = backlogged_at(records[LARGE], t) and backlogged_at(records[SMALL], t)
        served = metric_values(page, SERVED, "tenant")
        bound = metric_value(page, BOUND, **{"class": "interactive"})  # both tenants send interactive
        gap = None
        if LARGE in served or SMALL in served:
            since = {t: served.get(t, 0) - start_served.get(t, 0) for t in (LARGE, SMALL)}
            gap = since[LARGE] - since[SMALL]
        client_gap = served_by(records[LARGE], t) - served_by(records[SMALL], t)
        if both:
            if gap is not None:
                gaps.append(gap)
            client_gaps.append(client_gap)
            if bound is not None:
                bounds.append(bound)
        rows.append((t - start, gap, bound, client_gap, both))
    worst_gap = max(gaps) - min(gaps) if gaps else None
    worst_client = max(client_gaps) - min(client_gaps) if client_gaps else 0

    print(f"{'t (s)':>6} {'sched L-S':>10} {'bound':>8} {'client L-S':>11}  both backlogged")
    for t, gap, bound, client_gap, both in rows[::4] + rows[-1:]:
        print(f"{t:6.1f} {'n/a' if gap is None else f'{gap:.0f}':>10} "
              f"{'n/a' if bound is None else f'{bound:.0f}':>8} {client_gap:11d}  {'yes' if both else 'no'}")
    totals = {t: served_by(records[t], end) for t in records}
    rates = {t: totals[t] / duration_s for t in records}
    share_ratio = ratio(totals[LARGE], totals[SMALL])
    for tenant in (LARGE, SMALL):
        print(f"{tenant}: {summary(records[tenant])}; served {totals[tenant]} weighted tokens, "
              f"{rates[tenant]:.0f}/s beside "
              f"vs {rate_alone[tenant]:.0f}/s alone ({ratio(rates[tenant], rate_alone[tenant]):.2f}x)")
    print(f"ratio of served (weighted) tokens L / S while both backlogged: {share_ratio:.2f}x "
          "(client-side; 1.0 = equal)")
    bound = max(bounds) if bounds else None
    print(f"both backlogged in {len(client_gaps)} of {len(rows)} samples; "
          f"largest gap over an interval of it, |served L - S| (max - min of L - S): scheduler {'n/a' if worst_gap is None else f'{worst_gap:.0f}'}, "
          f"client {worst_client}; bound {'n/a' if bound is None else f'{bound:.0f}'}")
    measurable = worst_gap is not None and bound is not None
    print(verdict(worst_gap <= bound if measurable else None,
                  f"largest |served L - S| over an interval both were backlogged = "
                  f"{'n/a' if worst_gap is None else f'{worst_gap:.0f}'} tokens within the "
                  f"VTC bound {'n/a' if bound is None else f'{bound:.0f}'}"))
    print_json("cluster_fairness", served_ratio_l_over_s=share_ratio, max_gap_scheduler=worst_gap,
               max_gap_client=worst_client, bound_tokens=bound,
               beside_over_alone={t: ratio(rates[t], rate_alone[t]) for t in records})
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
