"""Numbers for the cluster benchmarks: /metrics pages (parsed, sampled while
a phase runs), percentiles and ratios, and the printed verdicts."""

from __future__ import annotations

from collections import Counter
import asyncio
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families


# ------------------------------------------------------------------ metrics


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def metric_values(samples: dict, name: str, label: str, **match: str) -> dict[str, float]:
    """label value -> the sum of `name`'s samples with that value (and the
    `match` labels), e.g. served tokens per tenant over all classes."""
    values: dict[str, float] = {}
    for (sample_name, labels), value in samples.items():
        labels = dict(labels)
        if sample_name == name and all(labels.get(k) == v for k, v in match.items()):
            key = labels.get(label, "")
            values[key] = values.get(key, 0.0) + value
    return values


def metric_value(samples: dict, name: str, **match: str) -> float | None:
    """The sum of `name`'s samples with the `match` labels; None if it has none."""
    values = [value for (sample_name, labels), value in samples.items()
              if sample_name == name and all(dict(labels).get(k) == v for k, v in match.items())]
    return sum(values) if values else None


class _Probe:
    """Runs `_run` in the background while in its `async with`."""

    _task: asyncio.Task | None = None

    async def __aenter__(self):
        self._task = asyncio.ensure_future(self._run())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        raise NotImplementedError


class MetricsSampler(_Probe):
    """Scrapes one /metrics page every `interval_s` while in its `async with`."""

    def __init__(self, url: str, interval_s: float = 0.5) -> None:
        self.url = url
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict]] = []  # (monotonic time, parsed page)

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                started = time.monotonic()
                try:
                    self.samples.append((started, parse_metrics((await client.get(self.url)).text)))
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))


# ------------------------------------------------------------------ CPU


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # past the name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


class CoresUsed:
    """Cores each named process kept busy between construction and `read()`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._started_s = time.monotonic()
        self._cpu_s = {name: process_cpu_s(pid) for name, pid in pids.items()}

    def read(self) -> dict[str, float]:
        wall_s = max(time.monotonic() - self._started_s, 1e-9)
        return {name: (process_cpu_s(pid) - self._cpu_s[name]) / wall_s for name, pid in self.pids.items()}


@dataclass(frozen=True, slots=True)
class ThreadTimes:
    """One thread's scheduler accounting (/proc/PID/task/TID): how long it
    ran, how long it was runnable but waiting for a core, and how often it
    stopped: blocked (a lock, the GIL, a sleep, I/O) or preempted."""

    on_core_s: float
    waiting_s: float
    blocked: int
    preempted: int

    def since(self, earlier: ThreadTimes) -> ThreadTimes:
        return ThreadTimes(self.on_core_s - earlier.on_core_s, self.waiting_s - earlier.waiting_s,
                           self.blocked - earlier.blocked, self.preempted - earlier.preempted)


NO_TIME = ThreadTimes(0.0, 0.0, 0, 0)  # a thread born after the first reading


def thread_times(pid: int) -> dict[int, ThreadTimes]:
    """Per thread id of `pid`; {} where the kernel keeps no schedstat."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            on_core_ns, waiting_ns, _ = (task / "schedstat").read_text().split()
            status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # the thread ended, or no schedstat
        times[int(task.name)] = ThreadTimes(int(on_core_ns) / 1e9, int(waiting_ns) / 1e9,
                                            int(status["voluntary_ctxt_switches"]),
                                            int(status["nonvoluntary_ctxt_switches"]))
    return times


