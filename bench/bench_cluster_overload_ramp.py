"""Overload ramp: with overload stages on, does a pool driven to 3x its
capacity keep answering in time (served within the SLO, or refused fast)
and serve at least as many requests within their SLO as without stages?

One replica, a small pool: 8 seats (SLUICE_MAX_NUM_SEQS) and KV for 16 of
these requests, so seats bind first. Every request is a ~32-token prompt
with exactly 64 output tokens (ignore_eos). The interactive TTFT SLO is
2 s; with stages on, stage 4 refuses interactive requests predicted to
start later than a quarter of it (the default SLUICE_OVERLOAD_REJECT_
PREDICTED_START_S). This stack has no fallback version and no degradable
keys, so of the levers only stage 1 (batch paused) and stage 4 (early
rejection) act; stages 2 and 3 are steps on the way.

First the pool's capacity, on the first stack (stages off): a closed loop
of twice the seat count, completions per second. Then, per round on a fresh stack, Poisson
arrivals of interactive requests from four tenants, the rate ramped in
steps of 0.5x, 1x, 1.5x, 2x and 3x that capacity, plus a constant
background of batch requests (service_tier "flex", 0.15x capacity) for
stage 1 to pause. Rounds alternate stages on (SLUICE_OVERLOAD_ENABLED=true)
and off (false), in pairs with the same arrivals (seeded per pair). Without
stages plain admission still refuses a predicted start past the SLO, and a
queued request gets 429 queue_timeout after SLUICE_INTERACTIVE_MAX_QUEUE_
WAIT_S (the default 10 s, stated).

An interactive request ends one of these ways:
  good      HTTP 200 and its first token within the SLO (the goodput)
  fast 429  refused within 1 s of being sent
  slow 429  refused after 1 s but within the SLO
  late      its first token, or its refusal, came after the SLO: it waited
            past its SLO without an answer (queue_timeout 429s included)
  error     transport or stream error, or no answer before the round ended
"answered" = good + fast 429. Each request counts in the step it was sent
in, so a queue that carries work into the next step can put a step's
goodput/s above the capacity.

Prints, per round and per ramp step: offered rate, arrivals, served,
goodput (per second and share of arrivals), answered share, late, slow
429s, errors, refusal reasons, p50/p99 TTFT of served requests, and the
highest overload stage the scheduler's /metrics showed (polled every
0.2 s). Per round: where the late requests lost their time (the stage when
sent, the wait for HTTP 200, i.e. queued), the batch outcomes, the stage
changes the scheduler logged (seconds from the ramp's start; a step down
while the ramp still rises is a flap) and, with stages, how long after the
last arrival the stage was back at 0 (watched for up to 25 s). Then
medians over rounds per mode, per step and overall, the ratios stages on /
off, and PASS/FAIL lines:
  * with stages, late interactive requests per round (median over rounds)
    <= 1% of arrivals. Not 0: below stage 4 admission still takes
    predicted starts up to the SLO, so the queue built while the stage
    climbs (one entry hold per stage) and prediction error at the edge
    can put a few past it; the client's event-loop lag is in its timings
  * interactive goodput with stages / without >= 1.0
  * answered share with stages - without >= 0
and a JSON line. Exits 0 whatever the verdict; 1 only when a stack fails.

    .venv/bin/python bench/bench_cluster_overload_ramp.py [--quick]
"""

import argparse
import asyncio
import math
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from sluice.admission.overload import STAGE_NAMES, OverloadStage

from cluster_harness import (
    Cluster, PromptMaker, PromptPool, RequestRecord, cancel_all, closed_loop, cluster, cpu_model, run_main,
    stream_chat, warm_up,
)
from cluster_stats import GaugePoller, LoopLag, median, ms, percentile, print_json, ratio, verdict

