"""Long prompts: do near-context prompts stall the streams already decoding?

One stack (one replica). 32 chat streams are kept decoding (short prompts,
max_tokens 150-250, ~200 on average, ignore_eos; each finished stream is
replaced at once; the spread of lengths and a staggered start keep the
streams from finishing, and being replaced, all at once).
Loaded phase: while they run, eight prompts of ~90% of the model's context
(max_position_embeddings in the checkpoint's config.json) arrive, evenly
spread over the window. Baseline, first, on the same stack: the 32 chats
alone for the same time. TTFT counts only chats sent after the first 2 s of
a phase (the initial burst of 32 is the same in both and says nothing about
long prompts).

Prints
  * the chats' p99 inter-token latency / their median, beside the long
    prompts                                        (target <= 3)
  * the chats' p99 TTFT beside the long prompts / alone (target <= 2)
and the same ITL figure for the baseline, the long prompts' own TTFT, then
PASS/FAIL lines and a JSON line. Exits 0 whatever the verdict; 1 only when
the stack fails.

    .venv/bin/python bench/bench_cluster_long_prompts.py [--quick]
"""

import argparse
import asyncio
import math
import random
import time

from cluster_harness import (
    PromptMaker, PromptPool, RequestRecord, closed_loop, cluster, context_tokens, run_main, stream_chat, warm_up,
)
from cluster_stats import median, ms, percentile, print_json, ratio, summary, verdict

TENANT = "acme"
ENV = {
    # The step's token budget is what chunks a long prefill, so it is set
    # here rather than inherited; KV holds all 32 chats and all 8 long
    # prompts at once (8,192 blocks x 16 = 131k tokens), so no one waits for
    # memory and the figure is about step scheduling alone.
    "SLUICE_MAX_NUM_BATCHED_TOKENS": "2048",
    "SLUICE_KV_CACHE_BLOCKS": "8192",
    "SLUICE_BLOCK_SIZE_TOKENS": "16",
    "SLUICE_MAX_NUM_SEQS": "128",
    # Prompts this long take the scheduler's long-prefill lane, this many
    # at a time per replica (the defaults, stated).
    "SLUICE_LONG_PROMPT_TOKENS": "2048",
    "SLUICE_LONG_PREFILLS_PER_REPLICA": "1",
}
CHATS = 32
CHAT_PROMPT_TOKENS = 32
CHAT_MAX_TOKENS = (150, 250)  # uniform; --quick halves it so replacements happen inside its shorter window
LONG_PROMPTS = 8
LONG_SHARE_OF_CONTEXT = 0.9
LONG_MAX_TOKENS = 16
TTFT_SKIP_S = 2.0


async def chats(c, key: str, prompts: PromptPool, duration_s: float,
                max_tokens: tuple[int, int]) -> tuple[list[RequestRecord], float]:
    records: list[RequestRecord] = []
    lengths = random.Random(7)  # the same sequence of lengths in both phases
    first = set()

    async def send(index: int) -> RequestRecord:
        if index not in first:  # stagger the initial 32 over the first second
            first.add(index)
            await asyncio.sleep(index / CHATS)
        return await stream_chat(clients[index], key, TENANT, prompts.next(),
                                 max_tokens=lengths.randint(*max_tokens), sink=records)

    start = time.monotonic()
    async with c.worker_clients(CHATS) as clients:
        await closed_loop(CHATS, duration_s, send, pause_after_refusal_s=0.2)
    return records, start


async def long_prompts(c, key: str, texts: list[str], duration_s: float) -> list[RequestRecord]:
    """One arrival per text, spread over the middle of the window."""
    records: list[RequestRecord] = []
    async with c.client() as client:
        tasks = []
        start = time.monotonic()
        spacing_s = 0.8 * duration_s / len(texts)
        for index, text in enumerate(texts):
            await asyncio.sleep(max(0.0, start + 0.1 * duration_s + index * spacing_s - time.monotonic()))
            tasks.append(asyncio.ensure_future(
                stream_chat(client, key, TENANT, text, max_tokens=LONG_MAX_TOKENS, sink=records)))
        await asyncio.wait(tasks, timeout=max(1.0, start + duration_s + 30.0 - time.monotonic()))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return records