class CoreWaits:
    """What each named process's threads did between construction and
    `read()`: cores' worth on a core and cores' worth runnable but waiting
    for one (a process whose threads wait while it has work is short of CPU,
    whatever its CPU seconds say), and its busiest thread apart."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self._started_s = time.monotonic()
        self._before = {name: thread_times(pid) for name, pid in pids.items()}

    def read(self) -> dict[str, dict[str, float]]:
        wall_s = max(time.monotonic() - self._started_s, 1e-9)
        out = {}
        for name, pid in self.pids.items():
            before, after = self._before[name], thread_times(pid)
            deltas = [now.since(before.get(tid, NO_TIME)) for tid, now in after.items()]
            if not deltas:
                continue
            busiest = max(deltas, key=lambda t: t.on_core_s)
            out[name] = {
                "on_core": sum(t.on_core_s for t in deltas) / wall_s,
                "waiting": sum(t.waiting_s for t in deltas) / wall_s,
                "busiest_on_core": busiest.on_core_s / wall_s, "busiest_waiting": busiest.waiting_s / wall_s,
                "busiest_blocked_per_s": busiest.blocked / wall_s,
                "busiest_preempted_per_s": busiest.preempted / wall_s,
            }
        return out


def describe_cores(cores: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.2f}" for name, value in cores.items()) + f"; total {sum(cores.values()):.2f}"


# ------------------------------------------------------------------ statistics


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: list[float]) -> float:
    return percentile(values, 50)


def ratio(numerator: float, denominator: float) -> float:
    if denominator == 0 or math.isnan(numerator) or math.isnan(denominator):
        return math.nan
    return numerator / denominator


def ms(seconds: float | None) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds * 1000:.0f} ms"


def verdict(passed: bool | None, text: str) -> str:
    """The PASS/FAIL line; None (no measurement) is a FAIL that says so."""
    return f"{'PASS' if passed else 'FAIL'}: {text}" + ("" if passed is not None else " (not measurable)")


def summary(records: list) -> str:
    """Counts of a list of cluster_harness.RequestRecord."""
    ok = [r for r in records if r.status == 200]
    refused = [r for r in records if r.refused]
    errors = [r for r in records if r.error]
    reasons = Counter(r.reject_reason or "none" for r in refused)
    why = f" {dict(reasons)}" if reasons else ""
    kinds = Counter(r.error[:60] for r in errors)
    what = f" {dict(kinds.most_common(3))}" if kinds else ""
    return (f"{len(records)} requests: {len(ok)} admitted ({sum(r.finished for r in ok)} finished), "
            f"{len(refused)} refused{why}, {len(errors)} errors{what}")


def print_json(bench: str, **values) -> None:
    def clean(value):
        if isinstance(value, float):
            return None if math.isnan(value) else round(value, 4)
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    print(json.dumps({"bench": bench, **clean(values)}), flush=True)


class LoopLag(_Probe):
    """How late this process's event loop wakes up while in its `async with`:
    the client shares the machine with the services, and a refusal or a
    first token it timestamps late is its lag, not the server's."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.lags_s: list[float] = []

    async def _run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.interval_s)
            self.lags_s.append(time.monotonic() - before - self.interval_s)

    def describe(self) -> str:
        return f"client event-loop lag p50 {ms(median(self.lags_s))}, p99 {ms(percentile(self.lags_s, 99))}"


class GaugePoller(_Probe):
    """One gauge from a /metrics page every `interval_s` while in its
    `async with`: the highest value over its label sets (e.g. the overload
    stage of the busiest pool). Only the gauge's own lines are read, not
    the whole page parsed, so polling often costs the shared CPUs little."""

    def __init__(self, url: str, name: str, interval_s: float = 0.2) -> None:
        self.url = url
        self.name = name
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (monotonic time, value)

    async def _run(self) -> None:
        prefixes = (self.name + "{", self.name + " ")
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                started = time.monotonic()
                try:
                    lines = (await client.get(self.url)).text.splitlines()
                    values = [float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefixes)]
                    if values:
                        self.samples.append((started, max(values)))
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    def at(self, t_s: float) -> float | None:
        """The last value sampled at or before `t_s`."""
        seen = [value for t, value in self.samples if t <= t_s]
        return seen[-1] if seen else None

    def max_between(self, start_s: float, end_s: float) -> float | None:
        seen = [value for t, value in self.samples if start_s <= t < end_s]
        return max(seen) if seen else None

    async def wait_for(self, value: float, since_s: float, timeout_s: float) -> float | None:
        """Seconds from `since_s` to the first sample equal to `value`, waiting
        until `since_s + timeout_s` at most; None if none came."""
        while True:
            seen = [t for t, v in self.samples if t >= since_s and v == value]
            if seen:
                return seen[0] - since_s
            if time.monotonic() >= since_s + timeout_s:
                return None
            await asyncio.sleep(self.interval_s)
