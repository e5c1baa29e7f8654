"""Choose a replica for a request: filters, then weighted scorers, then a
picker (the shape of llm-d's endpoint picker).

    candidates ─▶ fits (KV and seat headroom for its class)
               ─▶ within load margin of the least loaded
               ─▶ score = Σ weight × scorer(candidate) ─▶ best (ties: id)

Scorers return 0..1: `prefix_score` (share of the prompt's full blocks the
replica already caches) and `headroom_score` (1 - load). Adding a signal is
a new scorer, not a branch. Headroom comes from the scheduler's own
reservations, never from free-GPU percentages.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """A replica as its last state report described it."""

    replica_id: str
    address: str
    model_version: str
    total_kv_blocks: int
    free_kv_blocks: int
    block_size_tokens: int
    num_running: int
    num_waiting: int
    ready: bool
    seen_at_s: float
    max_num_seqs: int = 0  # 0 = not reported: seats are not a limit
    step_time_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Candidate:
    view: ReplicaView
    headroom_kv_blocks: int  # what this request's class may still reserve here
    headroom_seats: int
    load: float              # 0..1: the larger of KV and seat utilisation
    matched_prefix_blocks: int
    prompt_blocks: int       # full prompt blocks the request sent hashes for
    last_granted_s: float = float("-inf")  # when this replica last got a request


Scorer = Callable[[Candidate], float]


def prefix_score(candidate: Candidate) -> float:
    if candidate.prompt_blocks == 0:
        return 0.0
    return candidate.matched_prefix_blocks / candidate.prompt_blocks


def headroom_score(candidate: Candidate) -> float:
    return 1.0 - min(max(candidate.load, 0.0), 1.0)


# Prefix first: a hit saves the prefill outright; headroom breaks ties and
# spreads requests without a shared prefix.
DEFAULT_SCORERS: tuple[tuple[Scorer, float], ...] = ((prefix_score, 1.0), (headroom_score, 0.1))


def fits(candidates: Sequence[Candidate], kv_blocks: int) -> list[Candidate]:
    return [c for c in candidates if c.headroom_kv_blocks >= kv_blocks and c.headroom_seats >= 1]


def within_load_margin(candidates: Sequence[Candidate], margin: float) -> list[Candidate]:
    """Drop replicas much busier than the least busy: a cached prefix is not
    worth queueing behind an overloaded replica."""
    if not candidates:
        return []
    least = min(c.load for c in candidates)
    return [c for c in candidates if c.load <= least + margin]


def pick(
    candidates: Sequence[Candidate],
    kv_blocks: int,
    load_margin: float,
    scorers: Sequence[tuple[Scorer, float]] = DEFAULT_SCORERS,
) -> Candidate | None:
    remaining = within_load_margin(fits(candidates, kv_blocks), load_margin)
    if not remaining:
        return None
    return max(
        remaining,
        # Ties (idle replicas, no cached prefix) go to the replica that got
        # a request longest ago, so light traffic spreads instead of piling
        # onto one replica.
        key=lambda c: (sum(weight * scorer(c) for scorer, weight in scorers), -c.load, -c.last_granted_s,
                       c.view.replica_id),
    )
