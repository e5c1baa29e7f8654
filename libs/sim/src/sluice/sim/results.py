"""What a simulation measured, and the summary `sluice sim --json` writes.

Per request: its outcome (finished, or refused with a reason, at enqueue
or from the queue), queue time, TTFT, every inter-token gap (kept as the
request's mean and max, and pooled per class for the percentiles), end to
end time. Per replica: KV occupancy and batch composition sampled over
time. A request meets its SLO (goodput) when its TTFT and its mean
inter-token time (TPOT) are both within its class's targets (and, where
the class bounds it, no gap between two of its tokens is longer).
"""

import math
from array import array
from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestRecord:
    """One request's timeline; only the simulation writes it."""

    request_id: str
    tenant: str
    service_class: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    outcome: str = "pending"  # finished | refused
    reason: str = ""          # with refused: the outcome vocabulary's reason
    dispatched_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finished_s: float | None = None
    tokens: int = 0
    max_gap_s: float = 0.0
    replica: str = ""

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def queue_s(self) -> float | None:
        return None if self.dispatched_s is None else self.dispatched_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        if self.tokens < 2 or self.first_token_s is None or self.last_token_s is None:
            return None
        return (self.last_token_s - self.first_token_s) / (self.tokens - 1)


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    at_s: float
    replica: str
    kv_occupancy: float
    running: int
    waiting: int


@dataclass(slots=True)
class SimResults:
    records: list[RequestRecord]
    duration_s: float                     # virtual time simulated (last event)
    gaps_by_class: dict[str, array] = field(default_factory=dict)  # every inter-token gap, seconds
    samples: list[ReplicaSample] = field(default_factory=list)
    decode_tokens: int = 0
    prefill_tokens: int = 0
    steps: int = 0
    busy_s: float = 0.0                   # summed over replicas
    num_replicas: int = 1
    stage_changes: list[tuple[float, str, str]] = field(default_factory=list)  # (at_s, from, to)
    wall_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float
    tpot_s: float
    # Added to the TTFT target per 1,000 prompt tokens: a long prompt's own prefill.
    ttft_per_1k_prompt_tokens_s: float = 0.0
    max_itl_s: float = 0.0  # the longest gap between two tokens; 0 = no bound

    def ttft_target_s(self, prompt_tokens: int) -> float:
        return self.ttft_s + self.ttft_per_1k_prompt_tokens_s * prompt_tokens / 1000

    def met_by(self, record: RequestRecord) -> bool:
        ttft, tpot = record.ttft_s, record.tpot_s
        return (
            record.outcome == "finished" and ttft is not None and ttft <= self.ttft_target_s(record.prompt_tokens)
            and (tpot is None or tpot <= self.tpot_s)
            and (not self.max_itl_s or record.max_gap_s <= self.max_itl_s)
        )


def class_slos(ttft_s: float, tpot_s: float, batch_ttft_s: float, *, ttft_per_1k_prompt_tokens_s: float = 0.0,
               max_itl_s: float = 0.0) -> dict[str, Slo]:
    """Goodput targets by class: batch is judged by its TTFT alone."""
    interactive = Slo(ttft_s, tpot_s, ttft_per_1k_prompt_tokens_s, max_itl_s)
    return {"interactive": interactive, "batch": Slo(batch_ttft_s, 1e9)}


def percentiles(values, points=(50, 90, 99)) -> dict[str, float | None]:
    ordered = sorted(values)
    if not ordered:
        return {f"p{p}": None for p in points}
    out = {}
    for p in points:
        rank = (len(ordered) - 1) * p / 100
        low, high = math.floor(rank), math.ceil(rank)
        out[f"p{p}"] = ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
    return out


def summarize(results: SimResults, slos: dict[str, Slo], cost_per_hour: float = 0.0) -> dict:
    """The JSON document: overall and per class, `ttft_s`, `itl_s`, `e2e_s`
    ({p50, p90, p99}), `goodput_rps`, `output_tokens_per_s`, `rejections`
    by reason; and the fleet's KV occupancy and cost per million tokens at
    `cost_per_hour` for the whole fleet."""
    duration_s = max(results.duration_s, 1e-9)
    by_class: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in results.records:
        by_class[record.service_class].append(record)

    def block(records: list[RequestRecord], gaps) -> dict:
        finished = [r for r in records if r.outcome == "finished"]
        refused = Counter(r.reason for r in records if r.outcome == "refused")
        met = sum(1 for r in records if slos[r.service_class].met_by(r))
        output_tokens = sum(r.tokens for r in finished)
        return {
            "requests": len(records),
            "finished": len(finished),
            "ttft_s": percentiles([r.ttft_s for r in finished if r.ttft_s is not None]),
            "itl_s": percentiles(gaps),
            "e2e_s": percentiles([r.e2e_s for r in finished if r.e2e_s is not None]),
            "queue_s": percentiles([r.queue_s for r in records if r.queue_s is not None]),
            "goodput_rps": met / duration_s,
            "slo_met_share": met / len(records) if records else None,
            "output_tokens_per_s": output_tokens / duration_s,
            "rejections": dict(sorted(refused.items())),
        }

    all_gaps = array("d")
    for gaps in results.gaps_by_class.values():
        all_gaps.extend(gaps)
    document = {
        "duration_s": results.duration_s,
        "overall": block(results.records, all_gaps),
        "by_class": {
            name: block(records, results.gaps_by_class.get(name, array("d")))
            for name, records in sorted(by_class.items())
        },
    }
    occupancy = [s.kv_occupancy for s in results.samples]
    document["kv_occupancy"] = {**percentiles(occupancy), "mean": sum(occupancy) / len(occupancy) if occupancy else None}
    total_tokens = sum(r.tokens + r.prompt_tokens for r in results.records if r.outcome == "finished")
    output_tokens = sum(r.tokens for r in results.records if r.outcome == "finished")
    fleet_cost = cost_per_hour * duration_s / 3600
    document["cost"] = {
        "fleet_per_hour": cost_per_hour,
        "per_million_output_tokens": fleet_cost / (output_tokens / 1e6) if output_tokens else None,
        "per_million_tokens": fleet_cost / (total_tokens / 1e6) if total_tokens else None,
    }
    document["batch_composition"] = {
        "steps": results.steps,
        "decode_tokens": results.decode_tokens,
        "prefill_tokens": results.prefill_tokens,
        "busy_share": results.busy_s / (duration_s * results.num_replicas),
    }
    document["overload_stage_changes"] = len(results.stage_changes)
    document["wall_s"] = results.wall_s
    return document