TENANTS = ("acme", "globex", "initech", "umbrella")
BATCH_TENANT = "hooli"
SEATS = 8
PROMPT_TOKENS, MAX_TOKENS = 32, 64
SLO_S = 2.0
FAST_REFUSAL_S = 1.0
ENV = {
    "SLUICE_MAX_NUM_SEQS": str(SEATS),
    # A request is ~45 prompt tokens with the chat template + 64 output,
    # 7 blocks of 16: 16 requests' worth (112) fits, so the seats bind; the
    # interactive-KV signal (held + queued) enters stage 1 at 90% of it,
    # with 8 running and about 6 queued.
    "SLUICE_KV_CACHE_BLOCKS": "112",
    "SLUICE_BLOCK_SIZE_TOKENS": "16",
    "SLUICE_MAX_NUM_BATCHED_TOKENS": "2048",
    "SLUICE_INTERACTIVE_TTFT_SLO_S": str(SLO_S),
    # The defaults, stated: what a request queued without stages waits for
    # before its 429, and the stage holds.
    "SLUICE_INTERACTIVE_MAX_QUEUE_WAIT_S": "10",
    "SLUICE_OVERLOAD_ENTER_HOLD_S": "0.25",
    "SLUICE_OVERLOAD_EXIT_HOLD_S": "3.0",
    # A tenant may hold and queue up to the whole pool's KV, so refusals are
    # the pool's; a few tenant_kv_share ones remain where one tenant's share
    # of a long queue (stages off) or the batch tenant's backlog reaches it.
    "SLUICE_TENANT_MAX_KV_SHARE": "1.0",
}
RAMP = (0.5, 1.0, 1.5, 2.0, 3.0)  # x capacity
BATCH_SHARE = 0.15  # batch arrivals, x capacity, all through the ramp
# After the last arrival: long enough for a queued request's queue_timeout
# (10 s) and its service; whatever is left then is cancelled (an error).
DRAIN_S = 16.0
STAGE = "sluice_overload_stage"
STAGE_POLL_S = 0.2  # under the 0.25 s entry hold: no stage goes unseen
# With stages on, how long after the last arrival the stage is watched for
# its return to 0: four steps down, each after SLUICE_OVERLOAD_EXIT_HOLD_S
# of clear signals, take 12 s at least.
RECOVERY_WAIT_S = 25.0


# ------------------------------------------------------------------ load


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float  # from the ramp's start
    step: int  # index into RAMP; -1 for batch
    tenant: str


def arrivals(capacity_per_s: float, step_s: float, seed: int) -> list[Arrival]:
    """Poisson arrivals for the whole ramp, interactive and batch, by time."""
    rng = random.Random(seed)
    out = []
    for step, factor in enumerate(RAMP):
        t = step * step_s
        while True:
            t += rng.expovariate(factor * capacity_per_s)
            if t >= (step + 1) * step_s:
                break
            out.append(Arrival(t, step, rng.choice(TENANTS)))
    t = 0.0
    while True:
        t += rng.expovariate(BATCH_SHARE * capacity_per_s)
        if t >= len(RAMP) * step_s:
            break
        out.append(Arrival(t, -1, BATCH_TENANT))
    return sorted(out, key=lambda a: a.at_s)


async def send_all(c: Cluster, keys: dict[str, str], plan: list[Arrival], prompts: PromptPool,
                   ) -> list[tuple[Arrival, RequestRecord]]:
    """Each arrival at its time on its own task; all answered or cancelled
    DRAIN_S after the last one."""
    sent: list[tuple[Arrival, list[RequestRecord]]] = []
    tasks = []
    async with c.client() as client:
        start = time.monotonic()
        for arrival in plan:
            await asyncio.sleep(max(0.0, start + arrival.at_s - time.monotonic()))
            sink: list[RequestRecord] = []
            sent.append((arrival, sink))
            tasks.append(asyncio.ensure_future(stream_chat(
                client, keys[arrival.tenant], arrival.tenant, prompts.next(), max_tokens=MAX_TOKENS,
                service_tier="flex" if arrival.step < 0 else None, sink=sink)))
        if tasks:
            await asyncio.wait(tasks, timeout=DRAIN_S)
        await cancel_all(tasks)
    return [(arrival, sink[0]) for arrival, sink in sent if sink]


async def measure_capacity(c: Cluster, keys: dict[str, str], prompts: PromptPool, window_s: float,
                           ) -> tuple[float, float]:
    """Completions per second of a closed loop of twice the seat count over
    the four tenants (the first second left out, while it fills), and the
    median time from placement to the last token. Twice: with exactly one
    client per seat, each seat idles for a client round trip between two
    requests, which an overloaded pool, with its queue, never does."""
    records: list[RequestRecord] = []
    async with c.worker_clients(2 * SEATS) as clients:
        start = time.monotonic()
        await closed_loop(2 * SEATS, window_s + 1.0, lambda i: stream_chat(
            clients[i], keys[TENANTS[i % len(TENANTS)]], TENANTS[i % len(TENANTS)], prompts.next(),
            max_tokens=MAX_TOKENS, sink=records))
    done = [r for r in records if r.finished and r.token_times_s and r.token_times_s[-1] >= start + 1.0]
    return len(done) / window_s, median([r.token_times_s[-1] - r.answered_s for r in done])


