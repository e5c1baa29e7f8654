"""The gateway's durable outbox under streams that end together: group
commit (appends that arrive during a commit share the next fsync) against a
commit per append (`max_group_records=1`), side by side in one process.

Each round: THREADS threads (a gateway's `asyncio.to_thread` pool under a
burst of finishing streams) each append APPENDS usage records to a fresh
outbox file in a temporary directory on the same disk as the project.
Rounds alternate the two modes; prints every round, the medians of appends
a second and of the p99 append latency, their ratios, and the fsync cost
of one lone append on this disk (the ratio grows with it: on network block
storage an fsync is several milliseconds).

    .venv/bin/python bench/bench_outbox_group_commit.py [--rounds N] [--threads N]
"""

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_harness import cpu_model  # noqa: E402

from sluice.ledger.outbox import Outbox  # noqa: E402
from sluice.ledger.records import UsageRecord  # noqa: E402

APPENDS = 40
ROOT = Path(__file__).resolve().parents[1]


def record(request_id: str) -> UsageRecord:
    return UsageRecord(tenant="bench", request_id=request_id, model="m", model_version="v1", prompt_tokens=128,
                       cached_tokens=0, output_tokens=128, finish_reason="length", finished_at=datetime.now(UTC))


def one_round(threads: int, max_group_records: int) -> tuple[float, float]:
    """(appends a second, p99 append latency in ms)."""
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp, Outbox(Path(tmp) / "outbox.db",
                                                               max_group_records=max_group_records) as outbox:
        latencies: list[float] = []
        start = threading.Barrier(threads + 1)

        def worker(index: int) -> None:
            start.wait()
            for i in range(APPENDS):
                began = time.perf_counter()
                outbox.append(record(f"w{index}-{i}"))
                latencies.append(time.perf_counter() - began)

        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for thread in pool:
            thread.start()
        start.wait()
        began = time.perf_counter()
        for thread in pool:
            thread.join()
        wall_s = time.perf_counter() - began
        assert outbox.pending_count() == threads * APPENDS
    latencies.sort()
    return threads * APPENDS / wall_s, latencies[int(0.99 * (len(latencies) - 1))] * 1e3


def lone_append_ms() -> float:
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp, Outbox(Path(tmp) / "outbox.db") as outbox:
        began = time.perf_counter()
        for i in range(50):
            outbox.append(record(f"lone-{i}"))
        return (time.perf_counter() - began) / 50 * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; {args.threads} threads x {APPENDS} appends; "
          f"one lone append (an fsync'd commit) {lone_append_ms():.2f} ms")
    modes = {"group": 256, "one-each": 1}
    rate: dict[str, list[float]] = {mode: [] for mode in modes}
    p99: dict[str, list[float]] = {mode: [] for mode in modes}
    for r in range(args.rounds):
        for mode in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            per_s, tail_ms = one_round(args.threads, modes[mode])
            rate[mode].append(per_s)
            p99[mode].append(tail_ms)
        print(f"round {r + 1}: " + ", ".join(f"{mode} {rate[mode][-1]:,.0f} appends/s (p99 {p99[mode][-1]:.1f} ms)"
                                               for mode in modes), flush=True)
    group_rate, one_rate = statistics.median(rate["group"]), statistics.median(rate["one-each"])
    group_p99, one_p99 = statistics.median(p99["group"]), statistics.median(p99["one-each"])
    print(f"medians: group {group_rate:,.0f} appends/s, p99 {group_p99:.1f} ms; "
          f"one each {one_rate:,.0f} appends/s, p99 {one_p99:.1f} ms")
    print(f"ratio group / one each: {group_rate / one_rate:.2f}x appends/s, p99 latency {group_p99 / one_p99:.2f}x")
    print(json.dumps({"bench": "outbox_group_commit", "cpu": cpu_model(), "threads": args.threads,
                      "throughput_ratio": round(group_rate / one_rate, 3),
                      "p99_latency_ratio": round(group_p99 / one_p99, 3), "rates": rate, "p99_ms": p99}))


if __name__ == "__main__":
    main()