def gaps(records: list[RequestRecord]) -> list[float]:
    return [g for r in records for g in r.inter_token_gaps_s()]


def late_ttfts(records: list[RequestRecord], start_s: float) -> list[float]:
    return [r.ttft_s for r in records if r.ttft_s is not None and r.sent_s >= start_s + TTFT_SKIP_S]


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 s phases instead of 20 s, chats half as long")
    args = parser.parse_args()
    duration_s = 10.0 if args.quick else 20.0
    chat_max_tokens = (CHAT_MAX_TOKENS[0] // 2, CHAT_MAX_TOKENS[1] // 2) if args.quick else CHAT_MAX_TOKENS
    long_tokens = int(LONG_SHARE_OF_CONTEXT * context_tokens())
    prompts = PromptMaker(seed=3)

    with cluster(ENV, label="long-prompts") as c:
        key = c.create_key(TENANT)
        await warm_up(c, prompts)
        print(f"baseline: {CHATS} chats alone for {duration_s:g} s", flush=True)
        alone, alone_start = await chats(c, key, prompts.pool(CHAT_PROMPT_TOKENS), duration_s, chat_max_tokens)
        print(f"loaded: {CHATS} chats + {LONG_PROMPTS} prompts of {long_tokens} tokens", flush=True)
        texts = [prompts.text(long_tokens) for _ in range(LONG_PROMPTS)]  # made before, not while, timing
        chat_prompts = prompts.pool(CHAT_PROMPT_TOKENS)
        long_task = asyncio.ensure_future(long_prompts(c, key, texts, duration_s))
        beside, beside_start = await chats(c, key, chat_prompts, duration_s, chat_max_tokens)
        longs = await long_task

    itl_alone, itl_beside = gaps(alone), gaps(beside)
    itl_ratio_alone = ratio(percentile(itl_alone, 99), median(itl_alone))
    itl_ratio = ratio(percentile(itl_beside, 99), median(itl_beside))
    ttft_alone = percentile(late_ttfts(alone, alone_start), 99)
    ttft_beside = percentile(late_ttfts(beside, beside_start), 99)
    ttft_ratio = ratio(ttft_beside, ttft_alone)
    print(f"chats alone : {summary(alone)}; ITL p50 {ms(median(itl_alone))}, p99 {ms(percentile(itl_alone, 99))} "
          f"({itl_ratio_alone:.2f}x); TTFT p99 {ms(ttft_alone)}")
    print(f"chats beside: {summary(beside)}; ITL p50 {ms(median(itl_beside))}, p99 {ms(percentile(itl_beside, 99))} "
          f"({itl_ratio:.2f}x); TTFT p99 {ms(ttft_beside)}")
    prompt_sizes = sorted({r.prompt_tokens for r in longs if r.prompt_tokens})
    print(f"long prompts: {summary(longs)}; prompt tokens {prompt_sizes[:1] + prompt_sizes[-1:]}, TTFT p50 "
          f"{ms(median([r.ttft_s for r in longs if r.ttft_s]))}, refusals "
          f"{sorted({r.reject_reason for r in longs if r.refused})}")
    print(f"ratios: chats' p99/median ITL beside long prompts {itl_ratio:.2f}x (alone {itl_ratio_alone:.2f}x), "
          f"chats' p99 TTFT beside / alone {ttft_ratio:.2f}x")
    print(verdict(None if math.isnan(itl_ratio) else itl_ratio <= 3.0,
                  f"chats' p99 / median inter-token latency beside long prompts = {itl_ratio:.2f}x (target <= 3)"))
    print(verdict(None if math.isnan(ttft_ratio) else ttft_ratio <= 2.0,
                  f"chats' p99 TTFT beside long prompts / alone = {ttft_ratio:.2f}x (target <= 2)"))
    print_json("cluster_long_prompts", itl_p99_over_median=itl_ratio, itl_p99_over_median_alone=itl_ratio_alone,
               chat_p99_ttft_ratio=ttft_ratio, chat_p99_ttft_alone_s=ttft_alone, chat_p99_ttft_beside_s=ttft_beside,
               long_prompt_tokens=long_tokens, long_admitted=sum(r.status == 200 for r in longs))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