STAGE_ORDER = tuple(STAGE_NAMES[stage] for stage in OverloadStage)  # the names the scheduler logs
STAGE_LINE = re.compile(r"^(\S+ \S+) WARNING .*overload stage of \S+: (\w+) -> (\w+)")


def stage_changes(log: str, ramp_start_wall: datetime) -> list[tuple[float, str, str]]:
    """(seconds from the ramp's start, from, to) of each stage change the scheduler logged."""
    changes = []
    for line in log.splitlines():
        match = STAGE_LINE.match(line)
        if match:
            at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            changes.append(((at - ramp_start_wall).total_seconds(), match.group(2), match.group(3)))
    return changes


def stage_name(value: float | None) -> str:
    return "n/a" if value is None else str(int(value))


def down_steps(changes: list[tuple[float, str, str]], ramp_s: float) -> int:
    """Stage changes downwards before the ramp ended: the load only rose
    then, so each one is the controller letting go under load (a flap)."""
    order = list(STAGE_ORDER)
    return sum(0 <= at < ramp_s and order.index(b) < order.index(a) for at, a, b in changes)


# ------------------------------------------------------------------ figures


def outcome(r: RequestRecord) -> str:
    if r.status == 200:
        if r.error or r.cancelled or r.ttft_s is None:
            return "error"
        return "good" if r.ttft_s <= SLO_S else "late"
    if r.refused:
        waited_s = r.time_to_answer_s
        if waited_s <= FAST_REFUSAL_S:
            return "fast_429"
        return "slow_429" if waited_s <= SLO_S else "late"
    return "error"  # transport error, or no answer before the round ended


@dataclass(slots=True)
class Figures:
    """One step's (or a round's) interactive requests."""

    duration_s: float
    records: list[RequestRecord]
    max_stage: float | None = None
    outcomes: Counter = field(init=False)

    def __post_init__(self) -> None:
        self.outcomes = Counter(outcome(r) for r in self.records)

    @property
    def arrivals(self) -> int:
        return len(self.records)

    @property
    def served(self) -> int:
        return sum(r.status == 200 and r.finished for r in self.records)

    @property
    def good(self) -> int:
        return self.outcomes["good"]

    @property
    def goodput_per_s(self) -> float:
        return self.good / self.duration_s

    @property
    def answered_share(self) -> float:
        return ratio(self.good + self.outcomes["fast_429"], self.arrivals)

    @property
    def late(self) -> int:
        return self.outcomes["late"]

    def ttfts(self) -> list[float]:
        return [r.ttft_s for r in self.records if r.status == 200 and r.ttft_s is not None]

    def describe(self) -> str:
        reasons = Counter(r.reject_reason or str(r.status) for r in self.records if r.refused)
        stage = stage_name(self.max_stage)
        return (f"{self.arrivals:4d} sent, served {self.served:3d}, good {self.good:3d} "
                f"({self.goodput_per_s:5.2f}/s, {ratio(self.good, self.arrivals):4.0%}), "
                f"answered {self.answered_share:4.0%}, late {self.late:3d}, slow 429 {self.outcomes['slow_429']:2d}, "
                f"errors {self.outcomes['error']:2d}, TTFT p50 {ms(median(self.ttfts()))} "
                f"p99 {ms(percentile(self.ttfts(), 99))}, max stage {stage}, refused {dict(reasons)}")


@dataclass(slots=True)
class Round:
    stages_on: bool
    steps: list[Figures]
    total: Figures
    changes: list[tuple[float, str, str]]
    down_steps: int
    recovered_s: float | None  # stages on: from the last arrival to stage 0 again


