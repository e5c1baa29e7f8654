"""Production request traces: read one, describe it, replay it faster or slower.

The format is the Azure LLM inference trace's (Azure Public Dataset, "Azure
LLM inference trace 2023", CC-BY 4.0; Patel et al., "Splitwise: Efficient
generative LLM inference using phase splitting", ISCA 2024): a CSV with a
header and one row per request, in arrival order:

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44
    2023-11-16 18:15:50.9951690,396,109

TIMESTAMP is the arrival (7 fractional digits, i.e. 100 ns, which is more
than `datetime` holds, so the fraction is parsed here; an ISO `T` and a UTC
offset are accepted too), ContextTokens the prompt and GeneratedTokens the
output. A trace carries no prompt text: a replay sends synthetic prompts of
the given sizes and forces the output length (ignore_eos, max_tokens).
Columns are found by name, so extra columns and another order are fine.
"""

from __future__ import annotations

import csv
import math
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sluice.sim.workload import DEFAULT_TENANTS, SERVICE_CLASSES, SimRequest, request_id, seed_mix

TIMESTAMP_COLUMN = "TIMESTAMP"
PROMPT_COLUMN = "ContextTokens"
OUTPUT_COLUMN = "GeneratedTokens"

_NS_PER_S = 1_000_000_000
# Whole seconds, an optional fraction of any length, an optional UTC offset.
_TIMESTAMP = re.compile(r"(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d+))?(Z|[+-]\d{2}:?\d{2})?")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One traced request. `arrival_s` is seconds after the trace's first
    arrival. `output_tokens` may be 0 (a traced request that produced
    nothing, e.g. cancelled); a replay still generates one token for it."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class TraceStats:
    """What a trace holds. `mean_rate_per_s` is 1 / the mean gap between
    arrivals, (count - 1) / duration_s: the quantity a replay's `rate_scale`
    multiplies (infinite when every row arrives at one instant).
    Percentiles are nearest-rank, so each is a value the trace contains."""

    count: int
    duration_s: float
    mean_rate_per_s: float
    prompt_p50_tokens: int
    prompt_p99_tokens: int
    output_p50_tokens: int
    output_p99_tokens: int


def _epoch_ns(text: str) -> int:
    """Nanoseconds since the epoch; a timestamp without an offset is taken
    as UTC (only differences matter, and UTC has no DST jumps)."""
    match = _TIMESTAMP.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a timestamp: {text!r}")
    whole, fraction, offset = match.groups()
    stamp = datetime.fromisoformat(whole + (offset or ""))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    # Whole seconds are exact in a float's 53 bits; the fraction stays an int.
    fraction_ns = int((fraction or "0")[:9].ljust(9, "0"))
    return int(stamp.timestamp()) * _NS_PER_S + fraction_ns


def _tokens(text: str, column: str) -> int:
    try:
        tokens = int(text)
    except ValueError:
        raise ValueError(f"{column} is not an integer: {text!r}") from None
    if tokens < 0:
        raise ValueError(f"{column} is negative: {tokens}")
    return tokens


def read_trace(path: str | os.PathLike[str]) -> tuple[TraceRow, ...]:
    """The rows of a trace file, in arrival order, times relative to the
    earliest arrival. Blank lines are skipped; any other row that does not
    parse raises a ValueError naming the file and line."""
    rows: list[tuple[int, int, int]] = []  # (epoch ns, prompt, output)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: empty file, expected a header "
                             f"{TIMESTAMP_COLUMN},{PROMPT_COLUMN},{OUTPUT_COLUMN}")
        names = [name.strip().lstrip("\ufeff") for name in header]
        try:
            columns = [names.index(c) for c in (TIMESTAMP_COLUMN, PROMPT_COLUMN, OUTPUT_COLUMN)]
        except ValueError:
            raise ValueError(f"{path}:{reader.line_num}: header {names} lacks one of "
                             f"{TIMESTAMP_COLUMN}, {PROMPT_COLUMN}, {OUTPUT_COLUMN}") from None
        width = max(columns) + 1
        t_col, p_col, o_col = columns
        # Rows arrive several per second: parse each whole second once.
        last_whole, last_whole_ns = "", 0
        for fields in reader:
            if not fields or all(not field.strip() for field in fields):
                continue
            try:
                if len(fields) < width:
                    raise ValueError(f"expected at least {width} fields, got {len(fields)}")
                stamp = fields[t_col].strip()
                whole, dot, rest = stamp.partition(".")
                if dot and whole == last_whole and rest.isdigit():
                    ns = last_whole_ns + int(rest[:9].ljust(9, "0"))
                else:
                    ns = _epoch_ns(stamp)
                    if dot and rest.isdigit():
                        last_whole, last_whole_ns = whole, ns - int(rest[:9].ljust(9, "0"))
                rows.append((ns, _tokens(fields[p_col], PROMPT_COLUMN), _tokens(fields[o_col], OUTPUT_COLUMN)))
            except ValueError as e:
                raise ValueError(f"{path}:{reader.line_num}: {e}") from None
    if not rows:
        raise ValueError(f"{path}: no rows after the header")
    rows.sort(key=lambda row: row[0])  # traces are in order; this keeps a shuffled one usable
    first_ns = rows[0][0]
    return tuple(TraceRow((ns - first_ns) / _NS_PER_S, prompt, output) for ns, prompt, output in rows)