async def run_round(index: int, rounds: int, stages_on: bool, seed: int, capacity_per_s: float | None,
                    step_s: float, prompts: PromptMaker) -> tuple[Round, float]:
    """One ramp on a fresh stack; on the first, the capacity is measured first."""
    env = {**ENV, "SLUICE_OVERLOAD_ENABLED": "true" if stages_on else "false"}
    with cluster(env, label="overload-ramp") as c:
        keys = {tenant: c.create_key(tenant, wait=False) for tenant in (*TENANTS, BATCH_TENANT)}
        for key in keys.values():
            c.wait_for_key(key)
        await warm_up(c, prompts)
        pool = prompts.pool(PROMPT_TOKENS, 256)
        if capacity_per_s is None:
            # The first round is one without stages: the closed loop's
            # queue would move them.
            capacity_per_s, service_s = await measure_capacity(c, keys, pool, step_s)
            print(f"capacity: {capacity_per_s:.2f} requests/s at {SEATS} seats (closed loop of {2 * SEATS}, "
                  f"{step_s:g} s; median placement to last token {ms(service_s)}, so {SEATS / service_s:.2f}/s by "
                  f"seats / service time)", flush=True)
            await asyncio.sleep(1.0)
        plan = arrivals(capacity_per_s, step_s, seed)
        print(f"round {index + 1}/{rounds}: {'stages on' if stages_on else 'stages off'}, "
              f"{sum(a.step >= 0 for a in plan)} interactive + {sum(a.step < 0 for a in plan)} batch arrivals, "
              f"steps of {step_s:g} s at {', '.join(f'{f * capacity_per_s:.1f}' for f in RAMP)}/s", flush=True)
        start_wall = datetime.now()
        async with GaugePoller(c.metrics_url("scheduler"), STAGE, STAGE_POLL_S) as poller, LoopLag() as lag:
            start = time.monotonic()
            results = await send_all(c, keys, plan, pool)
            # A stage that does not come down once the load has gone is stuck.
            recovered_s = await poller.wait_for(0, start + len(RAMP) * step_s, RECOVERY_WAIT_S) if stages_on else None
        changes = stage_changes(c.stack.log("scheduler"), start_wall)
    steps = []
    for step, factor in enumerate(RAMP):
        records = [r for a, r in results if a.step == step]
        steps.append(Figures(step_s, records, poller.max_between(start + step * step_s, start + (step + 1) * step_s)))
        print(f"  {factor:3g}x {factor * capacity_per_s:5.1f}/s: {steps[-1].describe()}", flush=True)
    total = Figures(len(RAMP) * step_s, [r for a, r in results if a.step >= 0],
                    poller.max_between(start, math.inf))
    print(f"  all      : {total.describe()}")
    print(f"  {late_breakdown(total.records, poller)}")
    batch = [r for a, r in results if a.step < 0]
    batch_reasons = Counter(r.reject_reason or str(r.status) for r in batch if r.refused)
    print(f"  batch: {len(batch)} sent, served {sum(r.status == 200 and r.finished for r in batch)}, refused "
          f"{dict(batch_reasons)}, errors {sum(outcome(r) == 'error' for r in batch)}")
    timeline = " ".join(f"{at:.1f}s {a}->{b}" for at, a, b in changes)
    print(f"  stage changes ({len(changes)}; {down_steps(changes, len(RAMP) * step_s)} down-steps while the ramp "
          f"rose): {timeline or 'none'}")
    if stages_on:
        print(f"  stage back to normal: {recovery(recovered_s)} after the last arrival (at least 4 stages x the "
              f"{ENV['SLUICE_OVERLOAD_EXIT_HOLD_S']} s exit hold)")
    print(f"  {lag.describe()}", flush=True)
    return Round(stages_on, steps, total, changes, down_steps(changes, len(RAMP) * step_s),
                 recovered_s), capacity_per_s


def late_breakdown(records: list[RequestRecord], poller: GaugePoller) -> str:
    """Where the late ones lost their time: the stage when each was sent,
    and its wait for HTTP 200 (queued in the scheduler until placed on the
    replica) beside the rest of its time to first token (prefill, streaming)."""
    late = [r for r in records if outcome(r) == "late"]
    if not late:
        return "late requests: none"
    stages = Counter(stage_name(poller.at(r.sent_s)) for r in late)
    served = [r for r in late if r.status == 200]
    placed = [r.time_to_answer_s for r in served]
    rest = [r.ttft_s - r.time_to_answer_s for r in served]
    refused = Counter(r.reject_reason for r in late if r.refused)
    return (f"late requests: {len(late)}, by stage when sent {dict(sorted(stages.items()))}; served late: "
            f"{len(served)}, median wait for HTTP 200 {ms(median(placed))} (max {ms(max(placed, default=math.nan))}), "
            f"then to first token {ms(median(rest))}; refused late {dict(refused)}")


# ------------------------------------------------------------------ summary


def recovery(seconds: float | None) -> str:
    return f"not within {RECOVERY_WAIT_S:g} s" if seconds is None else f"{seconds:.1f} s"


def summarise(rounds: list[Round], capacity_per_s: float) -> None:
    by_mode = {on: [r for r in rounds if r.stages_on is on] for on in (True, False)}
    medians = {}
    for on, group in by_mode.items():
        m = {
            "goodput_per_s": median([r.total.goodput_per_s for r in group]),
            "goodput_share": median([ratio(r.total.good, r.total.arrivals) for r in group]),
            "answered_share": median([r.total.answered_share for r in group]),
            "late": median([r.total.late for r in group]),
            "late_share": median([ratio(r.total.late, r.total.arrivals) for r in group]),
            "errors": median([r.total.outcomes["error"] for r in group]),
            "p99_ttft_s": median([percentile(r.total.ttfts(), 99) for r in group]),
            "max_stage": int(max((r.total.max_stage or 0 for r in group), default=0)),
            "stage_changes": median([len(r.changes) for r in group]),
            "down_steps_while_rising": median([r.down_steps for r in group]),
            "steps_goodput_per_s": [median([r.steps[i].goodput_per_s for r in group]) for i in range(len(RAMP))],
            "steps_answered_share": [median([r.steps[i].answered_share for r in group]) for i in range(len(RAMP))],
            "steps_late": [median([r.steps[i].late for r in group]) for i in range(len(RAMP))],
        }
        medians["on" if on else "off"] = m
        name = "stages on " if on else "stages off"
        print(f"{name} (median of {len(group)}): goodput {m['goodput_per_s']:.2f}/s ({m['goodput_share']:.0%} of "
              f"arrivals), answered {m['answered_share']:.1%}, late {m['late']:g} ({m['late_share']:.1%}), errors "
              f"{m['errors']:g}, p99 TTFT {ms(m['p99_ttft_s'])}, max stage {m['max_stage']}, "
              f"{m['stage_changes']:g} stage changes ({m['down_steps_while_rising']:g} down while the ramp rose)")
        print(f"  per step {'/'.join(f'{f:g}x' for f in RAMP)}: goodput/s "
              f"{' '.join(f'{g:.2f}' for g in m['steps_goodput_per_s'])}; answered "
              f"{' '.join(f'{a:.0%}' for a in m['steps_answered_share'])}; late "
              f"{' '.join(f'{x:g}' for x in m['steps_late'])}")
    on, off = medians["on"], medians["off"]
    recoveries = [r.recovered_s for r in by_mode[True]]
    on["recovered_s"] = None if None in recoveries else median(recoveries)
    print(f"stages on: back to stage 0 after the last arrival in {', '.join(recovery(x) for x in recoveries)}")
    goodput_ratio = ratio(on["goodput_per_s"], off["goodput_per_s"])
    answered_diff = on["answered_share"] - off["answered_share"]
    print(f"stages on / off: goodput {goodput_ratio:.2f}x, answered share {answered_diff:+.1%} "
          f"({on['answered_share']:.1%} vs {off['answered_share']:.1%}), late {on['late']:g} vs {off['late']:g}")
    print(verdict(None if math.isnan(on["late_share"]) else on["late_share"] <= 0.01,
                  f"with stages, interactive requests that waited past the {SLO_S:g} s SLO without an answer: "
                  f"{on['late']:g} per round ({on['late_share']:.1%} of arrivals; target <= 1%)"))
    print(verdict(None if math.isnan(goodput_ratio) else goodput_ratio >= 1.0,
                  f"interactive goodput with stages / without = {goodput_ratio:.2f}x (target >= 1.0)"))
    print(verdict(None if math.isnan(answered_diff) else answered_diff >= 0,
                  f"answered share with stages - without = {answered_diff:+.1%} (target >= 0)"))
    print_json("cluster_overload_ramp", capacity_per_s=capacity_per_s, goodput_ratio=goodput_ratio,
               answered_share_diff=answered_diff, stages_on=on, stages_off=off, ramp=list(RAMP))


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round per mode, 4 s steps (instead of 2, 6 s)")
    args = parser.parse_args()
    pairs, step_s = (1, 4.0) if args.quick else (2, 6.0)
    print(f"CPU: {cpu_model()}", flush=True)
    prompts = PromptMaker(seed=9)
    capacity_per_s = None
    rounds: list[Round] = []
    # Off first in odd pairs (the capacity is measured on the first), on
    # first in even ones: a drift of the machine does not favour one mode.
    order = [on for pair in range(pairs) for on in ((False, True) if pair % 2 == 0 else (True, False))]
    for index, stages_on in enumerate(order):
        # The same arrivals for both modes of a pair; another set per pair.
        result, capacity_per_s = await run_round(index, len(order), stages_on, 100 + index // 2, capacity_per_s,
                                                 step_s, prompts)
        rounds.append(result)
    summarise(rounds, capacity_per_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