def _nearest_rank(sorted_values: Sequence[int], fraction: float) -> int:
    return sorted_values[max(math.ceil(fraction * len(sorted_values)) - 1, 0)]


def trace_stats(rows: Sequence[TraceRow]) -> TraceStats:
    if not rows:
        raise ValueError("trace_stats needs at least one row")
    duration_s = rows[-1].arrival_s - rows[0].arrival_s
    prompts = sorted(row.prompt_tokens for row in rows)
    outputs = sorted(row.output_tokens for row in rows)
    return TraceStats(
        count=len(rows),
        duration_s=duration_s,
        mean_rate_per_s=(len(rows) - 1) / duration_s if duration_s > 0 else math.inf,
        prompt_p50_tokens=_nearest_rank(prompts, 0.50),
        prompt_p99_tokens=_nearest_rank(prompts, 0.99),
        output_p50_tokens=_nearest_rank(outputs, 0.50),
        output_p99_tokens=_nearest_rank(outputs, 0.99),
    )


def scale_to_rate(rows: Sequence[TraceRow], rate_per_s: float) -> float:
    """The `rate_scale` at which a replay of `rows` arrives at `rate_per_s`
    on average (the trace's 1/mean-gap times the scale)."""
    if not rate_per_s > 0.0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    trace_rate_per_s = trace_stats(rows).mean_rate_per_s
    if not math.isfinite(trace_rate_per_s):
        raise ValueError("a trace needs two rows at different times to have a rate")
    return rate_per_s / trace_rate_per_s


def trace_workload(rows: Sequence[TraceRow], *, rate_scale: float = 1.0, duration_s: float | None = None,
                   tenants: tuple[str, ...] = DEFAULT_TENANTS, service_class: str = "interactive",
                   batch_share: float = 0.0, seed: int = 0) -> list[SimRequest]:
    """The trace as simulator requests; `rows` in arrival order, as
    `read_trace` returns them.

    Arrival times are divided by `rate_scale` (2.0 replays twice as fast:
    every gap halves, the lengths stay), then cut at `duration_s` of
    replayed time (None: the whole trace; the replay never loops). Each row
    draws, in row order from one rng seeded by `seed`, a tenant uniformly
    from `tenants` and whether it is batch (probability `batch_share`,
    otherwise `service_class`). Row order means a row keeps its tenant and
    class whatever the scale or cut. Every request asks `max_tokens` equal
    to its traced output. A row that traced 0 tokens becomes 1 (a prompt of
    at least one token; an output of at least the first token).
    """
    if not rate_scale > 0.0 or math.isinf(rate_scale):
        raise ValueError(f"rate_scale must be a finite number > 0, got {rate_scale}")
    if duration_s is not None and not duration_s >= 0.0:
        raise ValueError(f"duration_s must be >= 0 or None, got {duration_s}")
    if not tenants:
        raise ValueError("needs at least one tenant")
    if service_class not in SERVICE_CLASSES:
        raise ValueError(f"service_class must be one of {SERVICE_CLASSES}, got {service_class!r}")
    if not 0.0 <= batch_share <= 1.0:
        raise ValueError(f"batch_share must be in [0, 1], got {batch_share}")
    tenants = tuple(tenants)
    rng = random.Random(f"{seed}:trace")
    end_s = math.inf if duration_s is None else duration_s
    requests = []
    for n, row in enumerate(rows):
        arrival_s = row.arrival_s / rate_scale
        if arrival_s >= end_s:
            break
        tenant = rng.choice(tenants)
        # Drawn whatever batch_share is, so tenants never depend on it, and a
        # larger share only adds batch rows (u < 0.1 implies u < 0.2).
        is_batch = rng.random() < batch_share
        requests.append(SimRequest(
            request_id=request_id(n), arrival_s=arrival_s, tenant=tenant,
            service_class="batch" if is_batch else service_class,
            prompt_tokens=max(row.prompt_tokens, 1), output_tokens=max(row.output_tokens, 1),
        ))
    return requests


def workload_requests(workload: str, rate: float, duration_s: float, seed: int,
                      burst_factor: float = 1.0) -> tuple[list[SimRequest], float]:
    """The requests `sluice sim` would replay, and the span they arrive over:
    `seed-mix` at `rate` per second, or a trace CSV sped up by `rate`."""
    if workload == "seed-mix":
        return seed_mix(rate, burst_factor).generate(duration_s, seed), duration_s
    path = Path(workload)
    if not path.exists():
        raise ValueError(f"the workload is seed-mix or a trace file; {path} does not exist")
    requests = trace_workload(read_trace(path), rate_scale=rate, duration_s=duration_s, seed=seed)
    # A trace shorter than the duration arrives over its own span.
    return requests, min(duration_s, requests[-1].arrival_s) if requests else duration_s
